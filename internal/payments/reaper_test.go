package payments_test

import (
	"testing"

	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// E1, S1: a payment at charge_sent keeps its key and recovery point through
// a reaper pass, however far past both horizons it is (as with a TTL of a
// second), and the completer still finishes it with one charge.
func TestReaperLeavesAPaymentInFlightAlone(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	bound := deadline(t)
	p := w.newPayment(t, "pay-reaped", 2500)
	w.abandon(t, bound, p, processorsim.FaultServerError)
	if _, err := w.pool.Exec(bound, `UPDATE idempotency_keys
		SET created_at = now() - interval '1 hour', expires_at = now() - interval '1 hour' + interval '1 second',
		    retain_until = now() - interval '1 hour' + interval '1 second'
		WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`, p.claim.TenantID, p.claim.Endpoint, p.claim.Key); err != nil {
		t.Fatal(err)
	}
	before := w.snapshot(t, p.claim)

	res, err := reaper.New(w.pool, reaper.Config{}).RunOnce(bound)
	if err != nil {
		t.Fatal(err)
	}
	if res.Pruned != 0 || res.Deleted != 0 {
		t.Errorf("reaper pass = %+v, want nothing pruned or deleted", res)
	}
	if after := w.snapshot(t, p.claim); after != before {
		t.Errorf("the reaper changed the in-flight key:\nbefore %s\nafter  %s", before, after)
	}
	w.wantPaymentStatus(t, p, payments.StatusChargeSent)

	w.passSettleWindow(t, p)
	if got := payments.NewCompleter(w.svc, shortLease).RunOnce(bound); got != 1 {
		t.Fatalf("the completer finished %d payments, want 1", got)
	}
	w.wantPaid(t, p)
	if got := len(w.chargesWithKey(p.chargeKey())); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}
