package payments_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// Guarded transitions. The state machines' allowed moves are one table in
// the database (state_transitions, migration 000012), repeated in
// docs/payments.md; a trigger refuses every other change of status.

// transition is one move of one machine.
type transition struct{ Machine, From, To string }

func (tr transition) String() string { return tr.Machine + " " + tr.From + " -> " + tr.To }

// machineStates are every state of each machine, as the CHECK constraints
// allow them.
var machineStates = map[string][]string{
	"payment":      {"charge_sent", "succeeded", "declined", "failed"},
	"refund":       {"created", "refund_sent", "succeeded", "failed"},
	"compensation": {"pending", "succeeded", "refused"},
	"key":          {"in_progress", "completed", "expired"},
}

func allowedTransitions(t *testing.T, pool *pgxpool.Pool) []transition {
	t.Helper()
	return testkit.Rows[transition](t, pool, `SELECT machine, from_state, to_state FROM state_transitions ORDER BY 1, 2, 3`)
}

// The docs show the table the database enforces, row for row.
func TestTransitionTableMatchesTheDocs(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	f, err := os.Open("../../docs/payments.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The table's rows: | `machine` | `from` | `to` | written by |
	var documented []transition
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "<!-- transitions -->"):
			in = true
		case strings.HasPrefix(line, "<!-- /transitions -->"):
			in = false
		case in && strings.HasPrefix(line, "| `"):
			cells := strings.Split(line, "|")
			unquote := func(s string) string { return strings.Trim(strings.TrimSpace(s), "`") }
			documented = append(documented, transition{unquote(cells[1]), unquote(cells[2]), unquote(cells[3])})
		}
	}
	slices.SortFunc(documented, func(a, b transition) int { return strings.Compare(a.String(), b.String()) })
	want := allowedTransitions(t, w.pool)
	slices.SortFunc(want, func(a, b transition) int { return strings.Compare(a.String(), b.String()) })
	if diff := cmp.Diff(want, documented); diff != "" {
		t.Errorf("docs/payments.md's transition table differs from state_transitions (-database +docs):\n%s", diff)
	}
}

// Every change of status the table does not allow is refused by the
// database, whoever writes it; every one it allows goes through.
func TestEveryForbiddenTransitionIsRefused(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	ctx := context.Background()
	allowed := allowedTransitions(t, w.pool)
	p := w.newPayment(t, "pay-transitions", 1000)
	for machine, states := range machineStates {
		for _, from := range states {
			for _, to := range states {
				if from == to {
					continue
				}
				tr := transition{machine, from, to}
				err := tryTransition(ctx, w, p, tr)
				var pgErr *pgconn.PgError
				refused := errors.As(err, &pgErr) && pgErr.ConstraintName == "state_transition"
				switch {
				case slices.Contains(allowed, tr) && err != nil:
					t.Errorf("%s is allowed, but the database refused it: %v", tr, err)
				case !slices.Contains(allowed, tr) && !refused:
					t.Errorf("%s is not allowed, but the database answered %v", tr, err)
				}
			}
		}
	}
	// A key is claimed again only past its retention, never before.
	err := tryTransition(ctx, w, p, transition{"key-within-retention", "completed", "in_progress"})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.ConstraintName != "state_transition" {
		t.Errorf("a completed key within its retention was claimed again: %v", err)
	}
}

// tryTransition puts one row of tr's machine in state tr.From and updates
// it to tr.To, in a transaction it rolls back.
func tryTransition(ctx context.Context, w *bundle, p payment, tr transition) error {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	id := uuid.New()
	exec := func(sql string, args ...any) error {
		_, err := tx.Exec(ctx, sql, args...)
		return err
	}
	switch tr.Machine {
	case "payment":
		return errors.Join(
			exec(`INSERT INTO payments (tenant_id, id, order_id, amount, currency, payment_method, charge_key, status, charge_id)
				VALUES ($1, $2, $3, 1000, 'EUR', 'pm_card_visa', $4, $5, 'ch_1')`, w.tenant, id, p.order.ID, id.String(), tr.From),
			exec(`UPDATE payments SET status = $3 WHERE tenant_id = $1 AND id = $2`, w.tenant, id, tr.To))
	case "refund", "compensation":
		if err := exec(`INSERT INTO payments (tenant_id, id, order_id, amount, currency, payment_method, charge_key, status, charge_id)
			VALUES ($1, $2, $3, 1000, 'EUR', 'pm_card_visa', $4, 'succeeded', 'ch_1')`, w.tenant, id, p.order.ID, id.String()); err != nil {
			return err
		}
		if tr.Machine == "refund" {
			return errors.Join(
				exec(`INSERT INTO refunds (tenant_id, id, payment_id, amount, refund_key, status) VALUES ($1, $2, $2, 100, $3, $4)`, w.tenant, id, id.String(), tr.From),
				exec(`UPDATE refunds SET status = $3 WHERE tenant_id = $1 AND id = $2`, w.tenant, id, tr.To))
		}
		return errors.Join(
			exec(`INSERT INTO payment_compensations (tenant_id, payment_id, charge_id, amount, reason, refund_key, status)
				VALUES ($1, $2, 'ch_2', 1000, 'duplicate_charge', 'k', $3)`, w.tenant, id, tr.From),
			exec(`UPDATE payment_compensations SET status = $3 WHERE tenant_id = $1 AND payment_id = $2`, w.tenant, id, tr.To))
	default: // key: past its retention, except for key-within-retention
		retained := "now() - interval '1 second'"
		if tr.Machine == "key-within-retention" {
			retained = "now() + interval '1 hour'"
		}
		body := map[string]string{"in_progress": "NULL", "completed": "'{}'::bytea", "expired": "NULL"}
		headers := map[string]string{"in_progress": "NULL", "completed": "'{}'::jsonb", "expired": "NULL"}
		status := map[string]string{"in_progress": "NULL", "completed": "201", "expired": "201"}
		done := map[string]string{"in_progress": "NULL", "completed": "now()", "expired": "now()"}
		return errors.Join(
			exec(fmt.Sprintf(`INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until,
					state, response_body, response_headers, response_status, completed_at)
				VALUES ($1, 'POST /v1/orders', $2, sha256('x'), 1, now() - interval '2 seconds', %s, $3, %s, %s, %s, %s)`,
				retained, body[tr.From], headers[tr.From], status[tr.From], done[tr.From]), w.tenant, id.String(), tr.From),
			exec(fmt.Sprintf(`UPDATE idempotency_keys SET state = $3, response_body = %s, response_headers = %s, response_status = %s, completed_at = %s
				WHERE tenant_id = $1 AND idem_key = $2`, body[tr.To], headers[tr.To], status[tr.To], done[tr.To]), w.tenant, id.String(), tr.To))
	}
}

// Every transition the table allows is made by the code somewhere: each
// flow below is the service's own, and an audit trigger (installed by this
// test only) logs what they did. A transition no code makes would be a
// hole in the table, or dead code.
func TestEveryAllowedTransitionHappens(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	bound := deadline(t)
	logTransitions(t, w.pool)

	// payment charge_sent -> succeeded; key in_progress -> completed
	paid := w.newPayment(t, "pay-ok", 1000)
	if res, _, err := w.svc.Pay(bound, paid.claim, paid.in); err != nil || res.Status != http.StatusCreated {
		t.Fatalf("Pay = %d %s, %v", res.Status, res.Body, err)
	}
	// payment charge_sent -> declined; charge_sent -> failed (the processor
	// rejects an unknown payment method)
	for key, method := range map[string]string{"pay-declined": processorsim.PaymentMethodDeclined, "pay-rejected": "pm_unknown"} {
		p := w.newPayment(t, key, 1000)
		p.in.PaymentMethod = method
		fp, err := idem.Fingerprint(payments.EndpointPay, nil, p.in)
		if err != nil {
			t.Fatal(err)
		}
		p.claim.Fingerprint = fp
		if _, _, err := w.svc.Pay(bound, p.claim, p.in); err != nil {
			t.Fatalf("Pay %s: %v", key, err)
		}
	}
	// refund created -> refund_sent -> succeeded, and -> failed
	pay := w.onePayment(t, paid)
	refund := func(key string, amount int64) {
		c := refundClaim(t, w, key, pay.ID, amount)
		if _, _, err := w.svc.Refund(bound, c, pay.ID, amount); err != nil {
			t.Fatalf("Refund %s: %v", key, err)
		}
	}
	refund("refund-ok", 100)
	w.gate.interceptOnce(refuseRefund)
	refund("refund-refused", 100)

	// compensation pending -> refused -> succeeded
	extra := w.sim.CreateChargeDirect(processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: processorsim.PaymentMethodVisa}, paid.chargeKey())
	w.deliverChargeSucceeded(t, extra)
	w.gate.interceptOnce(refuseRefund)
	if _, err := w.svc.Sweep(bound, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(bound, `UPDATE payments SET sweep_at = now() WHERE tenant_id = $1 AND id = $2`, w.tenant, pay.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.svc.Sweep(bound, 10); err != nil {
		t.Fatal(err)
	}
	// compensation pending -> succeeded
	declinedExtra := w.sim.CreateChargeDirect(processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: processorsim.PaymentMethodVisa}, paid.chargeKey())
	w.deliverChargeSucceeded(t, declinedExtra)
	if _, err := w.svc.Sweep(bound, 10); err != nil {
		t.Fatal(err)
	}

	// key completed -> expired (the reaper's prune), and both back to
	// in_progress: the same keys claimed again past their retention.
	if _, err := w.pool.Exec(bound, `UPDATE idempotency_keys
		SET created_at = now() - interval '100 hours', expires_at = now() - interval '1 second', retain_until = now() + interval '1 hour'
		WHERE tenant_id = $1 AND idem_key = 'pay-ok'`, w.tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := reaper.New(w.pool, reaper.Config{}).RunOnce(bound); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(bound, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second', retain_until = now() - interval '1 second'
		WHERE tenant_id = $1 AND idem_key IN ('pay-ok', 'pay-declined')`, w.tenant); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"pay-ok", "pay-declined"} {
		var in payments.PayInput
		c := w.paymentByKey(t, key, &in)
		if _, _, err := w.svc.Pay(bound, c, in); err != nil {
			t.Fatalf("Pay %s again: %v", key, err)
		}
	}

	seen := map[transition]bool{}
	logged := testkit.Rows[transition](t, w.pool, `SELECT machine, from_state, to_state FROM transition_log`)
	for _, tr := range logged {
		seen[tr] = true
	}
	for _, tr := range allowedTransitions(t, w.pool) {
		if !seen[tr] {
			t.Errorf("no code made the allowed transition %s", tr)
		}
	}
}

// refuseRefund answers a refund call with a final error, without executing
// it, as a processor refusing it does.
func refuseRefund(rw http.ResponseWriter, r *http.Request, _ http.Handler) bool {
	if r.Method != http.MethodPost || r.URL.Path != processorsim.PathRefunds {
		return false
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(http.StatusBadRequest)
	_, _ = rw.Write([]byte(`{"error":{"type":"invalid_request_error","code":"charge_disputed","message":"The charge is disputed."}}`))
	return true
}

// refundClaim is the claim of a refund request under key.
func refundClaim(t *testing.T, w *bundle, key string, paymentID uuid.UUID, amount int64) idem.Claim {
	t.Helper()
	fp, err := idem.Fingerprint(payments.EndpointRefund, map[string]string{"id": paymentID.String()}, struct {
		Amount int64 `json:"amount"`
	}{amount})
	if err != nil {
		t.Fatal(err)
	}
	return idem.Claim{TenantID: w.tenant, Endpoint: payments.EndpointRefund, Key: key, Fingerprint: fp}
}

// paymentByKey rebuilds the claim and request of the payment made under
// key, from its payment row.
func (w *bundle) paymentByKey(t *testing.T, key string, in *payments.PayInput) idem.Claim {
	t.Helper()
	c := idem.Claim{TenantID: w.tenant, Endpoint: payments.EndpointPay, Key: key}
	err := w.pool.QueryRow(context.Background(), `SELECT order_id, amount, currency, payment_method FROM payments
		WHERE tenant_id = $1 AND charge_key = $2`, w.tenant, idem.DeriveKey(c, "charge")).Scan(&in.OrderID, &in.Amount, &in.Currency, &in.PaymentMethod)
	if err != nil {
		t.Fatal(err)
	}
	if c.Fingerprint, err = idem.Fingerprint(payments.EndpointPay, nil, *in); err != nil {
		t.Fatal(err)
	}
	return c
}

// logTransitions installs, in this test's database only, an audit trigger
// that logs every change of status of the four machines to
// transition_log.
func logTransitions(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE transition_log (machine text, from_state text, to_state text, at timestamptz DEFAULT clock_timestamp());
		CREATE FUNCTION log_transition() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF TG_ARGV[0] = 'key' THEN
				INSERT INTO transition_log (machine, from_state, to_state) VALUES ('key', OLD.state, NEW.state);
			ELSE
				INSERT INTO transition_log (machine, from_state, to_state) VALUES (TG_ARGV[0], OLD.status, NEW.status);
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER log_payment AFTER UPDATE ON payments FOR EACH ROW
			WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION log_transition('payment');
		CREATE TRIGGER log_refund AFTER UPDATE ON refunds FOR EACH ROW
			WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION log_transition('refund');
		CREATE TRIGGER log_compensation AFTER UPDATE ON payment_compensations FOR EACH ROW
			WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION log_transition('compensation');
		CREATE TRIGGER log_key AFTER UPDATE ON idempotency_keys FOR EACH ROW
			WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION log_transition('key');`)
	if err != nil {
		t.Fatal(err)
	}
}
