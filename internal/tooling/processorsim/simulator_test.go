package processorsim

import (
	"bytes"
	"context"
	"encoding/json"
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
	"github.com/idemref/payments/internal/processor/simproc"
)

// newSim serves a fresh simulator over real HTTP and returns a client for
// it whose calls time out after timeout.
func newSim(t *testing.T, cfg Config, timeout time.Duration) (*Simulator, *simproc.Client, string) {
	t.Helper()
	sim := New(cfg)
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close)
	return sim, simproc.NewClient(srv.URL, timeout), srv.URL
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

// chargeBody is the JSON of visa(amount) without metadata, for rawPost.
func chargeBody(amount int64) string {
	return fmt.Sprintf(`{"amount":%d,"currency":"EUR","payment_method":"pm_card_visa"}`, amount)
}

// apiError decodes the error body of a failed call.
func apiError(t *testing.T, body string) simproc.APIError {
	t.Helper()
	var e simproc.ErrorResponse
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e.Error
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
		sim, _, url := newSim(t, Config{}, 0)
		rawPost(t, url+PathCharges, "k1", chargeBody(1000))
		status, _, body := rawPost(t, url+PathCharges, "k1", chargeBody(2000))
		want := simproc.APIError{
			Type:    simproc.ErrorTypeIdempotency,
			Code:    simproc.CodeIdempotencyKeyReused,
			Message: "Keys for idempotent requests can only be used with the same parameters they were first used with.",
		}
		if diff := cmp.Diff(fmt.Sprint(400, want), fmt.Sprint(status, apiError(t, body))); diff != "" {
			t.Errorf("answer (-want +got):\n%s", diff)
		}
		if got := len(sim.Charges()); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 200, "", true, false},
			{"POST", PathCharges, "k1", 400, "", false, false},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("SameKeyWithDifferentMetadataIsAnIdempotencyError", func(t *testing.T) {
		t.Parallel()
		sim, _, url := newSim(t, Config{}, 0)
		rawPost(t, url+PathCharges, "k1", `{"amount":1000,"currency":"EUR","payment_method":"pm_card_visa","metadata":{"payment_id":"pay_1"}}`)
		status, _, body := rawPost(t, url+PathCharges, "k1", `{"amount":1000,"currency":"EUR","payment_method":"pm_card_visa","metadata":{"payment_id":"pay_2"}}`)
		if got := apiError(t, body); status != http.StatusBadRequest || got.Code != simproc.CodeIdempotencyKeyReused {
			t.Fatalf("got %d %+v, want 400 idempotency_key_reused", status, got)
		}
		if got := len(sim.Charges()); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
	})

	t.Run("KeysAreSharedAcrossEndpoints", func(t *testing.T) {
		t.Parallel()
		sim, client, url := newSim(t, Config{}, 0)
		ch, err := client.CreateCharge(ctx, visa(1000), "k1")
		if err != nil {
			t.Fatal(err)
		}
		status, _, body := rawPost(t, url+PathRefunds, "k1", `{"charge":"`+ch.ID+`"}`)
		if got := apiError(t, body); status != http.StatusBadRequest || got.Code != simproc.CodeIdempotencyKeyReused {
			t.Fatalf("got %d %+v, want 400 idempotency_key_reused", status, got)
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
		if !errors.Is(err, processor.ErrOutcomeUnknown) {
			t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
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
		if !errors.Is(err, processor.ErrOutcomeUnknown) {
			t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
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
		if !errors.Is(err, processor.ErrOutcomeUnknown) {
			t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
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
		if !errors.Is(err, processor.ErrOutcomeUnknown) {
			t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
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
		if _, err := client.Refund(ctx, processor.RefundRequest{Charge: ch.ID}, "refund"); !errors.Is(err, processor.ErrOutcomeUnknown) {
			t.Fatalf("first refund err = %v, want ErrOutcomeUnknown", err)
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
		if !errors.As(err, &reqErr) || reqErr.Code != simproc.CodeAmountTooLarge || reqErr.Status != 400 {
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
			{decline.ChargeID, simproc.CodeChargeNotRefundable},
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

	// A revoked key, as the chaos harness injects it: every call refused
	// with 401, which the client reports as our configuration refused,
	// nothing executed, until the mode is switched off.
	t.Run("RefuseKeyModeAnswersEveryCall401UntilOff", func(t *testing.T) {
		t.Parallel()
		sim, client, url := newSim(t, Config{}, 0)
		setMode := func(body string) {
			t.Helper()
			resp, err := http.Post(url+"/_sim/mode", "application/json", bytes.NewBufferString(body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("POST /_sim/mode %s: %d", body, resp.StatusCode)
			}
		}
		setMode(`{"refuse_key":true}`)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); !errors.Is(err, processor.ErrMisconfigured) {
			t.Fatalf("charge with the key refused: err = %v, want ErrMisconfigured", err)
		}
		resp, err := http.Get(url + PathCharges + "?idempotency_key=k1")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s with the key refused: %d, want 401", PathCharges, resp.StatusCode)
		}
		if got := len(sim.Charges()); got != 0 {
			t.Errorf("charges executed with the key refused = %d, want 0", got)
		}
		setMode(`{"refuse_key":false}`)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatalf("charge once the key is served again: %v", err)
		}
		if got := len(sim.Charges()); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
	})

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
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); !errors.Is(err, processor.ErrOutcomeUnknown) {
			t.Fatalf("err = %v, want the queued server_error", err)
		}

		mode := post("/_sim/mode", `{"ignore_idempotency_keys":true}`, http.StatusOK)
		if diff := cmp.Diff(`{"ignore_idempotency_keys":true,"latency_ms":0,"refuse_key":false}`+"\n", mode); diff != "" {
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
		client := simproc.NewClient(srv.URL(), time.Hour)
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
		if err := <-errc; !errors.Is(err, processor.ErrOutcomeUnknown) {
			t.Errorf("held call err = %v, want ErrOutcomeUnknown", err)
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

// holdControl decides when calls held by a latency or late_execution
// fault end their delay: each held call signals on held once its key is
// in flight, and ends its delay when release delivers. Nothing else ends
// it early but what the simulator documents (client gone for latency,
// shutdown, Reset, MaxExecution), so tests act while a call is held
// without sleeping.
type holdControl struct {
	held    chan struct{}
	release chan time.Time
}

func newHoldControl(cfg Config) (*holdControl, Config) {
	hc := &holdControl{held: make(chan struct{}, 8), release: make(chan time.Time)}
	cfg.HoldTimer = func(time.Duration) <-chan time.Time {
		hc.held <- struct{}{}
		return hc.release
	}
	return hc, cfg
}

// waitHeld returns once a call is held, failing the test rather than
// hanging if none comes.
func (hc *holdControl) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-hc.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no call was held")
	}
}

// releaseOne ends the delay of one held call, failing the test rather
// than hanging if no call is still waiting for it.
func (hc *holdControl) releaseOne(t *testing.T) {
	t.Helper()
	select {
	case hc.release <- time.Now():
	case <-time.After(10 * time.Second):
		t.Fatal("no held call was waiting for its delay to end")
	}
}

// answer is what an asynchronous rawPost got.
type answer struct {
	status int
	body   string
	err    error
}

// postAsync sends a POST in the background; cancelling ctx hangs up.
func postAsync(ctx context.Context, url, key, body string) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			done <- answer{err: err}
			return
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- answer{status: resp.StatusCode, body: string(b), err: err}
	}()
	return done
}

// waitIdle fails the test if held calls do not settle promptly.
func waitIdle(t *testing.T, sim *Simulator) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sim.WaitIdle(ctx); err != nil {
		t.Fatalf("WaitIdle: %v", err)
	}
}

func TestKeyInFlight(t *testing.T) {
	t.Parallel()

	for _, kind := range []FaultKind{FaultLatency, FaultLateExecution} {
		t.Run("SameKeyWhileHeldBy_"+string(kind)+"_Is409AndExecutesNothing", func(t *testing.T) {
			t.Parallel()
			hc, cfg := newHoldControl(Config{})
			sim, _, url := newSim(t, cfg, 0)
			sim.InjectFault(Fault{Path: PathCharges, Kind: kind, Latency: time.Second})
			first := postAsync(context.Background(), url+PathCharges, "k1", chargeBody(1000))
			hc.waitHeld(t)

			status, header, body := rawPost(t, url+PathCharges, "k1", chargeBody(1000))
			want := simproc.APIError{
				Type: simproc.ErrorTypeIdempotency,
				Code: simproc.CodeIdempotencyKeyInUse,
				Message: "There is currently another in-progress request using this Idempotency-Key " +
					"(probably a retry sent while the first call is still executing). Try again later.",
			}
			if diff := cmp.Diff(fmt.Sprint(409, want), fmt.Sprint(status, apiError(t, body))); diff != "" {
				t.Errorf("duplicate's answer (-want +got):\n%s", diff)
			}
			if got := header.Get("Idempotent-Replayed"); got != "" {
				t.Errorf("409 Idempotent-Replayed = %q, want none", got)
			}
			if got := len(sim.Charges()); got != 0 {
				t.Errorf("charges while held = %d, want 0", got)
			}

			hc.releaseOne(t)
			if a := <-first; a.err != nil || a.status != http.StatusOK {
				t.Fatalf("held call got %d %s %v, want 200", a.status, a.body, a.err)
			}
			waitIdle(t, sim)
			rawPost(t, url+PathCharges, "k1", chargeBody(1000))
			if got := len(sim.Charges()); got != 1 {
				t.Errorf("charges = %d, want 1", got)
			}
			if diff := cmp.Diff([]callSummary{
				{"POST", PathCharges, "k1", 200, kind, true, false},
				{"POST", PathCharges, "k1", 409, "", false, false},
				{"POST", PathCharges, "k1", 200, "", false, true},
			}, summarize(sim.Calls())); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("OtherKeysAreNotBlocked", func(t *testing.T) {
		t.Parallel()
		hc, cfg := newHoldControl(Config{})
		sim, _, url := newSim(t, cfg, 0)
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLateExecution, Latency: time.Second})
		first := postAsync(context.Background(), url+PathCharges, "k1", chargeBody(1000))
		hc.waitHeld(t)
		if status, _, body := rawPost(t, url+PathCharges, "k2", chargeBody(1000)); status != http.StatusOK {
			t.Fatalf("other key while k1 is held: %d %s", status, body)
		}
		hc.releaseOne(t)
		<-first
		waitIdle(t, sim)
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 200, FaultLateExecution, true, false},
			{"POST", PathCharges, "k2", 200, "", true, false},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("IgnoringKeysThereIsNoInFlightCheck", func(t *testing.T) {
		t.Parallel()
		hc, cfg := newHoldControl(Config{IgnoreIdempotencyKeys: true})
		sim, _, url := newSim(t, cfg, 0)
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLateExecution, Latency: time.Second})
		first := postAsync(context.Background(), url+PathCharges, "k1", chargeBody(1000))
		hc.waitHeld(t)
		if status, _, body := rawPost(t, url+PathCharges, "k1", chargeBody(1000)); status != http.StatusOK {
			t.Fatalf("same key while held, keys ignored: %d %s, want 200", status, body)
		}
		hc.releaseOne(t)
		<-first
		waitIdle(t, sim)
		charges := sim.Charges()
		if len(charges) != 2 || charges[0].IdempotencyKey != "k1" || charges[1].IdempotencyKey != "k1" {
			t.Errorf("charges = %+v, want two under k1", charges)
		}
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 200, FaultLateExecution, true, false},
			{"POST", PathCharges, "k1", 200, "", true, false},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("LatencyAbandonedByItsClientFreesTheKeyAndChargesNothing", func(t *testing.T) {
		t.Parallel()
		hc, cfg := newHoldControl(Config{}) // never released
		sim, _, url := newSim(t, cfg, 0)
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLatency, Latency: time.Second})
		ctx, hangUp := context.WithCancel(context.Background())
		first := postAsync(ctx, url+PathCharges, "k1", chargeBody(1000))
		hc.waitHeld(t)
		hangUp()
		if a := <-first; a.err == nil {
			t.Fatalf("client that hung up got %d %s", a.status, a.body)
		}
		waitIdle(t, sim)
		if got := len(sim.Charges()); got != 0 {
			t.Fatalf("charges after the abandoned call = %d, want 0", got)
		}
		if status, _, body := rawPost(t, url+PathCharges, "k1", chargeBody(1000)); status != http.StatusOK {
			t.Fatalf("retry: %d %s, want 200", status, body)
		}
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 0, FaultLatency, false, false},
			{"POST", PathCharges, "k1", 200, "", true, false},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})
}

func TestLateExecution(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("LandsAfterTheClientGaveUpAndIsStoredUnderTheKey", func(t *testing.T) {
		t.Parallel()
		hc, cfg := newHoldControl(Config{})
		sim := New(cfg)
		// Tell the test when the server has seen the held call's client go.
		gone := make(chan struct{}, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				context.AfterFunc(r.Context(), func() {
					select {
					case gone <- struct{}{}:
					default:
					}
				})
			}
			sim.Handler().ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLateExecution, Latency: time.Second})

		reqCtx, hangUp := context.WithCancel(ctx)
		first := postAsync(reqCtx, srv.URL+PathCharges, "k1", chargeBody(1000))
		hc.waitHeld(t)
		if got := len(sim.Charges()); got != 0 {
			t.Fatalf("charges while held = %d, want 0", got)
		}
		hangUp()
		if a := <-first; a.err == nil {
			t.Fatalf("client that hung up got %d %s", a.status, a.body)
		}
		select {
		case <-gone:
		case <-time.After(10 * time.Second):
			t.Fatal("the server never saw the client leave")
		}
		if got := len(sim.Charges()); got != 0 {
			t.Fatalf("charges once the client left = %d, want 0 until the delay passes", got)
		}
		hc.releaseOne(t)
		waitIdle(t, sim)

		charges := sim.Charges()
		if len(charges) != 1 || charges[0].IdempotencyKey != "k1" || charges[0].Status != processor.StatusSucceeded {
			t.Fatalf("charges after the delay = %+v, want one succeeded under k1", charges)
		}
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 0, FaultLateExecution, true, false},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
		// The response was stored: the retry is a replay of that charge.
		retried, err := simproc.NewClient(srv.URL, 0).CreateCharge(ctx, processor.ChargeRequest{
			Amount: 1000, Currency: "EUR", PaymentMethod: PaymentMethodVisa,
		}, "k1")
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if diff := cmp.Diff(charges[0], retried); diff != "" {
			t.Errorf("retry returned (-landed +got):\n%s", diff)
		}
		if got := len(sim.Charges()); got != 1 {
			t.Errorf("charges after the retry = %d, want 1", got)
		}
	})

	t.Run("AnswersAClientThatWaited", func(t *testing.T) {
		t.Parallel()
		hc, cfg := newHoldControl(Config{})
		sim, client, _ := newSim(t, cfg, time.Hour)
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLateExecution, Latency: time.Second})
		type result struct {
			ch  processor.Charge
			err error
		}
		done := make(chan result, 1)
		go func() {
			ch, err := client.CreateCharge(ctx, visa(1000), "k1")
			done <- result{ch, err}
		}()
		hc.waitHeld(t)
		hc.releaseOne(t)
		got := <-done
		if got.err != nil {
			t.Fatal(got.err)
		}
		if diff := cmp.Diff(sim.Charges(), []processor.Charge{got.ch}); diff != "" {
			t.Errorf("charges (-recorded +answered):\n%s", diff)
		}
		waitIdle(t, sim)
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 200, FaultLateExecution, true, false},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("ShutdownAbandonsItWithoutExecuting", func(t *testing.T) {
		t.Parallel()
		hc, cfg := newHoldControl(Config{}) // never released
		srv, err := Start("127.0.0.1:0", cfg)
		if err != nil {
			t.Fatal(err)
		}
		srv.Simulator.InjectFault(Fault{Path: PathCharges, Kind: FaultLateExecution, Latency: MaxExecution})
		first := postAsync(ctx, srv.URL()+PathCharges, "k1", chargeBody(1000))
		hc.waitHeld(t)

		shutdownCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			t.Fatalf("Shutdown with a late execution held: %v", err)
		}
		if a := <-first; a.err == nil {
			t.Errorf("held call got %d %s, want no answer", a.status, a.body)
		}
		waitIdle(t, srv.Simulator)
		if got := len(srv.Simulator.Charges()); got != 0 {
			t.Errorf("charges = %d, want 0", got)
		}
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 0, FaultLateExecution, false, false},
		}, summarize(srv.Simulator.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("ResetAbandonsItWithoutExecuting", func(t *testing.T) {
		t.Parallel()
		hc, cfg := newHoldControl(Config{}) // never released
		sim, _, url := newSim(t, cfg, 0)
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLateExecution, Latency: MaxExecution})
		first := postAsync(ctx, url+PathCharges, "k1", chargeBody(1000))
		hc.waitHeld(t)

		sim.Reset()
		waitIdle(t, sim)
		if a := <-first; a.err == nil {
			t.Errorf("held call got %d %s, want no answer", a.status, a.body)
		}
		if status, _, body := rawPost(t, url+PathCharges, "k1", chargeBody(1000)); status != http.StatusOK {
			t.Fatalf("same key after Reset: %d %s, want 200", status, body)
		}
		if got := len(sim.Charges()); got != 1 {
			t.Errorf("charges = %d, want only the one after Reset", got)
		}
		if diff := cmp.Diff([]callSummary{
			{"POST", PathCharges, "k1", 200, "", true, false},
		}, summarize(sim.Calls())); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
	})

	t.Run("NothingLandsLaterThanMaxExecution", func(t *testing.T) {
		t.Parallel()
		// Scaled down: a 50ms MaxExecution, a client that would wait an
		// hour, and waits that never end by themselves.
		tests := []struct {
			name  string
			cfg   Config
			fault Fault
		}{
			{"HeldByAFault", Config{}, Fault{Path: PathCharges, Kind: FaultLateExecution, Latency: time.Second}},
			{"ConfiguredLatency", Config{Latency: time.Hour}, Fault{}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				_, cfg := newHoldControl(tt.cfg)
				cfg.maxExecution = 50 * time.Millisecond
				sim, _, url := newSim(t, cfg, 0)
				if tt.fault.Kind != "" {
					sim.InjectFault(tt.fault)
				}
				if a := <-postAsync(ctx, url+PathCharges, "k1", chargeBody(1000)); a.err == nil {
					t.Errorf("got %d %s, want no answer", a.status, a.body)
				}
				waitIdle(t, sim)
				if got := len(sim.Charges()); got != 0 {
					t.Errorf("charges = %d, want 0", got)
				}
				if diff := cmp.Diff([]callSummary{
					{"POST", PathCharges, "k1", 0, tt.fault.Kind, false, false},
				}, summarize(sim.Calls())); diff != "" {
					t.Errorf("calls (-want +got):\n%s", diff)
				}
			})
		}
	})

	t.Run("RefundToo", func(t *testing.T) {
		t.Parallel()
		hc, cfg := newHoldControl(Config{})
		sim, client, url := newSim(t, cfg, 0)
		ch, err := client.CreateCharge(ctx, visa(1000), "charge")
		if err != nil {
			t.Fatal(err)
		}
		sim.InjectFault(Fault{Path: PathRefunds, Kind: FaultLateExecution, Latency: time.Second})
		reqCtx, hangUp := context.WithCancel(ctx)
		first := postAsync(reqCtx, url+PathRefunds, "refund", `{"charge":"`+ch.ID+`"}`)
		hc.waitHeld(t)
		hangUp()
		<-first
		hc.releaseOne(t)
		waitIdle(t, sim)
		refunds := sim.Refunds()
		if len(refunds) != 1 || refunds[0].Amount != 1000 || refunds[0].IdempotencyKey != "refund" {
			t.Errorf("refunds = %+v, want the full refund under its key", refunds)
		}
	})
}

func TestStatusFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		fault          Fault
		wantStatus     int
		wantType       string
		wantCode       string
		wantRetryAfter string
	}{
		{"408", Fault{Kind: FaultStatus, Status: 408}, 408, simproc.ErrorTypeAPI, "", ""},
		{"425", Fault{Kind: FaultStatus, Status: 425}, 425, simproc.ErrorTypeAPI, "", ""},
		{"429DefaultsToOneSecond", Fault{Kind: FaultStatus, Status: 429}, 429, simproc.ErrorTypeRateLimit, simproc.CodeRateLimited, "1"},
		{"429RoundsUp", Fault{Kind: FaultStatus, Status: 429, RetryAfter: 1500 * time.Millisecond}, 429, simproc.ErrorTypeRateLimit, simproc.CodeRateLimited, "2"},
		{"429AtLeastOneSecond", Fault{Kind: FaultStatus, Status: 429, RetryAfter: time.Millisecond}, 429, simproc.ErrorTypeRateLimit, simproc.CodeRateLimited, "1"},
		{"500", Fault{Kind: FaultStatus, Status: 500}, 500, simproc.ErrorTypeAPI, "", ""},
		{"502", Fault{Kind: FaultStatus, Status: 502}, 502, simproc.ErrorTypeAPI, "", ""},
		{"503", Fault{Kind: FaultStatus, Status: 503}, 503, simproc.ErrorTypeAPI, "", ""},
		{"504", Fault{Kind: FaultStatus, Status: 504}, 504, simproc.ErrorTypeAPI, "", ""},
		{"ServerErrorIsStatus500", Fault{Kind: FaultServerError}, 500, simproc.ErrorTypeAPI, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sim, _, url := newSim(t, Config{}, 0)
			tt.fault.Path = PathCharges
			sim.InjectFault(tt.fault)

			status, header, body := rawPost(t, url+PathCharges, "k1", chargeBody(1000))
			got := apiError(t, body)
			if diff := cmp.Diff(
				fmt.Sprint(tt.wantStatus, tt.wantType, tt.wantCode, tt.wantRetryAfter),
				fmt.Sprint(status, got.Type, got.Code, header.Get("Retry-After")),
			); diff != "" {
				t.Errorf("status type code Retry-After (-want +got):\n%s", diff)
			}
			if got := len(sim.Charges()); got != 0 {
				t.Fatalf("charges = %d, want 0", got)
			}
			// Nothing was stored under the key: the retry executes.
			if status, _, body := rawPost(t, url+PathCharges, "k1", chargeBody(1000)); status != http.StatusOK {
				t.Fatalf("retry: %d %s", status, body)
			}
			if diff := cmp.Diff([]callSummary{
				{"POST", PathCharges, "k1", tt.wantStatus, tt.fault.Kind, false, false},
				{"POST", PathCharges, "k1", 200, "", true, false},
			}, summarize(sim.Calls())); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
		})
	}
}

// getList fetches one page of a list endpoint.
func getList[T any](t *testing.T, url string) (int, simproc.List[T], string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var list simproc.List[T]
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatalf("list body %s: %v", b, err)
		}
	}
	return resp.StatusCode, list, string(b)
}

func TestPagination(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TwentyFiveChargesUnderOneKeyComeInPagesOf10And10And5", func(t *testing.T) {
		t.Parallel()
		sim, client, url := newSim(t, Config{IgnoreIdempotencyKeys: true}, 0)
		for i := range 25 {
			if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
				t.Fatal(err)
			}
			if i%5 == 0 {
				// Other keys in between: the filter applies before paging.
				if _, err := client.CreateCharge(ctx, visa(1000), "k2"); err != nil {
					t.Fatal(err)
				}
			}
		}
		var want []string
		for _, ch := range sim.Charges() {
			if ch.IdempotencyKey == "k1" {
				want = append(want, ch.ID)
			}
		}

		var got []string
		var sizes []int
		var hasMore []bool
		after := ""
		for page := 0; page < 5; page++ {
			q := "?idempotency_key=k1"
			if after != "" {
				q += "&starting_after=" + after
			}
			status, list, body := getList[processor.Charge](t, url+PathCharges+q)
			if status != http.StatusOK {
				t.Fatalf("page %d: %d %s", page, status, body)
			}
			got = append(got, chargeIDs(list.Data)...)
			sizes, hasMore = append(sizes, len(list.Data)), append(hasMore, list.HasMore)
			if !list.HasMore {
				break
			}
			after = list.Data[len(list.Data)-1].ID
		}
		if diff := cmp.Diff([]int{10, 10, 5}, sizes); diff != "" {
			t.Errorf("page sizes (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]bool{true, true, false}, hasMore); diff != "" {
			t.Errorf("has_more (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("charges listed, in order (-recorded +listed):\n%s", diff)
		}
	})

	t.Run("LimitAndAnExactLastPage", func(t *testing.T) {
		t.Parallel()
		sim, client, url := newSim(t, Config{}, 0)
		for i := range 4 {
			if _, err := client.CreateCharge(ctx, visa(1000), fmt.Sprint("k", i)); err != nil {
				t.Fatal(err)
			}
		}
		ids := chargeIDs(sim.Charges())
		_, first, _ := getList[processor.Charge](t, url+PathCharges+"?limit=2")
		_, second, _ := getList[processor.Charge](t, url+PathCharges+"?limit=2&starting_after="+ids[1])
		_, all, _ := getList[processor.Charge](t, url+PathCharges+"?limit=100")
		if diff := cmp.Diff(
			fmt.Sprint(ids[:2], true, ids[2:], false, ids, false),
			fmt.Sprint(chargeIDs(first.Data), first.HasMore, chargeIDs(second.Data), second.HasMore, chargeIDs(all.Data), all.HasMore),
		); diff != "" {
			t.Errorf("pages (-want +got):\n%s", diff)
		}
	})

	t.Run("CursorMayNameAnItemTheFilterLeavesOut", func(t *testing.T) {
		t.Parallel()
		sim, client, url := newSim(t, Config{}, 0)
		for _, key := range []string{"a1", "b", "a2"} {
			req := visa(1000)
			req.Metadata = map[string]string{"group": key[:1]}
			if _, err := client.CreateCharge(ctx, req, key); err != nil {
				t.Fatal(err)
			}
		}
		ids := chargeIDs(sim.Charges())
		_, list, body := getList[processor.Charge](t, url+PathCharges+"?metadata_key=group&metadata_value=a&starting_after="+ids[1])
		if diff := cmp.Diff([]string{ids[2]}, chargeIDs(list.Data)); diff != "" {
			t.Errorf("page after the filtered-out charge (-want +got):\n%s\n%s", diff, body)
		}
	})

	t.Run("RefundsPageByCharge", func(t *testing.T) {
		t.Parallel()
		sim, client, url := newSim(t, Config{}, 0)
		a, err := client.CreateCharge(ctx, visa(1000), "charge-a")
		if err != nil {
			t.Fatal(err)
		}
		b, err := client.CreateCharge(ctx, visa(1000), "charge-b")
		if err != nil {
			t.Fatal(err)
		}
		for i, ch := range []string{a.ID, b.ID, a.ID, b.ID, a.ID} {
			if _, err := client.Refund(ctx, processor.RefundRequest{Charge: ch, Amount: 100}, fmt.Sprint("refund-", i)); err != nil {
				t.Fatal(err)
			}
		}
		var ofA []string
		for _, re := range sim.Refunds() {
			if re.Charge == a.ID {
				ofA = append(ofA, re.ID)
			}
		}
		_, first, _ := getList[processor.Refund](t, url+PathRefunds+"?limit=2&charge="+a.ID)
		_, second, _ := getList[processor.Refund](t, url+PathRefunds+"?limit=2&charge="+a.ID+"&starting_after="+first.Data[1].ID)
		var got []string
		for _, re := range append(first.Data, second.Data...) {
			got = append(got, re.ID)
		}
		if diff := cmp.Diff(fmt.Sprint(ofA, true, false), fmt.Sprint(got, first.HasMore, second.HasMore)); diff != "" {
			t.Errorf("refunds of a, paged (-want +got):\n%s", diff)
		}
	})

	t.Run("BadLimitOrUnknownCursorIsRejected", func(t *testing.T) {
		t.Parallel()
		sim, client, url := newSim(t, Config{}, 0)
		if _, err := client.CreateCharge(ctx, visa(1000), "k1"); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			query, code, param string
		}{
			{PathCharges + "?limit=0", simproc.CodeParameterInvalid, "limit"},
			{PathCharges + "?limit=101", simproc.CodeParameterInvalid, "limit"},
			{PathCharges + "?limit=-1", simproc.CodeParameterInvalid, "limit"},
			{PathCharges + "?limit=ten", simproc.CodeParameterInvalid, "limit"},
			{PathCharges + "?limit=", simproc.CodeParameterInvalid, "limit"},
			{PathCharges + "?starting_after=ch_unknown", processor.CodeResourceMissing, "starting_after"},
			{PathRefunds + "?limit=101", simproc.CodeParameterInvalid, "limit"},
			{PathRefunds + "?starting_after=re_unknown", processor.CodeResourceMissing, "starting_after"},
		}
		for _, tt := range tests {
			status, _, body := getList[processor.Charge](t, url+tt.query)
			got := apiError(t, body)
			if diff := cmp.Diff(
				fmt.Sprint(400, simproc.ErrorTypeInvalidRequest, tt.code, tt.param),
				fmt.Sprint(status, got.Type, got.Code, got.Param),
			); diff != "" {
				t.Errorf("GET %s (-want +got):\n%s", tt.query, diff)
			}
		}
		if got := len(sim.Calls()); got != 1+len(tests) {
			t.Errorf("calls = %d, want every list call recorded", got)
		}
	})
}

func TestFaultValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body string
		want int
	}{
		{`{"path":"/v1/charges","kind":"late_execution","latency_ms":30000}`, http.StatusNoContent},
		{`{"path":"/v1/charges","kind":"late_execution","latency_ms":30001}`, http.StatusBadRequest},
		{`{"path":"/v1/charges","kind":"latency","latency_ms":30001}`, http.StatusBadRequest},
		{`{"path":"/v1/charges","kind":"latency","latency_ms":9223372036854775}`, http.StatusBadRequest},
		{`{"path":"/v1/charges","kind":"late_execution","latency_ms":-1}`, http.StatusBadRequest},
		{`{"path":"/v1/refunds","kind":"status","status":503}`, http.StatusNoContent},
		{`{"path":"/v1/refunds","kind":"status","status":429,"retry_after_ms":2500}`, http.StatusNoContent},
		{`{"path":"/v1/refunds","kind":"status","status":429,"retry_after_ms":-1}`, http.StatusBadRequest},
		{`{"path":"/v1/refunds","kind":"status","status":503,"retry_after_ms":1000}`, http.StatusBadRequest},
		{`{"path":"/v1/refunds","kind":"status","status":418}`, http.StatusBadRequest},
		{`{"path":"/v1/refunds","kind":"status","status":200}`, http.StatusBadRequest},
		{`{"path":"/v1/refunds","kind":"status"}`, http.StatusBadRequest},
		{`{"path":"/v1/refunds","kind":"server_error","status":503}`, http.StatusBadRequest},
	}
	sim, _, url := newSim(t, Config{}, 0)
	for _, tt := range tests {
		resp, err := http.Post(url+"/_sim/faults", "application/json", strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("POST /_sim/faults %s: %d %s, want %d", tt.body, resp.StatusCode, b, tt.want)
		}
		if resp.StatusCode == http.StatusBadRequest && !strings.Contains(string(b), `late_execution`) {
			t.Errorf("rejection %s does not list the kinds", b)
		}
	}
	for _, body := range []string{`{"latency_ms":30001}`, `{"latency_ms":-1}`} {
		resp, err := http.Post(url+"/_sim/mode", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST /_sim/mode %s: %d, want 400", body, resp.StatusCode)
		}
	}

	t.Run("InjectFaultPanicsOnWhatTheEndpointRejects", func(t *testing.T) {
		defer func() {
			if recover() == nil {
				t.Error("InjectFault of a late_execution above MaxExecution did not panic")
			}
		}()
		sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLateExecution, Latency: MaxExecution + 1})
	})
}

func TestIdleEndpoint(t *testing.T) {
	t.Parallel()
	hc, cfg := newHoldControl(Config{})
	sim, _, url := newSim(t, cfg, 0)
	sim.InjectFault(Fault{Path: PathCharges, Kind: FaultLateExecution, Latency: time.Second})
	ctx, hangUp := context.WithCancel(context.Background())
	first := postAsync(ctx, url+PathCharges, "k1", chargeBody(1000))
	hc.waitHeld(t)
	hangUp()
	<-first

	idle := make(chan int, 1)
	go func() {
		resp, err := http.Get(url + "/_sim/idle")
		if err != nil {
			idle <- 0
			return
		}
		resp.Body.Close()
		idle <- resp.StatusCode
	}()
	hc.releaseOne(t)
	if got := <-idle; got != http.StatusNoContent {
		t.Fatalf("GET /_sim/idle = %d, want 204", got)
	}
	if got := len(sim.Charges()); got != 1 {
		t.Errorf("charges once idle = %d, want the late one", got)
	}
}
