package webhook

import (
	"net/http"
	"time"
)

// Verifier is a deployment's webhook settings: the scheme the processor
// signs with, its secrets (two during a rotation) and the tolerance of a
// signature's age. The processor adapter that receives the delivery knows
// which header carries a t=,v1= signature (Header for the simulator,
// Stripe-Signature for Stripe) and passes it to Verify.
type Verifier struct {
	Scheme    Scheme
	Secrets   []string
	Tolerance time.Duration
}

// Verify checks a delivery's raw payload and headers, at now: under
// SchemeStandard the three Standard Webhooks headers, otherwise the t=,v1=
// signature in the header named signatureHeader. A zero Tolerance is
// DefaultTolerance. The errors are Verify's (and ErrSecret's).
func (v Verifier) Verify(payload []byte, h http.Header, signatureHeader string, now time.Time) error {
	tolerance := v.Tolerance
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if v.Scheme == SchemeStandard {
		return VerifyStandard(payload, h, v.Secrets, now, tolerance)
	}
	return Verify(payload, h.Get(signatureHeader), v.Secrets, now, tolerance)
}
