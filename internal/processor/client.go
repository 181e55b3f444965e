package processor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultTimeout bounds one call when NewClient is given no timeout. It is
// the longest a payment step waits before treating the outcome as unknown.
const DefaultTimeout = 10 * time.Second

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
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &Client{
		baseURL: strings.TrimRight(baseURL, "/"),
		http:    &http.Client{Timeout: timeout},
	}
}

// CreateCharge charges req.Amount to req.PaymentMethod. idempotencyKey must
// be the same on every retry of one logical charge (requirement S2), so the
// processor executes it at most once.
func (c *Client) CreateCharge(ctx context.Context, req ChargeRequest, idempotencyKey string) (Charge, error) {
	var ch Charge
	err := c.post(ctx, "/v1/charges", req, idempotencyKey, &ch)
	return ch, err
}

// Refund refunds req.Amount (or everything still refundable when zero) of
// req.Charge. The idempotency rules are those of CreateCharge.
func (c *Client) Refund(ctx context.Context, req RefundRequest, idempotencyKey string) (Refund, error) {
	var re Refund
	err := c.post(ctx, "/v1/refunds", req, idempotencyKey, &re)
	return re, err
}

// ChargesByIdempotencyKey lists every charge created by a call that carried
// key, oldest first. After ErrTransient it tells whether the charge exists;
// against a processor that ignores keys (requirement S4) more than one
// charge means a double charge to compensate.
func (c *Client) ChargesByIdempotencyKey(ctx context.Context, key string) ([]Charge, error) {
	var list List[Charge]
	err := c.get(ctx, "/v1/charges?"+url.Values{"idempotency_key": {key}}.Encode(), &list)
	return list.Data, err
}

// ChargesByMetadata lists every charge whose metadata maps key to value,
// oldest first. It finds charges when the idempotency key is not known,
// for example by the payment id the API put in the metadata.
func (c *Client) ChargesByMetadata(ctx context.Context, key, value string) ([]Charge, error) {
	var list List[Charge]
	q := url.Values{"metadata_key": {key}, "metadata_value": {value}}
	err := c.get(ctx, "/v1/charges?"+q.Encode(), &list)
	return list.Data, err
}

// RefundsByCharge lists the refunds of one charge, oldest first.
func (c *Client) RefundsByCharge(ctx context.Context, chargeID string) ([]Refund, error) {
	var list List[Refund]
	err := c.get(ctx, "/v1/refunds?"+url.Values{"charge": {chargeID}}.Encode(), &list)
	return list.Data, err
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
	// the caller sees ErrTransient and decides.
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

// do sends req and sorts the answer into the three error classes described
// in the package documentation.
func (c *Client) do(req *http.Request, op string, out any) error {
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		// The request may have reached the processor and executed.
		return transient(op, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		// The status line arrived but the body did not: for a 200 the charge
		// exists and we cannot read it, so the outcome is unknown.
		return transient(op, fmt.Errorf("read response: %w", err))
	}

	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		if err := json.Unmarshal(body, out); err != nil {
			// Executed but unreadable; a retry with the same key replays it.
			return transient(op, fmt.Errorf("decode %d response: %w", resp.StatusCode, err))
		}
		return nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return transient(op, fmt.Errorf("status %d: %s", resp.StatusCode, errorMessage(body)))
	case resp.StatusCode == http.StatusPaymentRequired:
		e := decodeError(body)
		return &DeclineError{Code: e.Code, DeclineCode: e.DeclineCode, Message: e.Message, ChargeID: e.Charge}
	case resp.StatusCode >= 400:
		e := decodeError(body)
		return &RequestError{Status: resp.StatusCode, Type: e.Type, Code: e.Code, Message: e.Message}
	default:
		// 1xx and 3xx are not part of the API; the outcome is unknown.
		return transient(op, fmt.Errorf("unexpected status %d", resp.StatusCode))
	}
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

func errorMessage(body []byte) string {
	if msg := decodeError(body).Message; msg != "" {
		return msg
	}
	return "no error message"
}
