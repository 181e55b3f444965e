package processorsim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/processor"
)

// newSim serves a fresh simulator over real HTTP and returns a client for
// it whose calls time out after timeout.
func newSim(t *testing.T, cfg Config, timeout time.Duration) (*Simulator, *processor.Client, string) {
	t.Helper()
	sim := New(cfg)
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close)
	return sim, processor.NewClient(srv.URL, timeout), srv.URL
}

func visa(amount int64) processor.ChargeRequest {
	return processor.ChargeRequest{
		Amount:        amount,
		Currency:      "EUR",
		PaymentMethod: PaymentMethodVisa,
		Metadata:      map[string]string{"payment_id": "pay_1"},
	}
}

// callSummary is the part of a Call a test can predict.
type callSummary struct {
	Method, Path, Key string
	Status            int
	Fault             FaultKind
	Executed          bool
	Replayed          bool
}

func summarize(calls []Call) []callSummary {
	out := make([]callSummary, len(calls))
	for i, c := range calls {
		out[i] = callSummary{c.Method, c.Path, c.IdempotencyKey, c.Status, c.Fault, c.Executed, c.Replayed}
	}
	return out
}

func chargeIDs(charges []processor.Charge) []string {
	ids := make([]string, len(charges))
	for i, ch := range charges {
		ids[i] = ch.ID
	}
	return ids
}

// rawPost sends a POST without the processor client, for tests about the
// exact bytes on the wire.
func rawPost(t *testing.T, url, key, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func TestIdempotency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SameKeyTwiceChargesOnceAndReplaysTheExactResponse", func(t *testing.T) {
		t.Parallel()
		sim, _, url := newSim(t, Config{}, 0)
		body := `{"amount":1000,"currency":"EUR","payment_method":"pm_card_visa","metadata":{"payment_id":"pay_1"}}`

		status1, header1, body1 := rawPost(t, url+PathCharges, "k1", body)
		status2, header2, body2 := rawPost(t, url+PathCharges, "k1", body)

		if status1 != http.StatusOK {
			t.Fatalf("first status = %d, body %s", status1, body1)
		}
		if diff := cmp.Diff(fmt.Sprint(status1, body1), fmt.Sprint(status2, body2)); diff != "" {
			t.Errorf("replayed response differs (-first +second):\n%s", diff)
		}
		if got := header1.Get("Idempotent-Replayed"); got != "" {
			t.Errorf("first response Idempotent-Replayed = %q, want none", got)
		}
		if got := header2.Get("Idempotent-Replayed"); got != "true" {
			t.Errorf("second response Idempotent-Replayed = %q, want true", got)
		}
		if got := len(sim.Charges()); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
		want := []callSummary{
			{"POST", PathCharges, "k1", 200, "", true, false},
			{"POST", PathCharges, "k1", 200, "", false, true},
		}
		if diff := cmp.Diff(want, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("SameKeyWithDifferentAmountIsAnIdempotencyErrorAndChargesNothing", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatal(err)
		}
		_, err := client.CreateCharge(ctx, visa(2000), "k1")
		var reqErr *processor.RequestError
		if !errors.As(err, &reqErr) {
			t.Fatalf("err = %v, want *RequestError", err)
		}
		if diff := cmp.Diff(processor.RequestError{
			Status:  400,
			Type:    processor.ErrorTypeIdempotency,
			Message: "Keys for idempotent requests can only be used with the same parameters they were first used with.",
		}, *reqErr); diff != "" {
			t.Errorf("error (-want +got):\n%s", diff)
		}
		if got := len(sim.Charges()); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
	})

	t.Run("SameKeyWithDifferentMetadataIsAnIdempotencyError", func(t *testing.T) {
		t.Parallel()
		_, client, _ := newSim(t, Config{}, 0)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatal(err)
		}
		other := visa(1000)
		other.Metadata = map[string]string{"payment_id": "pay_2"}
		_, err := client.CreateCharge(ctx, other, "k1")
		var reqErr *processor.RequestError
		if !errors.As(err, &reqErr) || reqErr.Type != processor.ErrorTypeIdempotency {
			t.Fatalf("err = %v, want an idempotency_error", err)
		}
	})

	t.Run("KeysAreSharedAcrossEndpoints", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		ch, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatal(err)
		}
		_, err = client.Refund(ctx, processor.RefundRequest{Charge: ch.ID}, "k1")
		var reqErr *processor.RequestError
		if !errors.As(err, &reqErr) || reqErr.Type != processor.ErrorTypeIdempotency {
			t.Fatalf("err = %v, want an idempotency_error", err)
		}
		if got := len(sim.Refunds()); got != 0 {
			t.Errorf("refunds = %d, want 0", got)
		}
	})

	t.Run("RejectedCallStoresNothingSoTheKeyStaysUsable", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		unknown := visa(1000)
		unknown.PaymentMethod = "pm_card_unknown"
		_, err := client.CreateCharge(ctx, unknown, "k1")
		var reqErr *processor.RequestError
		if !errors.As(err, &reqErr) || reqErr.Code != processor.CodeResourceMissing {
			t.Fatalf("err = %v, want resource_missing", err)
		}
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatalf("retry with a valid payment method: %v", err)
		}
		want := []callSummary{
			{"POST", PathCharges, "k1", 400, "", false, false},
			{"POST", PathCharges, "k1", 200, "", true, false},
		}
		if diff := cmp.Diff(want, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("MissingKeyIsRejected", func(t *testing.T) {
		t.Parallel()
		sim, _, url := newSim(t, Config{}, 0)
		status, _, body := rawPost(t, url+PathCharges, "", `{"amount":1000,"currency":"EUR","payment_method":"pm_card_visa"}`)
		if status != http.StatusBadRequest || !strings.Contains(body, `"code":"parameter_missing"`) {
			t.Errorf("got %d %s, want 400 parameter_missing", status, body)
		}
		if got := len(sim.Charges()); got != 0 {
			t.Errorf("charges = %d, want 0", got)
		}
	})

	t.Run("MalformedBodyIsRejected", func(t *testing.T) {
		t.Parallel()
		sim, _, url := newSim(t, Config{}, 0)
		for _, body := range []string{
			`{"amount":`,
			`{"amount":1000,"currency":"EUR","payment_method":"pm_card_visa","amuont":1}`,
			`{"amount":1000,"currency":"EUR","payment_method":"pm_card_visa"} {}`,
			`{"amount":0,"currency":"EUR","payment_method":"pm_card_visa"}`,
			`{"amount":1000,"currency":"EURO","payment_method":"pm_card_visa"}`,
			`{"amount":1000,"currency":"EUR"}`,
		} {
			status, _, got := rawPost(t, url+PathCharges, "k-"+body, body)
			if status != http.StatusBadRequest || !strings.Contains(got, `"type":"invalid_request_error"`) {
				t.Errorf("body %s: got %d %s, want 400 invalid_request_error", body, status, got)
			}
		}
		if got := len(sim.Charges()); got != 0 {
			t.Errorf("charges = %d, want 0", got)
		}
	})

	t.Run("FiftyConcurrentCallsWithOneKeyChargeOnce", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		const n = 50
		start := make(chan struct{})
		ids := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				ch, err := client.CreateCharge(ctx, visa(1000), "k1")
				ids[i], errs[i] = ch.ID, err
			})
		}
		close(start)
		wg.Wait()

		charges := sim.Charges()
		if len(charges) != 1 {
			t.Fatalf("charges = %d, want 1", len(charges))
		}
		executed, replayed := 0, 0
		for i := range n {
			if errs[i] != nil {
				t.Errorf("call %d: %v", i, errs[i])
			} else if ids[i] != charges[0].ID {
				t.Errorf("call %d got charge %s, want %s", i, ids[i], charges[0].ID)
			}
		}
		for _, c := range sim.Calls() {
			if c.Executed {
				executed++
			}
			if c.Replayed {
				replayed++
			}
		}
		if diff := cmp.Diff([2]int{1, n - 1}, [2]int{executed, replayed}); diff != "" {
			t.Errorf("[executed replayed] (-want +got):\n%s", diff)
		}
	})
}

func TestIgnoreIdempotencyKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SameKeyTwiceChargesTwiceAndBothAreFoundByKey", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{IgnoreIdempotencyKeys: true}, 0)
		first, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatal(err)
		}
		second, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatal(err)
		}
		if first.ID == second.ID {
			t.Fatalf("both calls returned charge %s, want two charges", first.ID)
		}
		found, err := client.ChargesByIdempotencyKey(ctx, "k1")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]processor.Charge{first, second}, found); diff != "" {
			t.Errorf("charges by key (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(found, sim.Charges()); diff != "" {
			t.Errorf("recorded charges (-listed +recorded):\n%s", diff)
		}
	})

	t.Run("SwitchingAtRunTimeTakesEffectOnTheNextCall", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatal(err)
		}
		sim.SetIgnoreIdempotencyKeys(true)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatal(err)
		}
		sim.SetIgnoreIdempotencyKeys(false)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatal(err)
		}
		want := []callSummary{
			{"POST", PathCharges, "k1", 200, "", true, false},
			{"POST", PathCharges, "k1", 200, "", true, false},
			{"POST", PathCharges, "k1", 200, "", false, true},
		}
		if diff := cmp.Diff(want, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("CreateChargeDirectForcesADoubleChargeUnderOneKey", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		first, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatal(err)
		}
		direct := sim.CreateChargeDirect(visa(1000), "k1")
		found, err := client.ChargesByIdempotencyKey(ctx, "k1")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{first.ID, direct.ID}, chargeIDs(found)); diff != "" {
			t.Errorf("charges by key (-want +got):\n%s", diff)
		}
		if got := len(sim.Calls()); got != 2 {
			t.Errorf("calls = %d, want 2 (the direct charge is not a call)", got)
		}
	})
}

func TestDeclines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name          string
		paymentMethod string
		declineCode   string
	}{
		{"GenericDeclineIsRecordedAndReplayed", PaymentMethodDeclined, "generic_decline"},
		{"InsufficientFundsIsRecordedAndReplayed", PaymentMethodInsufficientFunds, "insufficient_funds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sim, client, _ := newSim(t, Config{}, 0)
			req := visa(1000)
			req.PaymentMethod = tt.paymentMethod

			_, err1 := client.CreateCharge(ctx, req, "k1")
			_, err2 := client.CreateCharge(ctx, req, "k1")

			var decline1, decline2 *processor.DeclineError
			if !errors.As(err1, &decline1) || !errors.As(err2, &decline2) {
				t.Fatalf("errors = %v, %v; want two *DeclineError", err1, err2)
			}
			charges := sim.Charges()
			if len(charges) != 1 {
				t.Fatalf("charges = %d, want 1", len(charges))
			}
			want := processor.DeclineError{
				Code:        processor.CodeCardDeclined,
				DeclineCode: tt.declineCode,
				Message:     "Your card was declined.",
				ChargeID:    charges[0].ID,
			}
			if diff := cmp.Diff(want, *decline1); diff != "" {
				t.Errorf("first decline (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want, *decline2); diff != "" {
				t.Errorf("replayed decline (-want +got):\n%s", diff)
			}
			if got := charges[0].Status; got != processor.StatusFailed {
				t.Errorf("charge status = %q, want failed", got)
			}
			wantCalls := []callSummary{
				{"POST", PathCharges, "k1", 402, "", true, false},
				{"POST", PathCharges, "k1", 402, "", false, true},
			}
			if diff := cmp.Diff(wantCalls, summarize(sim.Calls())); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TimeoutIsTransientAndChargesNothingUntilTheRetry", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 50*time.Millisecond)
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultTimeout})

		_, err := client.CreateCharge(ctx, visa(1000), "k1")
		if !errors.Is(err, processor.ErrTransient) {
			t.Fatalf("err = %v, want ErrTransient", err)
		}
		var netErr net.Error
		if !errors.As(err, &netErr) || !netErr.Timeout() {
			t.Errorf("err = %v, want the timeout kept as the cause", err)
		}
		if got := len(sim.Charges()); got != 0 {
			t.Fatalf("charges after timeout = %d, want 0", got)
		}

		ch, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if diff := cmp.Diff([]string{ch.ID}, chargeIDs(sim.Charges())); diff != "" {
			t.Errorf("charges (-want +got):\n%s", diff)
		}
		calls := sim.Calls()
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 0, FaultTimeout, false, false},
			{"POST", PathCharges, "k1", 200, "", true, false},
		}, summarize(calls)); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("ServerErrorIsTransientAndChargesNothing", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultServerError})

		_, err := client.CreateCharge(ctx, visa(1000), "k1")
		if !errors.Is(err, processor.ErrTransient) {
			t.Fatalf("err = %v, want ErrTransient", err)
		}
		if got := len(sim.Charges()); got != 0 {
			t.Fatalf("charges = %d, want 0", got)
		}
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatalf("retry: %v", err)
		}
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 500, FaultServerError, false, false},
			{"POST", PathCharges, "k1", 200, "", true, false},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("LostResponseIsTransientButTheChargeExistsAndTheRetryReturnsIt", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		// Open a keep-alive connection first: net/http would silently resend
		// a keyed request whose reused connection closes, and the client
		// must not let it.
		if _, err := client.ChargesByIdempotencyKey(ctx, "warm-up"); err != nil {
			t.Fatal(err)
		}
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLostResponse})

		_, err := client.CreateCharge(ctx, visa(1000), "k1")
		if !errors.Is(err, processor.ErrTransient) {
			t.Fatalf("err = %v, want ErrTransient", err)
		}
		charges := sim.Charges()
		if len(charges) != 1 {
			t.Fatalf("charges after the lost response = %d, want 1", len(charges))
		}

		retried, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if diff := cmp.Diff(charges, sim.Charges()); diff != "" {
			t.Errorf("charges changed on retry (-before +after):\n%s", diff)
		}
		if diff := cmp.Diff(charges[0], retried); diff != "" {
			t.Errorf("retry returned (-stored +got):\n%s", diff)
		}
		if diff := cmp.Diff([]callSummary{
			{"GET", PathCharges, "", 200, "", false, false},
			{"POST", PathCharges, "k1", 0, FaultLostResponse, true, false},
			{"POST", PathCharges, "k1", 200, "", false, true},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("LatencyFaultDelaysThenProceeds", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLatency, Latency: 20 * time.Millisecond})
		ch, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{ch.ID}, chargeIDs(sim.Charges())); diff != "" {
			t.Errorf("charges (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 200, FaultLatency, true, false},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("ConfiguredLatencyBeyondTheClientTimeoutChargesNothing", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{Latency: time.Hour}, 50*time.Millisecond)
		_, err := client.CreateCharge(ctx, visa(1000), "k1")
		if !errors.Is(err, processor.ErrTransient) {
			t.Fatalf("err = %v, want ErrTransient", err)
		}
		if got := len(sim.Charges()); got != 0 {
			t.Errorf("charges = %d, want 0", got)
		}
	})

	t.Run("FaultIsOneShotAndOnlyForItsPath", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		sim.InjectFault(Fault{Path: PathRefunds, Kind: FaultServerError})
		ch, err := client.CreateCharge(ctx, visa(1000), "charge")
		if err != nil {
			t.Fatalf("charge took the refunds fault: %v", err)
		}
		if _, err := client.Refund(ctx, processor.RefundRequest{Charge: ch.ID}, "refund"); !errors.Is(err, processor.ErrTransient) {
			t.Fatalf("first refund err = %v, want ErrTransient", err)
		}
		if _, err := client.Refund(ctx, processor.RefundRequest{Charge: ch.ID}, "refund"); err != nil {
			t.Fatalf("second refund: %v", err)
		}
		if got := len(sim.Refunds()); got != 1 {
			t.Errorf("refunds = %d, want 1", got)
		}
	})
}

func TestRefunds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PartialThenOverThenRemainderThenReplay", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		ch, err := client.CreateCharge(ctx, visa(1000), "charge")
		if err != nil {
			t.Fatal(err)
		}

		partial, err := client.Refund(ctx, processor.RefundRequest{Charge: ch.ID, Amount: 300}, "refund-1")
		if err != nil {
			t.Fatalf("partial refund: %v", err)
		}
		if partial.Amount != 300 || partial.Status != processor.StatusSucceeded || partial.Charge != ch.ID {
			t.Errorf("partial refund = %+v", partial)
		}

		_, err = client.Refund(ctx, processor.RefundRequest{Charge: ch.ID, Amount: 701}, "refund-2")
		var reqErr *processor.RequestError
		if !errors.As(err, &reqErr) || reqErr.Code != processor.CodeAmountTooLarge || reqErr.Status != 400 {
			t.Fatalf("over-refund err = %v, want 400 amount_too_large", err)
		}

		full, err := client.Refund(ctx, processor.RefundRequest{Charge: ch.ID}, "refund-3")
		if err != nil {
			t.Fatalf("refund of the remainder: %v", err)
		}
		if full.Amount != 700 {
			t.Errorf("remainder refunded = %d, want 700", full.Amount)
		}

		again, err := client.Refund(ctx, processor.RefundRequest{Charge: ch.ID}, "refund-3")
		if err != nil {
			t.Fatalf("replay of the remainder refund: %v", err)
		}
		if diff := cmp.Diff(full, again); diff != "" {
			t.Errorf("replayed refund (-first +replay):\n%s", diff)
		}

		listed, err := client.RefundsByCharge(ctx, ch.ID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]processor.Refund{partial, full}, listed); diff != "" {
			t.Errorf("refunds of the charge (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(listed, sim.Refunds()); diff != "" {
			t.Errorf("recorded refunds (-listed +recorded):\n%s", diff)
		}
		if got := sim.Charges()[0].RefundedAmount; got != 1000 {
			t.Errorf("refunded amount = %d, want 1000", got)
		}

		_, err = client.Refund(ctx, processor.RefundRequest{Charge: ch.ID}, "refund-4")
		if !errors.As(err, &reqErr) || reqErr.Code != processor.CodeChargeAlreadyRefunded {
			t.Errorf("refund of a refunded charge err = %v, want charge_already_refunded", err)
		}
	})

	t.Run("UnknownOrFailedChargeIsRejected", func(t *testing.T) {
		t.Parallel()
		sim, client, _ := newSim(t, Config{}, 0)
		declined := visa(1000)
		declined.PaymentMethod = PaymentMethodDeclined
		var decline *processor.DeclineError
		if _, err := client.CreateCharge(ctx, declined, "charge"); !errors.As(err, &decline) {
			t.Fatalf("err = %v, want a decline", err)
		}
		tests := []struct {
			charge, code string
		}{
			{"ch_unknown", processor.CodeResourceMissing},
			{decline.ChargeID, processor.CodeChargeNotRefundable},
		}
		for _, tt := range tests {
			_, err := client.Refund(ctx, processor.RefundRequest{Charge: tt.charge}, "refund-"+tt.charge)
			var reqErr *processor.RequestError
			if !errors.As(err, &reqErr) || reqErr.Code != tt.code {
				t.Errorf("refund of %s err = %v, want %s", tt.charge, err, tt.code)
			}
		}
		if got := len(sim.Refunds()); got != 0 {
			t.Errorf("refunds = %d, want 0", got)
		}
	})
}

func TestLookups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ChargesByMetadataFindsOnlyMatchingCharges", func(t *testing.T) {
		t.Parallel()
		_, client, _ := newSim(t, Config{}, 0)
		want, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatal(err)
		}
		other := visa(1000)
		other.Metadata = map[string]string{"payment_id": "pay_2"}
		if _, err := client.CreateCharge(ctx, other, "k2"); err != nil {
			t.Fatal(err)
		}
		got, err := client.ChargesByMetadata(ctx, "payment_id", "pay_1")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]processor.Charge{want}, got); diff != "" {
			t.Errorf("charges (-want +got):\n%s", diff)
		}
	})

	t.Run("ChargeByIDAndUnknownID", func(t *testing.T) {
		t.Parallel()
		_, client, url := newSim(t, Config{}, 0)
		ch, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get(url + PathCharges + "/" + ch.ID)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("known charge status = %d, want 200", resp.StatusCode)
		}
		resp, err = http.Get(url + PathCharges + "/ch_unknown")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("unknown charge status = %d, want 404", resp.StatusCode)
		}
	})
}

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("FaultModeCallsAndResetAreDrivableOverHTTP", func(t *testing.T) {
		t.Parallel()
		sim, client, url := newSim(t, Config{}, 0)
		post := func(path, body string, wantStatus int) string {
			t.Helper()
			resp, err := http.Post(url+path, "application/json", bytes.NewBufferString(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != wantStatus {
				t.Fatalf("POST %s %s: status %d %s, want %d", path, body, resp.StatusCode, b, wantStatus)
			}
			return string(b)
		}

		post("/_sim/faults", `{"path":"/v1/charges","kind":"server_error"}`, http.StatusNoContent)
		post("/_sim/faults", `{"path":"/v1/payouts","kind":"server_error"}`, http.StatusBadRequest)
		post("/_sim/faults", `{"path":"/v1/charges","kind":"meteor"}`, http.StatusBadRequest)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); !errors.Is(err, processor.ErrTransient) {
			t.Fatalf("err = %v, want the queued server_error", err)
		}

		mode := post("/_sim/mode", `{"ignore_idempotency_keys":true}`, http.StatusOK)
		if diff := cmp.Diff(`{"ignore_idempotency_keys":true,"latency_ms":0}`+"\n", mode); diff != "" {
			t.Errorf("mode (-want +got):\n%s", diff)
		}
		for range 2 {
			if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
				t.Fatal(err)
			}
		}
		if got := len(sim.Charges()); got != 2 {
			t.Errorf("charges in ignore-keys mode = %d, want 2", got)
		}

		resp, err := http.Get(url + "/_sim/calls")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `"fault":"server_error"`) || strings.Count(string(b), `"executed":true`) != 2 {
			t.Errorf("GET /_sim/calls = %s, want the fault and two executed calls", b)
		}

		post("/_sim/reset", ``, http.StatusNoContent)
		if got := len(sim.Charges()) + len(sim.Calls()); got != 0 {
			t.Errorf("charges+calls after reset = %d, want 0", got)
		}
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatal(err)
		}
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatal(err)
		}
		if got := len(sim.Charges()); got != 1 {
			t.Errorf("charges after reset restored deduplication = %d, want 1", got)
		}
	})
}

func TestServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ServesOverTCPAndShutdownDropsCallsHeldByATimeoutFault", func(t *testing.T) {
		t.Parallel()
		blocked := make(chan struct{})
		srv, err := Start("127.0.0.1:0", Config{onBlock: func() { close(blocked) }})
		if err != nil {
			t.Fatal(err)
		}
		client := processor.NewClient(srv.URL(), time.Hour)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatal(err)
		}
		srv.Simulator.InjectFault(Fault{Path: PathCharges, Kind: FaultTimeout})
		errc := make(chan error, 1)
		go func() {
			_, err := client.CreateCharge(ctx, visa(1000), "k2")
			errc <- err
		}()
		<-blocked

		if err := srv.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if err := <-errc; !errors.Is(err, processor.ErrTransient) {
			t.Errorf("held call err = %v, want ErrTransient", err)
		}
		if got := len(srv.Simulator.Charges()); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
		if err := srv.Err(); err != nil {
			t.Errorf("Err after Shutdown = %v, want nil", err)
		}
	})

	t.Run("PortInUseIsAnError", func(t *testing.T) {
		t.Parallel()
		srv, err := Start("127.0.0.1:0", Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Shutdown(ctx) })
		if _, err := Start(strings.TrimPrefix(srv.URL(), "http://"), Config{}); err == nil {
			t.Error("second Start on the same address succeeded, want an error")
		}
	})
}
