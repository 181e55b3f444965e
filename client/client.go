package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/client/api"
)

// ReplayedHeader marks a replayed answer.
const ReplayedHeader = "Idempotent-Replayed"

// Endpoints, as the server scopes keys (method plus route template); the
// key-status lookup takes them.
const (
	EndpointCreateOrder   = "POST /v1/orders"
	EndpointCreatePayment = "POST /v1/payments"
	EndpointCreateRefund  = "POST /v1/payments/{id}/refunds"
)

// Client calls the payments API with the retry policy of this package. It
// is safe for concurrent use; its retry budget is shared by all callers.
type Client struct {
	api    *api.Client
	policy Policy
	budget *Budget
	// prefer is the Prefer header of every keyed POST (nil: none).
	prefer *string
}

// Option configures a Client.
type Option func(*options)

type options struct {
	httpClient *http.Client
	policy     Policy
	budget     *Budget
	preferWait time.Duration
}

// WithHTTPClient sends through hc (default: a client with a 30 s timeout
// per attempt). Give each attempt a timeout shorter than the operation's
// context, so a hung connection still leaves time to retry.
func WithHTTPClient(hc *http.Client) Option { return func(o *options) { o.httpClient = hc } }

// WithPolicy sets the retry policy.
func WithPolicy(p Policy) Option { return func(o *options) { o.policy = p } }

// WithBudget sets the retry budget (default NewBudget(0, 0, 0)). Clients
// given the same Budget share it.
func WithBudget(b *Budget) Option { return func(o *options) { o.budget = b } }

// WithPreferWait asks the server, on every create (order, payment,
// refund), to wait up to d for the first attempt of its key when that
// attempt is still in flight, and to answer with its result (Prefer:
// wait=N, RFC 7240; the server caps N at its maximum, which GET
// /v1/idempotency states). Without it, such a duplicate is answered 409
// idempotency_key_in_use at once and the client's policy retries it after
// Retry-After; with it, one attempt usually gets the replay. d is sent in
// whole seconds, rounded down; less than a second sends nothing. Keep the
// attempt timeout (WithHTTPClient) above d, or the attempt gives up first.
func WithPreferWait(d time.Duration) Option { return func(o *options) { o.preferWait = d } }

// New returns a client for the API at baseURL (such as
// "http://localhost:8080") that authenticates with apiKey.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	o := options{httpClient: &http.Client{Timeout: defaultAttemptTimeout}}
	for _, opt := range opts {
		opt(&o)
	}
	if o.budget == nil {
		o.budget = NewBudget(0, 0, 0)
	}
	auth := func(_ context.Context, r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+apiKey)
		return nil
	}
	c, err := api.NewClient(baseURL, api.WithHTTPClient(o.httpClient), api.WithRequestEditorFn(auth))
	if err != nil {
		return nil, err
	}
	cl := &Client{api: c, policy: o.policy.withDefaults(), budget: o.budget}
	if n := int64(o.preferWait / time.Second); n > 0 {
		prefer := fmt.Sprintf("wait=%d", n)
		cl.prefer = &prefer
	}
	return cl, nil
}

const defaultAttemptTimeout = 30 * time.Second

// Result is a successful answer.
type Result[T any] struct {
	Value T
	// Key is the Idempotency-Key the operation used ("" for reads).
	Key string
	// Replayed is true when the server answered from its record of an
	// earlier attempt (Idempotent-Replayed: true): the operation had been
	// executed before, by this call's earlier attempt or by another call
	// with the same key.
	Replayed bool
	Status   int
	Header   http.Header
	Attempts int
}

// CreateOrder creates an order under key, or under a fresh key when key is
// "". Pass a key you persisted beforehand to be able to resume after a
// crash; the key used is in the Result or the error either way.
func (c *Client) CreateOrder(ctx context.Context, key string, req api.CreateOrderRequest) (Result[api.Order], error) {
	key = keyOrNew(key)
	return do[api.Order](c, ctx, EndpointCreateOrder, key, http.StatusCreated, func(ctx context.Context) (*http.Response, error) {
		return c.api.CreateOrder(ctx, &api.CreateOrderParams{IdempotencyKey: key, Prefer: c.prefer}, req)
	})
}

// CreatePayment pays an order under key (a fresh one when "").
func (c *Client) CreatePayment(ctx context.Context, key string, req api.CreatePaymentRequest) (Result[api.Payment], error) {
	key = keyOrNew(key)
	return do[api.Payment](c, ctx, EndpointCreatePayment, key, http.StatusCreated, func(ctx context.Context) (*http.Response, error) {
		return c.api.CreatePayment(ctx, &api.CreatePaymentParams{IdempotencyKey: key, Prefer: c.prefer}, req)
	})
}

// CreateRefund refunds part of a payment under key (a fresh one when "").
func (c *Client) CreateRefund(ctx context.Context, key string, paymentID uuid.UUID, req api.CreateRefundRequest) (Result[api.Refund], error) {
	key = keyOrNew(key)
	return do[api.Refund](c, ctx, EndpointCreateRefund, key, http.StatusCreated, func(ctx context.Context) (*http.Response, error) {
		return c.api.CreateRefund(ctx, paymentID, &api.CreateRefundParams{IdempotencyKey: key, Prefer: c.prefer}, req)
	})
}

// GetOrder reads an order. Reads are retried like writes; they need no key.
func (c *Client) GetOrder(ctx context.Context, id uuid.UUID) (Result[api.Order], error) {
	return do[api.Order](c, ctx, "GET /v1/orders/{id}", "", http.StatusOK, func(ctx context.Context) (*http.Response, error) {
		return c.api.GetOrder(ctx, id)
	})
}

// ListOrders reads one page of orders.
func (c *Client) ListOrders(ctx context.Context, params api.ListOrdersParams) (Result[api.OrderList], error) {
	return do[api.OrderList](c, ctx, "GET /v1/orders", "", http.StatusOK, func(ctx context.Context) (*http.Response, error) {
		return c.api.ListOrders(ctx, &params)
	})
}

// GetPayment reads a payment.
func (c *Client) GetPayment(ctx context.Context, id uuid.UUID) (Result[api.Payment], error) {
	return do[api.Payment](c, ctx, "GET /v1/payments/{id}", "", http.StatusOK, func(ctx context.Context) (*http.Response, error) {
		return c.api.GetPayment(ctx, id)
	})
}

// ListPayments reads one page of payments, newest first (params.OrderId:
// only that order's).
func (c *Client) ListPayments(ctx context.Context, params api.ListPaymentsParams) (Result[api.PaymentList], error) {
	return do[api.PaymentList](c, ctx, "GET /v1/payments", "", http.StatusOK, func(ctx context.Context) (*http.Response, error) {
		return c.api.ListPayments(ctx, &params)
	})
}

// GetRefund reads one refund of a payment (where a refund's Location
// points).
func (c *Client) GetRefund(ctx context.Context, paymentID, refundID uuid.UUID) (Result[api.Refund], error) {
	return do[api.Refund](c, ctx, "GET /v1/payments/{id}/refunds/{refund_id}", "", http.StatusOK, func(ctx context.Context) (*http.Response, error) {
		return c.api.GetRefund(ctx, paymentID, refundID)
	})
}

// PutCustomer creates or replaces the customer id, chosen by the caller
// (the client-supplied-id alternative to keys: no Idempotency-Key). Mint
// the id once, store it, and send it on every retry: a retry of a PUT that
// went through answers 200 instead of 201 with the same customer.
func (c *Client) PutCustomer(ctx context.Context, id uuid.UUID, req api.PutCustomerRequest) (Result[api.Customer], error) {
	return do[api.Customer](c, ctx, "PUT /v1/customers/{id}", "", http.StatusOK, func(ctx context.Context) (*http.Response, error) {
		return c.api.PutCustomer(ctx, id.String(), req)
	})
}

// GetCustomer reads a customer.
func (c *Client) GetCustomer(ctx context.Context, id uuid.UUID) (Result[api.Customer], error) {
	return do[api.Customer](c, ctx, "GET /v1/customers/{id}", "", http.StatusOK, func(ctx context.Context) (*http.Response, error) {
		return c.api.GetCustomer(ctx, id.String())
	})
}

// UpdateOrder changes an order's description or metadata if it is still
// the version etag names (from GetOrder's Result.Header.Get("ETag"): the
// conditional-update alternative to keys). A retry after a lost answer
// may get a 412 precondition_failed for a change that did apply: on a 412,
// read the order again and compare before deciding anything.
func (c *Client) UpdateOrder(ctx context.Context, id uuid.UUID, etag string, req api.UpdateOrderRequest) (Result[api.Order], error) {
	return do[api.Order](c, ctx, "PATCH /v1/orders/{id}", "", http.StatusOK, func(ctx context.Context) (*http.Response, error) {
		return c.api.UpdateOrder(ctx, id, &api.UpdateOrderParams{IfMatch: etag}, req)
	})
}

// ErrKeyUnknown is what Resolve returns when no attempt of the operation
// committed and none can any more: the server had no record of the key
// when asked once its commit window had passed since the last attempt was
// sent (or the record is past its retention). Sending the request again
// with the same key runs it.
var ErrKeyUnknown = errors.New("the server has no record of this Idempotency-Key")

// defaultCommitWindow is the commit window taken when the server's 404
// does not state one.
const defaultCommitWindow = time.Minute

// KeyStatus asks what became of key on endpoint (one of the Endpoint
// constants): in progress or completed, the recorded status, the resource
// it created, and until when its result is replayed. Pass key as the
// operation sent it (an sf-string such as "\"q-1\"" names the key q-1,
// as in the header); any key of visible ASCII characters is found.
//
// No record of the key is a *NotRecordedError (ErrKeyNotYetRecorded),
// never ErrKeyUnknown: a request under the key may still be running, and
// KeyStatus does not know when the key's last request was sent. Resolve
// does, and waits the window out.
func (c *Client) KeyStatus(ctx context.Context, key, endpoint string) (api.IdempotencyKeyStatus, error) {
	res, err := do[api.IdempotencyKeyStatus](c, ctx, "GET /v1/idempotency-keys/{key}", "", http.StatusOK, func(ctx context.Context) (*http.Response, error) {
		return c.api.GetIdempotencyKey(ctx, pathKey(key), &api.GetIdempotencyKeyParams{Endpoint: api.GetIdempotencyKeyParamsEndpoint(endpoint)})
	})
	var notFound *Error
	if errors.As(err, &notFound) && notFound.Code() == "not_found" {
		window := defaultCommitWindow
		if s := notFound.Problem.CommitWindowSeconds; s != nil && *s > 0 {
			window = time.Duration(*s) * time.Second
		}
		return api.IdempotencyKeyStatus{}, &NotRecordedError{Key: key, Endpoint: endpoint, Window: window}
	}
	return res.Value, err
}

// pathKey is key as the {key} path segment carries it. The server reads
// the segment, once percent-decoded, exactly like the Idempotency-Key
// header (bare, or an sf-string in quotes), so the key goes as it went in
// the header and the generated code percent-encodes it. The exceptions are
// "." and "..": they stay unencoded and URL resolution removes them as dot
// segments, so they go as the sf-string that names the same key.
func pathKey(key string) string {
	if key == "." || key == ".." {
		return `"` + key + `"`
	}
	return key
}

// Resolve looks up what became of the operation behind an
// *OutcomeUnknownError: state "completed" with a response_status and
// resource when an attempt went through, "in_progress" while a payment's
// or refund's attempt still runs, or ErrKeyUnknown when none committed
// and none can any more.
//
// A request still running has no record on the server until it commits,
// which it can do until the server's commit window (its request timeout
// plus a lock wait) has passed since it was sent. So when the server has
// no record and that window has not passed since unknown.LastSent, Resolve
// waits until it has and asks again. When ctx ends before that, it
// returns a *NotRecordedError (ErrKeyNotYetRecorded) saying when to ask
// again; sending the same request again with the same key is the other
// way on, and safe. Give ctx a deadline to bound the wait.
func (c *Client) Resolve(ctx context.Context, unknown *OutcomeUnknownError) (api.IdempotencyKeyStatus, error) {
	if unknown == nil || unknown.Key == "" {
		return api.IdempotencyKeyStatus{}, errors.New("client: Resolve needs the error of a keyed operation")
	}
	sent := unknown.LastSent
	if sent.IsZero() {
		// Not known: an attempt may have been sent just now.
		sent = time.Now()
	}
	for {
		asked := time.Now()
		st, err := c.KeyStatus(ctx, unknown.Key, unknown.Endpoint)
		var notYet *NotRecordedError
		if !errors.As(err, &notYet) {
			return st, err
		}
		notYet.FinalAt = sent.Add(notYet.Window)
		if !asked.Before(notYet.FinalAt) {
			// Asked after the window: every attempt sent before it has
			// committed by then or never will.
			return api.IdempotencyKeyStatus{}, ErrKeyUnknown
		}
		wait := time.Until(notYet.FinalAt)
		if !fitsDeadline(ctx, wait) {
			return api.IdempotencyKeyStatus{}, notYet
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return api.IdempotencyKeyStatus{}, notYet
		case <-t.C:
		}
	}
}

func keyOrNew(key string) string {
	if key == "" {
		return NewKey()
	}
	return key
}

// do runs one operation and decodes its final answer: want (the
// operation's success status) into a T, anything else into an *Error.
func do[T any](c *Client, ctx context.Context, endpoint, key string, want int, send func(context.Context) (*http.Response, error)) (Result[T], error) {
	a, attempts, err := c.run(ctx, endpoint, key, send)
	if err != nil {
		return Result[T]{Key: key, Attempts: attempts}, err
	}
	replayed := a.header.Get(ReplayedHeader) == "true"
	if a.status != want && (a.status < 200 || a.status > 299) {
		return Result[T]{Key: key, Attempts: attempts}, &Error{
			Status: a.status, Problem: decodeProblem(a), Key: key,
			Replayed: replayed, Attempts: attempts, Header: a.header,
		}
	}
	res := Result[T]{Key: key, Replayed: replayed, Status: a.status, Header: a.header, Attempts: attempts}
	if err := json.Unmarshal(a.body, &res.Value); err != nil {
		return res, fmt.Errorf("payments API: decode the %d answer of %s: %w", a.status, endpoint, err)
	}
	return res, nil
}
