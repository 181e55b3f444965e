package processor

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemref/payments/internal/webhook"
)

// Processor is what the payment machine needs of a payment processor.
// Two adapters implement it, each a package beside this
// one that imports neither the other: internal/processor/simproc (the
// simulator's HTTP API) and internal/processor/stripeproc (Stripe, through
// stripe-go). A third one must pass the shared contract suite,
// internal/tooling/processorcontract, as both do.
//
// Every method classifies its answer once, in the adapter: nil,
// *DeclineError and *RequestError are final; anything else is an
// *UnsettledError of ClassNotExecuted or ClassOutcomeUnknown (ClassOf). An
// adapter never retries: retries and the decision to look up instead
// belong to the payment machine.
type Processor interface {
	// CreateCharge charges req under idempotencyKey, the same on every
	// retry of one logical charge (S2). The key is also recorded on the
	// charge, so ChargesByIdempotencyKey finds it.
	CreateCharge(ctx context.Context, req ChargeRequest, idempotencyKey string) (Charge, error)
	// Refund refunds req under idempotencyKey; the rules are CreateCharge's.
	Refund(ctx context.Context, req RefundRequest, idempotencyKey string) (Refund, error)
	// ChargesByIdempotencyKey lists every charge made under key, oldest
	// first, every page. A charge whose outcome the processor has not
	// decided yet is an *UnsettledError, never a charge: the lookup
	// settles nothing then. An empty answer means "none yet": a charge
	// may take up to LookupLag to appear.
	ChargesByIdempotencyKey(ctx context.Context, key string) ([]Charge, error)
	// RefundsByCharge lists the refunds of one charge, oldest first, every
	// page, each with the idempotency key it was made under.
	RefundsByCharge(ctx context.Context, chargeID string) ([]Refund, error)
	// LookupLag is how long after a call executed its lookups may still
	// not show it: 0 for a processor whose lookups read what it wrote,
	// Stripe's Search API's documented lag for Stripe. The payment
	// machine adds it to the settle window: an empty lookup means "no
	// charge" only once both have passed.
	LookupLag() time.Duration
	// VerifyWebhook checks one delivery's signature over the raw payload
	// with v (M4), before anything is parsed, and maps its event onto
	// Event. A delivery that is signed but is no event it can read is an
	// error matching ErrBadEvent; any other error is the signature's.
	VerifyWebhook(payload []byte, h http.Header, v webhook.Verifier) (Event, error)
}

// ErrBadEvent: a verified webhook delivery whose body is no event.
var ErrBadEvent = errors.New("processor: the webhook body is not an event")

// DefaultWebhookRetrySpan is how long a processor keeps retrying a
// webhook it could not deliver, from the first attempt to the last: the
// processor's own schedule, not ours (Stripe retries for up to 3 days;
// the simulator for under 2 hours, processorsim.WebhookRetrySpan). A
// webhook's inbox id must be kept longer than this, or a late retry is
// applied again (M3).
const DefaultWebhookRetrySpan = 3 * 24 * time.Hour

// DefaultTimeout bounds one call of an adapter given no timeout. It is
// the longest a payment step waits before treating the outcome as unknown.
const DefaultTimeout = 10 * time.Second

// CountCall counts one call of an adapter by operation (for example
// "POST /v1/payment_intents") and the class of its answer, in
// processor_calls_total, and a refusal of our configuration also in
// processor_misconfigured_calls_total.
func CountCall(op string, err error) {
	callsTotal.WithLabelValues(op, ClassOf(err).String()).Inc()
	if errors.Is(err, ErrMisconfigured) {
		misconfiguredTotal.WithLabelValues(op).Inc()
	}
}

// InitCallMetrics starts the series of an adapter's operations at zero.
func InitCallMetrics(ops ...string) {
	for _, op := range ops {
		misconfiguredTotal.WithLabelValues(op)
		for _, class := range []Class{ClassFinal, ClassNotExecuted, ClassOutcomeUnknown} {
			callsTotal.WithLabelValues(op, class.String())
		}
	}
}
