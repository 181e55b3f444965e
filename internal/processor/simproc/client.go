package simproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/webhook"
)

func init() {
	// Every operation and class starts at zero, so a rate or increase over
	// them sees the first call of each.
	processor.InitCallMetrics("POST /v1/charges", "POST /v1/refunds", "GET /v1/charges", "GET /v1/refunds")
}

// maxResponseBytes bounds what the client reads from one response, so a
// misbehaving processor cannot exhaust memory.
const maxResponseBytes = 1 << 20

// Client calls the processor's HTTP API. It is safe for concurrent use.
type Client struct {
	baseURL string
	http    *http.Client
}

// NewClient returns a client for the processor at baseURL (for example
// http://127.0.0.1:8090). timeout bounds each call, connection and
// response body included; zero or less means DefaultTimeout.
func NewClient(baseURL string, timeout time.Duration) *Client {
	return NewClientWithTransport(baseURL, timeout, nil)
}

// NewClientWithTransport is NewClient with the HTTP transport given (nil:
// http.DefaultTransport): a proxy, a fault injector, or a test's schedule.
// Its requests are traced (tracing.go).
func NewClientWithTransport(baseURL string, timeout time.Duration, transport http.RoundTripper) *Client {
	if timeout <= 0 {
		timeout = processor.DefaultTimeout
	}
	return &Client{
		baseURL: strings.TrimRight(baseURL, "/"),
		http:    &http.Client{Timeout: timeout, Transport: clientSpans{transport}},
	}
}

// The simulator's client is an adapter.
var _ processor.Processor = (*Client)(nil)

// LookupLag is zero: the simulator's lists read what it wrote.
func (c *Client) LookupLag() time.Duration { return 0 }

// VerifyWebhook checks the simulator's signature (webhook.Header, or
// Standard Webhooks when v says so) and decodes its event, which is
// already in package processor's vocabulary.
func (c *Client) VerifyWebhook(payload []byte, h http.Header, v webhook.Verifier) (processor.Event, error) {
	if err := v.Verify(payload, h, webhook.Header, time.Now()); err != nil {
		return processor.Event{}, err
	}
	// Lenient decoding: the processor may add fields to its events.
	var ev processor.Event
	if err := json.Unmarshal(payload, &ev); err != nil {
		return processor.Event{}, fmt.Errorf("%w: %w", processor.ErrBadEvent, err)
	}
	if ev.ID == "" || ev.Type == "" {
		return processor.Event{}, fmt.Errorf("%w: an event needs an id and a type", processor.ErrBadEvent)
	}
	return ev, nil
}

// CreateCharge charges req.Amount to req.PaymentMethod. idempotencyKey must
// be the same on every retry of one logical charge, so the
// processor executes it at most once.
func (c *Client) CreateCharge(ctx context.Context, req processor.ChargeRequest, idempotencyKey string) (processor.Charge, error) {
	ctx, span := startCall(ctx, spanCharge, idempotencyKey)
	var ch processor.Charge
	err := c.post(ctx, "/v1/charges", req, idempotencyKey, &ch)
	endCall(span, err)
	return ch, err
}

// Refund refunds req.Amount (or everything still refundable when zero) of
// req.Charge. The idempotency rules are those of CreateCharge.
func (c *Client) Refund(ctx context.Context, req processor.RefundRequest, idempotencyKey string) (processor.Refund, error) {
	ctx, span := startCall(ctx, spanRefund, idempotencyKey)
	var re processor.Refund
	err := c.post(ctx, "/v1/refunds", req, idempotencyKey, &re)
	endCall(span, err)
	return re, err
}

// ChargesByIdempotencyKey lists every charge created by a call that carried
// key, oldest first, reading every page. After an unsettled answer it tells
// whether the charge exists; against a processor that ignores keys
// more than one charge means a double charge to
// compensate.
func (c *Client) ChargesByIdempotencyKey(ctx context.Context, key string) (_ []processor.Charge, err error) {
	ctx, span := startCall(ctx, spanChargesByKey, key)
	defer func() { endCall(span, err) }()
	return listAll(ctx, c, "/v1/charges", url.Values{"idempotency_key": {key}}, func(ch processor.Charge) string { return ch.ID })
}

// ChargesByMetadata lists every charge whose metadata maps key to value,
// oldest first, reading every page. It finds charges when the idempotency
// key is not known, for example by the payment id the API put in the
// metadata.
func (c *Client) ChargesByMetadata(ctx context.Context, key, value string) (_ []processor.Charge, err error) {
	ctx, span := startCall(ctx, spanChargesByMetadata, "")
	defer func() { endCall(span, err) }()
	return listAll(ctx, c, "/v1/charges", url.Values{"metadata_key": {key}, "metadata_value": {value}}, func(ch processor.Charge) string { return ch.ID })
}

// RefundsByCharge lists the refunds of one charge, oldest first, reading
// every page.
func (c *Client) RefundsByCharge(ctx context.Context, chargeID string) (_ []processor.Refund, err error) {
	ctx, span := startCall(ctx, spanRefundsByCharge, "")
	defer func() { endCall(span, err) }()
	return listAll(ctx, c, "/v1/refunds", url.Values{"charge": {chargeID}}, func(re processor.Refund) string { return re.ID })
}

// maxListPages bounds one listing, so a processor that always says
// has_more cannot keep a caller paging forever.
const maxListPages = 1000

// listAll follows has_more/starting_after until the last page. A lookup
// that stopped at the first page would miss the late charge on the second
// and take "not found" for an answer.
func listAll[T any](ctx context.Context, c *Client, path string, q url.Values, id func(T) string) ([]T, error) {
	var all []T
	for range maxListPages {
		var page List[T]
		if err := c.get(ctx, path+"?"+q.Encode(), &page); err != nil {
			return nil, err
		}
		all = append(all, page.Data...)
		if !page.HasMore {
			return all, nil
		}
		if len(page.Data) == 0 {
			return nil, &processor.UnsettledError{Class: processor.ClassNotExecuted, Op: "GET " + path, Err: errors.New("has_more on an empty page")}
		}
		q.Set("starting_after", id(page.Data[len(page.Data)-1]))
	}
	return nil, &processor.UnsettledError{Class: processor.ClassNotExecuted, Op: "GET " + path, Err: fmt.Errorf("more than %d pages", maxListPages)}
}

func (c *Client) post(ctx context.Context, path string, body any, idempotencyKey string, out any) error {
	if idempotencyKey == "" {
		return fmt.Errorf("processor: POST %s: an idempotency key is required", path)
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("processor: POST %s: encode body: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(payload))
	if err != nil {
		return fmt.Errorf("processor: POST %s: %w", path, err)
	}
	// net/http silently resends a request that carries an Idempotency-Key
	// when a reused connection closes before the response. That would hide
	// a lost response from the caller and, against a processor that ignores
	// keys, charge twice. Without GetBody the transport cannot resend, so
	// the caller sees an unsettled answer and decides.
	req.GetBody = nil
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idempotencyKey)
	return c.do(req, "POST "+path, out)
}

func (c *Client) get(ctx context.Context, pathAndQuery string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL+pathAndQuery, nil)
	if err != nil {
		return fmt.Errorf("processor: GET %s: %w", pathAndQuery, err)
	}
	return c.do(req, "GET "+req.URL.Path, out)
}

// do sends req and classifies the answer; see the table in the
// package documentation. Only ClassFinal answers come back as nil,
// *DeclineError or *RequestError; everything else is an *UnsettledError.
func (c *Client) do(req *http.Request, op string, out any) error {
	err := c.roundTrip(req, op, out)
	processor.CountCall(op, err)
	return err
}

func (c *Client) roundTrip(req *http.Request, op string, out any) error {
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return &processor.UnsettledError{Class: processor.SendFailureClass(err), Op: op, Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		// The status line arrived but the body did not: for a 200 the charge
		// exists and we cannot read it.
		return &processor.UnsettledError{Class: processor.ClassOutcomeUnknown, Op: op, Status: resp.StatusCode, Err: fmt.Errorf("read response: %w", err)}
	}
	apiErr := APIError{}
	if resp.StatusCode >= 300 {
		apiErr = decodeError(body)
	}
	class, ours := classify(resp.StatusCode, apiErr)
	if ours {
		return processor.MisconfiguredError(op, resp.StatusCode)
	}
	if class != processor.ClassFinal {
		return &processor.UnsettledError{
			Class: class, Op: op, Status: resp.StatusCode,
			RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After")),
			Err:        errors.New(messageOf(apiErr)),
		}
	}
	switch {
	case resp.StatusCode < 300:
		if err := json.Unmarshal(body, out); err != nil {
			// Executed but unreadable; a lookup or a resend with the same
			// key tells what it was.
			return &processor.UnsettledError{Class: processor.ClassOutcomeUnknown, Op: op, Status: resp.StatusCode, Err: fmt.Errorf("decode response: %w", err)}
		}
		if err := complete(out); err != nil {
			// Readable but incomplete ({} or no id): as unknown as an
			// unreadable answer. Taken as final, a success without a
			// charge id would have the sweep refund the real charge.
			return &processor.UnsettledError{Class: processor.ClassOutcomeUnknown, Op: op, Status: resp.StatusCode, Err: fmt.Errorf("incomplete response: %w", err)}
		}
		return nil
	case resp.StatusCode == http.StatusPaymentRequired:
		return &processor.DeclineError{Code: apiErr.Code, DeclineCode: apiErr.DeclineCode, Message: apiErr.Message, ChargeID: apiErr.Charge}
	default:
		return &processor.RequestError{Status: resp.StatusCode, Type: apiErr.Type, Code: apiErr.Code, Message: apiErr.Message}
	}
}

// classify is the one classification of processor answers (S6), the table
// of the package documentation. Only ClassFinal may complete a key or mark
// a payment failed. ours says the answer refused our own configuration
// (S8, Misconfigured): then the class is ClassNotExecuted.
func classify(status int, e APIError) (class processor.Class, ours bool) {
	switch {
	case status >= 200 && status < 300:
		return processor.ClassFinal, false // the charge or refund, as it is
	case status == http.StatusPaymentRequired:
		return processor.ClassFinal, false // a decline: the same card is declined again
	case status == http.StatusTooManyRequests:
		return processor.ClassNotExecuted, false // rate limited before anything ran
	case status == http.StatusConflict:
		// Another call with this key is still running: this one did
		// nothing, but that one may yet succeed, so the outcome is open.
		return processor.ClassOutcomeUnknown, false
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status >= 500:
		return processor.ClassOutcomeUnknown, false // the processor may have started, or finish later
	case processor.Misconfigured(status, e.Code):
		// Our key or URL, refused before anything ran: never the
		// request's outcome, and a retry executes once it is fixed.
		return processor.ClassNotExecuted, true
	case status >= 400 && e.Type == ErrorTypeIdempotency:
		// The key was first used with other parameters: whatever ran
		// under it is not what this answer says. Look it up.
		return processor.ClassOutcomeUnknown, false
	case status >= 400:
		return processor.ClassFinal, false // the request itself is wrong: amount, charge, method
	}
	return processor.ClassOutcomeUnknown, false // 1xx and 3xx are not part of the API
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or
// unreadable.
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(time.Until(at), 0)
	}
	return 0
}

// decodeError reads an ErrorResponse, falling back to the raw body as the
// message so that a proxy's plain-text error is not lost.
func decodeError(body []byte) APIError {
	var e ErrorResponse
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Type == "" {
		return APIError{Message: strings.TrimSpace(string(body))}
	}
	return e.Error
}

func messageOf(e APIError) string {
	if e.Message != "" {
		return e.Message
	}
	return "no error message"
}
