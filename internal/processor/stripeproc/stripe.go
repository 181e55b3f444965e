package stripeproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/idemref/payments/internal/processor"
)

// DefaultURL is Stripe's API.
const DefaultURL = "https://api.stripe.com"

// DefaultSearchLag is how long Stripe documents its Search API may take to
// show a new object: "under normal operating conditions, data is
// searchable in less than a minute".
const DefaultSearchLag = time.Minute

// MetadataKey is the metadata field of a PaymentIntent or Refund that
// holds the derived key it was made under: what a lookup searches for.
const MetadataKey = "idempotency_key"

// Operations, as processor_calls_total counts them.
const (
	opCharge   = "POST /v1/payment_intents"
	opCancel   = "POST /v1/payment_intents/{id}/cancel"
	opSearch   = "GET /v1/payment_intents/search"
	opRefund   = "POST /v1/refunds"
	opRefunds  = "GET /v1/refunds"
	pageSize   = 100
	maxObjects = 100 * 1000 // a bound on one lookup, as the simulator's client pages at most 1000 times
)

func init() { processor.InitCallMetrics(opCharge, opCancel, opSearch, opRefund, opRefunds) }

// Config configures an Adapter.
type Config struct {
	// APIKey is the secret key (sk_test_..., sk_live_..., or a restricted
	// rk_ key allowed to write PaymentIntents and Refunds).
	APIKey string
	// URL is the API's base URL; "" is DefaultURL. Tests point it at
	// stripe-mock or at recorded answers.
	URL string
	// Timeout bounds one call; zero or less is processor.DefaultTimeout.
	Timeout time.Duration
	// SearchLag is how long the Search API may not show a new
	// PaymentIntent; zero is DefaultSearchLag. The adapter's LookupLag.
	SearchLag time.Duration
	// Transport carries the requests (nil: http.DefaultTransport).
	Transport http.RoundTripper
}

// Adapter is processor.Processor for Stripe. It is safe for concurrent use.
type Adapter struct {
	sc  *stripe.Client
	lag time.Duration
}

var _ processor.Processor = (*Adapter)(nil)

// New returns the Stripe adapter for cfg.
func New(cfg Config) *Adapter {
	if cfg.URL == "" {
		cfg.URL = DefaultURL
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = processor.DefaultTimeout
	}
	if cfg.SearchLag <= 0 {
		cfg.SearchLag = DefaultSearchLag
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		HTTPClient: &http.Client{Timeout: cfg.Timeout, Transport: recorder{noResend{cfg.Transport}}},
		// The payment machine owns retries (S1, S6): stripe-go's own would
		// hide an answer from the classification and resend on its own.
		MaxNetworkRetries: stripe.Int64(0),
		URL:               stripe.String(strings.TrimRight(cfg.URL, "/")),
		// Answers are classified and logged by the payment machine.
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := stripe.NewClient(cfg.APIKey, stripe.WithBackends(&stripe.Backends{API: backend}))
	return &Adapter{sc: sc, lag: cfg.SearchLag}
}

// LookupLag is the Search API's lag: see the package documentation.
func (a *Adapter) LookupLag() time.Duration { return a.lag }

// CreateCharge creates and confirms a PaymentIntent: the card is charged
// in this one call, or declined (402), under idempotencyKey, which also
// goes into the metadata for ChargesByIdempotencyKey.
func (a *Adapter) CreateCharge(ctx context.Context, req processor.ChargeRequest, idempotencyKey string) (processor.Charge, error) {
	if idempotencyKey == "" {
		return processor.Charge{}, fmt.Errorf("stripe: %s: an idempotency key is required", opCharge)
	}
	metadata := map[string]string{MetadataKey: idempotencyKey}
	for k, v := range req.Metadata {
		metadata[k] = v
	}
	params := &stripe.PaymentIntentCreateParams{
		Amount:        stripe.Int64(req.Amount),
		Currency:      stripe.String(strings.ToLower(req.Currency)),
		PaymentMethod: stripe.String(req.PaymentMethod),
		// Card only, confirmed now, without the customer present: a card
		// that needs authentication is declined (authentication_required)
		// instead of waiting in requires_action for a customer who is not
		// there, and error_on_requires_action says so for any other
		// action. Captured at once, explicitly: requires_capture would
		// wait for a capture nobody sends. See "PaymentIntents that stop"
		// in the package documentation.
		PaymentMethodTypes:    []*string{stripe.String("card")},
		Confirm:               stripe.Bool(true),
		OffSession:            stripe.Bool(true),
		ErrorOnRequiresAction: stripe.Bool(true),
		CaptureMethod:         stripe.String(string(stripe.PaymentIntentCaptureMethodAutomatic)),
		Metadata:              metadata,
	}
	params.SetIdempotencyKey(idempotencyKey)
	ctx, ans := withAnswer(ctx)
	pi, err := a.sc.V1PaymentIntents.Create(ctx, params)
	var ch processor.Charge
	if err == nil {
		ch, err = a.ended(ctx, pi)
		switch {
		case err != nil:
		case ch.Status == processor.StatusFailed:
			// Confirmed but declined, answered 200 (Stripe answers 402 as a
			// rule): a decline all the same.
			err = &processor.DeclineError{Code: processor.CodeCardDeclined, DeclineCode: ch.DeclineCode, ChargeID: ch.ID}
		case ch.Status != processor.StatusSucceeded:
			// Processing: it landed, without an outcome yet. Not final;
			// the lookup tells once Stripe decided.
			err = fmt.Errorf("payment intent %s is %s", ch.ID, pi.Status)
		}
	}
	err = classified(opCharge, ans, err)
	processor.CountCall(opCharge, err)
	return ch, err
}

// Refund refunds req.Amount (everything left when zero) of the
// PaymentIntent req.Charge, under idempotencyKey, which also goes into the
// refund's metadata for RefundsByCharge.
func (a *Adapter) Refund(ctx context.Context, req processor.RefundRequest, idempotencyKey string) (processor.Refund, error) {
	if idempotencyKey == "" {
		return processor.Refund{}, fmt.Errorf("stripe: %s: an idempotency key is required", opRefund)
	}
	params := &stripe.RefundCreateParams{
		PaymentIntent: stripe.String(req.Charge),
		Metadata:      map[string]string{MetadataKey: idempotencyKey},
	}
	if req.Amount > 0 {
		params.Amount = stripe.Int64(req.Amount)
	}
	params.SetIdempotencyKey(idempotencyKey)
	ctx, ans := withAnswer(ctx)
	r, err := a.sc.V1Refunds.Create(ctx, params)
	var re processor.Refund
	if err == nil {
		re, err = refundOf(r, req.Charge)
	}
	err = classified(opRefund, ans, err)
	processor.CountCall(opRefund, err)
	return re, err
}

// ChargesByIdempotencyKey searches the PaymentIntents whose metadata holds
// key, every page, oldest first. The search lags (LookupLag): an empty
// answer is "none yet". A PaymentIntent still processing is an
// *UnsettledError: it landed, but has no outcome to act on yet. One that
// stopped waiting for an action is canceled first (ended): a decline.
func (a *Adapter) ChargesByIdempotencyKey(ctx context.Context, key string) (_ []processor.Charge, err error) {
	defer func() { processor.CountCall(opSearch, err) }()
	params := &stripe.PaymentIntentSearchParams{}
	params.Query = fmt.Sprintf("metadata['%s']:'%s'", MetadataKey, quote(key))
	params.Limit = stripe.Int64(pageSize)
	// The Charge the PaymentIntent made, for what of it was refunded.
	params.AddExpand("data.latest_charge")
	ctx, ans := withAnswer(ctx)
	var charges []processor.Charge
	for pi, err := range a.sc.V1PaymentIntents.Search(ctx, params) {
		if err != nil {
			return nil, classified(opSearch, ans, err)
		}
		if pi.Metadata[MetadataKey] != key {
			// A search is a query language, not an equality: keep only
			// exact matches.
			continue
		}
		ch, err := a.ended(ctx, pi)
		if err != nil {
			return nil, classified(opSearch, ans, err)
		}
		if len(charges) == maxObjects {
			return nil, &processor.UnsettledError{Class: processor.ClassNotExecuted, Op: opSearch, Err: fmt.Errorf("more than %d payment intents", maxObjects)}
		}
		charges = append(charges, ch)
	}
	for _, ch := range charges {
		if ch.Status != processor.StatusSucceeded && ch.Status != processor.StatusFailed {
			// Landed, outcome not decided: neither "succeeded" nor
			// "declined" may be read into it, nor "nothing".
			return nil, &processor.UnsettledError{Class: processor.ClassOutcomeUnknown, Op: opSearch, Status: http.StatusOK,
				Err: fmt.Errorf("payment intent %s is %s", ch.ID, ch.Status)}
		}
	}
	sortOldestFirst(charges, func(c processor.Charge) (int64, string) { return c.Created, c.ID })
	return charges, nil
}

// RefundsByCharge lists the refunds of the PaymentIntent chargeID, every
// page, oldest first, each with the key from its metadata.
func (a *Adapter) RefundsByCharge(ctx context.Context, chargeID string) (_ []processor.Refund, err error) {
	defer func() { processor.CountCall(opRefunds, err) }()
	params := &stripe.RefundListParams{PaymentIntent: stripe.String(chargeID)}
	params.Limit = stripe.Int64(pageSize)
	ctx, ans := withAnswer(ctx)
	var refunds []processor.Refund
	for r, err := range a.sc.V1Refunds.List(ctx, params) {
		if err != nil {
			return nil, classified(opRefunds, ans, err)
		}
		re, err := refundOf(r, chargeID)
		if err != nil {
			return nil, classified(opRefunds, ans, err)
		}
		if len(refunds) == maxObjects {
			return nil, &processor.UnsettledError{Class: processor.ClassNotExecuted, Op: opRefunds, Err: fmt.Errorf("more than %d refunds", maxObjects)}
		}
		refunds = append(refunds, re)
	}
	sortOldestFirst(refunds, func(r processor.Refund) (int64, string) { return r.Created, r.ID })
	return refunds, nil
}

// chargeOf maps a PaymentIntent onto a charge. Its status is succeeded,
// failed (requires_payment_method or canceled: no money moved) or, for
// every state still in motion, processor.StatusPending. An object without
// an id or an amount says nothing about the money: errIncomplete.
func chargeOf(pi *stripe.PaymentIntent) (processor.Charge, error) {
	if pi == nil || pi.ID == "" || pi.Amount <= 0 {
		return processor.Charge{}, errIncomplete
	}
	ch := processor.Charge{
		ID: pi.ID, Object: "charge", Amount: pi.Amount, Currency: strings.ToUpper(string(pi.Currency)),
		Metadata: pi.Metadata, IdempotencyKey: pi.Metadata[MetadataKey], Created: pi.Created,
	}
	if pi.PaymentMethod != nil {
		ch.PaymentMethod = pi.PaymentMethod.ID
	}
	if pi.LatestCharge != nil {
		ch.RefundedAmount = pi.LatestCharge.AmountRefunded
	}
	switch pi.Status {
	case stripe.PaymentIntentStatusSucceeded:
		ch.Status = processor.StatusSucceeded
	case stripe.PaymentIntentStatusRequiresPaymentMethod, stripe.PaymentIntentStatusCanceled:
		ch.Status = processor.StatusFailed
		if e := pi.LastPaymentError; e != nil {
			ch.DeclineCode = string(e.DeclineCode)
			if ch.DeclineCode == "" {
				ch.DeclineCode = string(e.Code)
			}
		}
		if ch.DeclineCode == "" {
			// Canceled with no payment error: why it was canceled
			// ("abandoned" when it stopped, see ended).
			ch.DeclineCode = string(pi.CancellationReason)
		}
	case "":
		return processor.Charge{}, errIncomplete
	default:
		ch.Status = processor.StatusPending
	}
	return ch, nil
}

// stopped are the PaymentIntent states that wait for an action nobody
// here takes: the customer is not there to authenticate
// (requires_action), capture is automatic (requires_capture), the confirm
// was sent with the create (requires_confirmation). Left alone, such a
// PaymentIntent reads as pending for ever.
var stopped = []stripe.PaymentIntentStatus{
	stripe.PaymentIntentStatusRequiresAction,
	stripe.PaymentIntentStatusRequiresCapture,
	stripe.PaymentIntentStatusRequiresConfirmation,
}

// ended maps pi onto a charge as chargeOf does, after canceling it when
// it stopped: no money moved, and canceled it is a decline, final. A
// cancel without a 2xx leaves it as it was, an error that reads as an
// unknown outcome: the next lookup finds it and cancels again.
func (a *Adapter) ended(ctx context.Context, pi *stripe.PaymentIntent) (processor.Charge, error) {
	if pi == nil || !slices.Contains(stopped, pi.Status) {
		return chargeOf(pi)
	}
	params := &stripe.PaymentIntentCancelParams{CancellationReason: stripe.String(string(stripe.PaymentIntentCancellationReasonAbandoned))}
	cctx, ans := withAnswer(ctx)
	canceled, err := a.sc.V1PaymentIntents.Cancel(cctx, pi.ID, params)
	err = classified(opCancel, ans, err)
	processor.CountCall(opCancel, err)
	if err != nil {
		// Its text only: the cancel's class (a refused key, say) is not
		// the call's, and it was counted as the cancel's.
		return processor.Charge{}, errors.New("payment intent " + pi.ID + " stopped at " + string(pi.Status) + ", and its cancel failed: " + err.Error())
	}
	return chargeOf(canceled)
}

// refundOf maps a Stripe refund; requires_action is pending (the money
// has not moved yet, and may still).
func refundOf(r *stripe.Refund, chargeID string) (processor.Refund, error) {
	if r == nil || r.ID == "" || r.Amount <= 0 || r.Status == "" {
		return processor.Refund{}, errIncomplete
	}
	re := processor.Refund{
		ID: r.ID, Object: "refund", Charge: chargeID, Amount: r.Amount,
		IdempotencyKey: r.Metadata[MetadataKey], Created: r.Created,
	}
	if r.PaymentIntent != nil && r.PaymentIntent.ID != "" {
		re.Charge = r.PaymentIntent.ID
	}
	switch r.Status {
	case stripe.RefundStatusSucceeded:
		re.Status = processor.StatusSucceeded
	case stripe.RefundStatusFailed:
		re.Status = processor.StatusFailed
	case stripe.RefundStatusCanceled:
		re.Status = processor.StatusCanceled
	default:
		re.Status = processor.StatusPending
	}
	return re, nil
}

// errIncomplete: a 2xx whose object names no id, amount or status.
var errIncomplete = errors.New("the answer names no complete object")

// quote escapes a value for a search query string.
func quote(s string) string {
	return strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s)
}

func sortOldestFirst[T any](items []T, key func(T) (int64, string)) {
	slices.SortStableFunc(items, func(a, b T) int {
		ca, ia := key(a)
		cb, ib := key(b)
		return cmp.Or(cmp.Compare(ca, cb), strings.Compare(ia, ib))
	})
}
