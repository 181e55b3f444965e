// Package processorcontract is the contract every processor.Processor
// adapter passes (requirement S7): one suite, run against the simulator's
// client (on the real simulator) and against the Stripe adapter (on
// Stripe's recorded answers, internal/tooling/stripefake). A third adapter
// passes it too before the payment machine may use it: see
// docs/payments.md, "A processor adapter".
//
// What it holds an adapter to: a charge and a refund are final answers
// that their lookups find under the key they were made with (within the
// adapter's LookupLag); the same key makes no second charge or refund; a
// decline is final and leaves a failed charge a lookup finds; a rate limit
// is "not executed", a 5xx and a same-key call in flight are "outcome
// unknown" (S6); a refused secret key is "not executed" and ours to fix
// (processor.ErrMisconfigured, S8); a signed webhook of a succeeded charge reads as
// charge.succeeded naming the charge and its key, and a tampered one is
// refused.
package processorcontract

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/webhook"
)

// Fault is an answer the harness makes the processor give to the next
// charge call instead of its own.
type Fault int

// Faults.
const (
	// FaultRateLimited: a 429; nothing executed.
	FaultRateLimited Fault = iota + 1
	// FaultServerError: a 500.
	FaultServerError
	// FaultKeyInUse: another call with the same key is still running.
	FaultKeyInUse
	// FaultUnauthorized: a 401, the processor refusing our secret key
	// (S8); nothing executed, and the request is not its cause.
	FaultUnauthorized
)

// Harness is one adapter and what the suite needs to drive it.
type Harness struct {
	Processor processor.Processor
	// Approved and Declined are payment methods the processor charges and
	// declines.
	Approved, Declined string
	// Fail makes the next charge call under key (with req) answer f.
	Fail func(t *testing.T, f Fault, req processor.ChargeRequest, key string)
	// Deliver returns a delivery of "ch succeeded", in the processor's
	// own event shape, signed as the processor signs with Verifier's
	// secrets.
	Deliver  func(t *testing.T, ch processor.Charge) (payload []byte, h http.Header)
	Verifier webhook.Verifier
}

// Run runs the contract against h.
func Run(t *testing.T, h Harness) {
	c := contract{h}
	t.Run("AChargeIsFinalAndItsKeyFindsIt", c.chargeIsFinal)
	t.Run("TheSameKeyMakesNoSecondCharge", c.sameKeyChargesOnce)
	t.Run("AnUnusedKeyFindsNothing", c.unusedKeyFindsNothing)
	t.Run("ADeclineIsFinalAndLeavesAFailedCharge", c.declineIsFinal)
	t.Run("ARefundIsFinalListedWithItsKeyAndNotRepeated", c.refundIsFinal)
	c.faults(t)
	t.Run("ASignedWebhookOfASucceededChargeReads", c.signedWebhookReads)
}

// contract is the harness the cases run against.
type contract struct{ Harness }

// newKey is an idempotency key no case used before.
func newKey() string { return "contract-" + uuid.NewString() }

// request asks for a charge of 1500 EUR by payment method pm.
func request(pm string) processor.ChargeRequest {
	return processor.ChargeRequest{Amount: 1500, Currency: "EUR", PaymentMethod: pm, Metadata: map[string]string{"payment_id": uuid.NewString()}}
}

// chargeIsFinal checks that a charge succeeds, and the lookup of its key
// finds it.
func (c contract) chargeIsFinal(t *testing.T) {
	p := c.Processor
	key := newKey()
	ch, err := p.CreateCharge(t.Context(), request(c.Approved), key)
	if err != nil {
		t.Fatalf("CreateCharge: %v (class %s)", err, processor.ClassOf(err))
	}
	if ch.ID == "" || ch.Status != processor.StatusSucceeded || ch.Amount != 1500 {
		t.Fatalf("charge = %+v, want an id, succeeded, 1500", ch)
	}
	found := lookUp(t, p, key, 1)
	if found[0].ID != ch.ID || found[0].Status != processor.StatusSucceeded || found[0].IdempotencyKey != key || found[0].Amount != 1500 {
		t.Errorf("lookup = %+v, want charge %s succeeded under %s", found[0], ch.ID, key)
	}
}

// sameKeyChargesOnce checks that a resend under the same key returns the
// first charge.
func (c contract) sameKeyChargesOnce(t *testing.T) {
	p := c.Processor
	key := newKey()
	req := request(c.Approved)
	first, err := p.CreateCharge(t.Context(), req, key)
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.CreateCharge(t.Context(), req, key)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != first.ID {
		t.Errorf("resend made charge %s beside %s", again.ID, first.ID)
	}
	lookUp(t, p, key, 1)
}

// unusedKeyFindsNothing checks that the lookup of a key never sent finds
// no charge.
func (c contract) unusedKeyFindsNothing(t *testing.T) {
	p := c.Processor
	got, err := p.ChargesByIdempotencyKey(t.Context(), newKey())
	if err != nil || len(got) != 0 {
		t.Errorf("lookup of an unused key = %v, %v; want nothing, nil", got, err)
	}
}

// declineIsFinal checks that a decline is a final error, and its failed
// charge is found under its key.
func (c contract) declineIsFinal(t *testing.T) {
	p := c.Processor
	key := newKey()
	_, err := p.CreateCharge(t.Context(), request(c.Declined), key)
	var declined *processor.DeclineError
	if !errors.As(err, &declined) || processor.ClassOf(err) != processor.ClassFinal {
		t.Fatalf("CreateCharge = %v, want a final *DeclineError", err)
	}
	if declined.ChargeID == "" || declined.DeclineCode == "" {
		t.Errorf("decline = %+v, want the failed charge's id and a decline code", declined)
	}
	found := lookUp(t, p, key, 1)
	if found[0].ID != declined.ChargeID || found[0].Status != processor.StatusFailed || found[0].DeclineCode == "" {
		t.Errorf("lookup = %+v, want failed charge %s with its decline code", found[0], declined.ChargeID)
	}
}

// refundIsFinal checks that a refund succeeds once under its key, is
// listed with it, and cannot exceed what is left.
func (c contract) refundIsFinal(t *testing.T) {
	p := c.Processor
	ch, err := p.CreateCharge(t.Context(), request(c.Approved), newKey())
	if err != nil {
		t.Fatal(err)
	}
	key := newKey()
	re, err := p.Refund(t.Context(), processor.RefundRequest{Charge: ch.ID, Amount: 400}, key)
	if err != nil {
		t.Fatalf("Refund: %v", err)
	}
	if re.ID == "" || re.Charge != ch.ID || re.Amount != 400 || re.Status != processor.StatusSucceeded {
		t.Fatalf("refund = %+v, want 400 of %s, succeeded", re, ch.ID)
	}
	again, err := p.Refund(t.Context(), processor.RefundRequest{Charge: ch.ID, Amount: 400}, key)
	if err != nil || again.ID != re.ID {
		t.Fatalf("resend = %+v, %v; want refund %s again", again, err, re.ID)
	}
	list, err := p.RefundsByCharge(t.Context(), ch.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != re.ID || list[0].IdempotencyKey != key || list[0].Amount != 400 {
		t.Errorf("RefundsByCharge = %+v, want refund %s under %s only", list, re.ID, key)
	}
	_, err = p.Refund(t.Context(), processor.RefundRequest{Charge: ch.ID, Amount: 5000}, newKey())
	var rejected *processor.RequestError
	if !errors.As(err, &rejected) {
		t.Errorf("refund above what is left = %v, want a final *RequestError", err)
	}
}

// faults checks that each fault of the charge call has its class; one not
// executed leaves nothing to find.
func (c contract) faults(t *testing.T) {
	p := c.Processor
	for _, tt := range []struct {
		name  string
		fault Fault
		want  processor.Class
	}{
		{"ARateLimitIsNotExecuted", FaultRateLimited, processor.ClassNotExecuted},
		{"AServerErrorIsAnUnknownOutcome", FaultServerError, processor.ClassOutcomeUnknown},
		{"ASameKeyCallInFlightIsAnUnknownOutcome", FaultKeyInUse, processor.ClassOutcomeUnknown},
		{"ARefusedSecretKeyIsNotExecuted", FaultUnauthorized, processor.ClassNotExecuted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key, req := newKey(), request(c.Approved)
			c.Fail(t, tt.fault, req, key)
			_, err := p.CreateCharge(t.Context(), req, key)
			if got := processor.ClassOf(err); got != tt.want {
				t.Errorf("class of %v = %s, want %s", err, got, tt.want)
			}
			if tt.fault == FaultUnauthorized && !errors.Is(err, processor.ErrMisconfigured) {
				t.Errorf("%v does not match processor.ErrMisconfigured: a refused key is ours to fix, never the request's outcome", err)
			}
			if tt.want == processor.ClassNotExecuted {
				// Not executed means not executed: nothing to find.
				time.Sleep(p.LookupLag())
				if got, err := p.ChargesByIdempotencyKey(t.Context(), key); err != nil || len(got) != 0 {
					t.Errorf("after a call not executed the lookup = %v, %v; want nothing", got, err)
				}
			}
		})
	}
}

// signedWebhookReads checks that a signed delivery of a succeeded charge
// verifies and reads; a tampered or unsigned one does not.
func (c contract) signedWebhookReads(t *testing.T) {
	p := c.Processor
	key := newKey()
	ch, err := p.CreateCharge(t.Context(), request(c.Approved), key)
	if err != nil {
		t.Fatal(err)
	}
	payload, hdr := c.Deliver(t, ch)
	ev, err := p.VerifyWebhook(payload, hdr, c.Verifier)
	if err != nil {
		t.Fatalf("VerifyWebhook: %v", err)
	}
	if ev.ID == "" || ev.Type != processor.EventChargeSucceeded || ev.Data.Object.ID != ch.ID ||
		ev.Data.Object.IdempotencyKey != key || ev.Data.Object.Status != processor.StatusSucceeded {
		t.Errorf("event = %+v, want charge.succeeded of %s under %s", ev, ch.ID, key)
	}
	tampered := slices.Clone(payload)
	tampered[len(tampered)-2] ^= 1
	if _, err := p.VerifyWebhook(tampered, hdr, c.Verifier); err == nil || errors.Is(err, processor.ErrBadEvent) {
		t.Errorf("a tampered delivery: %v, want a signature error", err)
	}
	if _, err := p.VerifyWebhook(payload, http.Header{}, c.Verifier); err == nil {
		t.Error("an unsigned delivery was accepted")
	}
}

// lookUp polls the lookup of key until it shows want charges, for as long
// as the adapter says its lookups may lag (and a little more); then it
// fails.
func lookUp(t *testing.T, p processor.Processor, key string, want int) []processor.Charge {
	t.Helper()
	deadline := time.Now().Add(p.LookupLag() + 2*time.Second)
	for {
		got, err := p.ChargesByIdempotencyKey(context.WithoutCancel(t.Context()), key)
		if err != nil {
			t.Fatalf("ChargesByIdempotencyKey: %v", err)
		}
		if len(got) == want {
			return got
		}
		if len(got) > want || time.Now().After(deadline) {
			t.Fatalf("lookup of %s found %d charges, want %d: %+v", key, len(got), want, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
