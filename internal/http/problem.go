package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/cursor"
	"github.com/idemref/payments/internal/customers"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/validation"
	"github.com/idemref/payments/internal/webhook"
)

// DefaultProblemBaseURL prefixes every problem type URI unless
// Config.ProblemBaseURL says otherwise; the rest is the code with dashes
// (RFC 9457). It is a reference relative to the API itself: a client that
// follows a problem's type, resolved against the URL it called, reads the
// rule it broke on this API's own page of problem types (/docs/problems,
// an anchor per code). Codes are part of the API contract; a deployment
// may point the types at its own documentation.
const DefaultProblemBaseURL = "/docs/problems#"

// problemBase is the prefix in force: one per process, like the setting
// (PROBLEM_BASE_URL) it comes from, set by NewHandler.
var problemBase atomic.Pointer[string]

// ProblemType returns the type URI of the problem with code.
func ProblemType(code string) string {
	base := DefaultProblemBaseURL
	if b := problemBase.Load(); b != nil {
		base = *b
	}
	return base + strings.ReplaceAll(code, "_", "-")
}

// Problem codes: stable, machine-readable, documented in openapi.yaml.
const (
	CodeUnauthorized         = "unauthorized"
	CodeKeyMissing           = "idempotency_key_missing"
	CodeKeyInvalid           = "idempotency_key_invalid"
	CodeInvalidJSON          = "invalid_json"
	CodeBodyTooLarge         = "body_too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeValidationFailed     = "validation_failed"
	CodeKeyInUse             = "idempotency_key_in_use"
	CodeConflictingWrite     = "conflicting_write_in_progress"
	CodeKeyReused            = "idempotency_key_reused"
	CodeReferenceExists      = "order_reference_exists"
	CodeNotFound             = "not_found"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeInvalidQuery         = "invalid_query"
	CodeKeyBudgetExceeded    = "idempotency_key_budget_exceeded"
	CodeRefundExists         = "refund_exists"
	CodeUnavailable          = "service_unavailable"
	CodeInternal             = "internal_error"
	CodeOrderNotFound        = "order_not_found"
	CodeAmountMismatch       = "payment_amount_mismatch"
	CodePaymentExists        = "payment_exists"
	CodeCardDeclined         = "card_declined"
	CodeProcessorRejected    = "processor_rejected"
	CodeNotRefundable        = "payment_not_refundable"
	CodeRefundExceeds        = "refund_exceeds_payment"
	CodeProcessorUnavailable = "processor_unavailable"
	CodeOutcomeUnknown       = "processor_outcome_unknown"
	CodeRateLimited          = "rate_limited"
	CodeResultExpired        = "idempotency_result_expired"
	CodePreconditionFailed   = "precondition_failed"
	CodePreconditionRequired = "precondition_required"
	// Webhook rejections (M4): nothing was written.
	CodeWebhookSignatureInvalid = "webhook_signature_invalid"
	CodeWebhookTimestampInvalid = "webhook_timestamp_out_of_tolerance"
)

// retryAfterSeconds is sent with 409 idempotency_key_in_use, 409
// conflicting_write_in_progress and 503.
const retryAfterSeconds = "1"

// keyBudgetRetryAfter is what a tenant past its key budget is asked to
// wait: about one pass of the reaper, which frees keys past retention.
const keyBudgetRetryAfter = time.Minute

// retryAfter renders d as Retry-After delay-seconds: rounded up, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.FormatInt(max(ceilSeconds(d), 1), 10)
}

// Problem is an RFC 9457 problem detail.
type Problem struct {
	Type    string                  `json:"type"`
	Title   string                  `json:"title"`
	Status  int                     `json:"status"`
	Detail  string                  `json:"detail,omitempty"`
	Code    string                  `json:"code"`
	Errors  []validation.FieldError `json:"errors,omitempty"`
	OrderID *uuid.UUID              `json:"order_id,omitempty"`
	// PaymentID and DeclineCode detail payment problems.
	PaymentID   *uuid.UUID `json:"payment_id,omitempty"`
	DeclineCode string     `json:"decline_code,omitempty"`
	// Resource and OriginalStatus detail idempotency_result_expired: what
	// the expired request created, and how it was answered.
	Resource       string            `json:"resource,omitempty"`
	OriginalStatus int               `json:"original_status,omitempty"`
	header         map[string]string // extra response headers, e.g. Retry-After
	// CommitWindowSeconds details the key-status endpoint's 404: how long
	// after it was sent a request under the key can still commit.
	CommitWindowSeconds int64 `json:"commit_window_seconds,omitempty"`
	// Rules links every problem of a keyed endpoint to the rules of its
	// keys (L8): rulesPath.
	Rules string `json:"idempotency_rules,omitempty"`
}

// rulesPath is the document of the rules of keys (GET /v1/idempotency).
const rulesPath = "/v1/idempotency"

// keyed marks p as the answer of a keyed endpoint: it links to the rules
// of keys.
func (p Problem) keyed() Problem {
	p.Rules = rulesPath
	return p
}

func newProblem(status int, code, title, detail string) Problem {
	return Problem{
		Type:   ProblemType(code),
		Title:  title,
		Status: status,
		Detail: detail,
		Code:   code,
	}
}

// problemFor is the one place where errors become HTTP. Internal causes of
// 5xx answers are logged by the caller, never serialised.
//
// A sentinel error with a fixed answer is answered from sentinelProblems.
// The functions asked next, in order, are for the errors whose answer
// carries what they hold: the typed errors, and the sentinels that come
// wrapped in one (the 401's challenge, the processor's delay); the last of
// them also takes any transient failure; anything else is a 500. The table
// is asked first. No error they answer wraps a sentinel of the
// table (the ones that wrap anything wrap tenants.ErrUnauthenticated, a
// body or signature failure, or payments.ErrProcessorUnavailable or
// ErrOutcomeUnknown and a processor failure), so which is asked first
// decides nothing; a typed error made to wrap one of them would be
// answered as that sentinel.
func problemFor(err error) Problem {
	for _, s := range sentinelProblems {
		if s.matches(err) {
			return s.problem(err)
		}
	}
	for _, answer := range []func(error) (Problem, bool){
		admissionProblem, keyProblem, domainProblem, unavailableProblem,
	} {
		if p, ok := answer(err); ok {
			return p
		}
	}
	return newProblem(http.StatusInternalServerError, CodeInternal, "Internal server error",
		"The request was rolled back. Retrying with the same Idempotency-Key is safe.")
}

// admissionProblem answers the errors that refuse a request before it is
// read: credentials, rate limits, webhook signatures and the body itself.
func admissionProblem(err error) (Problem, bool) {
	var (
		bodyErr   *bodyError
		limited   *rateLimitedError
		throttled *authThrottledError
		hookErr   *webhookError
	)
	switch {
	case errors.Is(err, tenants.ErrUnauthenticated):
		return unauthorizedProblem(err), true
	case errors.As(err, &limited):
		p := newProblem(http.StatusTooManyRequests, CodeRateLimited, "Too many requests",
			"This API key sent more requests than its rate limit allows. Nothing was recorded: retry after the Retry-After delay, with the same Idempotency-Key.")
		p.header = map[string]string{"Retry-After": strconv.FormatInt(limited.retryAfter, 10)}
		return p, true
	case errors.As(err, &throttled):
		p := newProblem(http.StatusTooManyRequests, CodeRateLimited, "Too many requests",
			"This address sent too many API keys that are not known. Nothing was recorded: retry after the Retry-After delay, with a valid key.")
		p.header = map[string]string{"Retry-After": strconv.FormatInt(throttled.retryAfter, 10)}
		return p, true
	case errors.As(err, &hookErr) && errors.Is(err, webhook.ErrStale):
		return newProblem(http.StatusBadRequest, CodeWebhookTimestampInvalid, "Webhook timestamp out of tolerance",
			"The signature's timestamp t is more than the tolerance away from now. Nothing was recorded; sign again and resend."), true
	case errors.As(err, &hookErr):
		return newProblem(http.StatusBadRequest, CodeWebhookSignatureInvalid, "Invalid webhook signature",
			"The signature headers ("+webhook.Header+", or webhook-id, webhook-timestamp and webhook-signature under Standard Webhooks) are missing or malformed, or no v1 signature matches the body with a current secret. Nothing was recorded."), true
	case errors.As(err, &bodyErr):
		return newProblem(bodyErr.status, bodyErr.code, bodyErr.title, bodyErr.Error()), true
	}
	return Problem{}, false
}

// unauthorizedProblem is the 401, with the challenge that says how to
// authenticate.
func unauthorizedProblem(err error) Problem {
	p := newProblem(http.StatusUnauthorized, CodeUnauthorized, "Unauthorized",
		"Send the API key as one 'Authorization: Bearer <key>' header.")
	// RFC 9110 section 11.6.1: a 401 names the scheme to use; RFC 6750
	// section 3.1 adds what was wrong with the credentials.
	challenge := "Bearer"
	var ae *authError
	if errors.As(err, &ae) {
		challenge = ae.challenge
	}
	p.header = map[string]string{"WWW-Authenticate": challenge}
	return p
}

// keyProblem answers what the Idempotency-Key's record cannot give: a key
// with no record yet, and a result past its replay window.
func keyProblem(err error) (Problem, bool) {
	var (
		notYet  *keyNotRecordedError
		expired *idem.ResultExpiredError
	)
	switch {
	case errors.As(err, &notYet):
		// No record is final only once no request under the key can still
		// commit: the window since its last request was sent.
		p := newProblem(http.StatusNotFound, CodeNotFound, "Not found",
			"No record of this Idempotency-Key on this endpoint for this tenant. A request under it that is still running has no record until it commits, which it can only do within commit_window_seconds of being sent: until that long after the key's last request was sent, ask again or send the same request with the same key (at most one attempt commits).")
		p.CommitWindowSeconds = ceilSeconds(notYet.window)
		if notYet.window <= 0 {
			p.Detail = "No record of this Idempotency-Key on this endpoint for this tenant. A request under it that is still running has no record until it commits."
		}
		return p, true
	case errors.As(err, &expired):
		p := newProblem(http.StatusConflict, CodeResultExpired, "Idempotency result expired",
			fmt.Sprintf("This request was already made under this Idempotency-Key; its result expired at %s and is no longer replayed, and the request is not run again. See resource (if it created one) and original_status. The key is forgotten after %s.",
				expired.ExpiredAt.UTC().Format(time.RFC3339), expired.RetainedUntil.UTC().Format(time.RFC3339)))
		p.Resource, p.OriginalStatus = expired.Location, expired.Status
		return p, true
	}
	return Problem{}, false
}

// domainProblem answers the rules of orders, payments and refunds: invalid
// fields, duplicates, amounts, and what the processor decided.
func domainProblem(err error) (Problem, bool) {
	var (
		invalid   *validation.Error
		refExists *orders.ReferenceExistsError
		mismatch  *payments.AmountMismatchError
		payExists *payments.PaymentExistsError
		declined  *payments.DeclinedError
		rejected  *payments.ProcessorRejectedError
		exceeds   *payments.RefundExceedsError
		refundDup *payments.RefundExistsError
	)
	switch {
	case errors.As(err, &invalid):
		p := newProblem(http.StatusBadRequest, CodeValidationFailed, "Validation failed",
			"One or more fields are invalid; see errors.")
		p.Errors = invalid.Fields
		return p, true
	case errors.As(err, &refExists):
		p := newProblem(http.StatusConflict, CodeReferenceExists, "Order reference already used",
			"An order with this reference already exists; see order_id.")
		p.OrderID = &refExists.OrderID
		return p, true
	case errors.As(err, &mismatch):
		return newProblem(http.StatusUnprocessableEntity, CodeAmountMismatch, "Amount does not match the order",
			fmt.Sprintf("The order still owes %d %s; amount and currency must match it.", mismatch.Owed, mismatch.Currency)), true
	case errors.As(err, &payExists):
		p := newProblem(http.StatusConflict, CodePaymentExists, "Order already has a payment",
			"The order already has a payment that has not failed; see payment_id.")
		p.PaymentID = &payExists.PaymentID
		return p, true
	case errors.As(err, &declined):
		p := newProblem(http.StatusPaymentRequired, CodeCardDeclined, "Card declined",
			"The processor declined the card. Retrying this request replays the decline; pay with a new Idempotency-Key to try again.")
		p.PaymentID, p.DeclineCode = &declined.PaymentID, declined.DeclineCode
		return p, true
	case errors.As(err, &rejected):
		return newProblem(http.StatusUnprocessableEntity, CodeProcessorRejected, "Rejected by the processor", rejected.Message), true
	case errors.As(err, &refundDup):
		return newProblem(http.StatusConflict, CodeRefundExists, "Refund exists",
			fmt.Sprintf("This request made refund %s already, under an Idempotency-Key past its retention: GET /v1/payments/{id}/refunds/%s shows it.", refundDup.RefundID, refundDup.RefundID)), true
	case errors.As(err, &exceeds):
		return newProblem(http.StatusUnprocessableEntity, CodeRefundExceeds, "Refund exceeds the payment",
			fmt.Sprintf("At most %d can still be refunded.", exceeds.Refundable)), true
	}
	return Problem{}, false
}

// unavailableProblem answers the failures a retry after Retry-After can
// get past: the processor's, then any other transient one.
func unavailableProblem(err error) (Problem, bool) {
	switch {
	// The two processor sentinels come as a *payments.RetryError, whose
	// delay is their Retry-After.
	case errors.Is(err, payments.ErrProcessorUnavailable):
		// Shared by payments and refunds, so it names neither.
		p := newProblem(http.StatusServiceUnavailable, CodeProcessorUnavailable, "Payment processor unavailable",
			"The payment processor did not execute the request. Nothing was recorded as final: retry with the same Idempotency-Key after the Retry-After delay and the request resumes where it stopped.")
		p.header = map[string]string{"Retry-After": retryAfter(payments.RetryAfter(err))}
		return p, true
	case errors.Is(err, payments.ErrOutcomeUnknown):
		p := newProblem(http.StatusServiceUnavailable, CodeOutcomeUnknown, "Outcome not known yet",
			"The payment processor has not confirmed whether the request took effect, and it may still do so. Nothing was recorded as final and the payment shows status processing: retry with the same Idempotency-Key after the Retry-After delay. The request resumes where it stopped and never charges or refunds twice.")
		p.header = map[string]string{"Retry-After": retryAfter(payments.RetryAfter(err))}
		return p, true
	case isUnavailable(err):
		p := newProblem(http.StatusServiceUnavailable, CodeUnavailable, "Service unavailable",
			"A temporary failure interrupted the request and nothing was recorded. Retry after the Retry-After delay; for a POST, with the same Idempotency-Key.")
		p.header = map[string]string{"Retry-After": retryAfterSeconds}
		return p, true
	}
	return Problem{}, false
}

// sentinelProblem is the fixed answer to a sentinel error: any of errs,
// matched with errors.Is.
type sentinelProblem struct {
	errs          []error
	status        int
	code, title   string
	detail        string
	detailFromErr bool   // the error's own text is the detail
	retryAfter    string // the Retry-After header; "" sends none
}

func (s sentinelProblem) matches(err error) bool {
	return slices.ContainsFunc(s.errs, func(target error) bool { return errors.Is(err, target) })
}

func (s sentinelProblem) problem(err error) Problem {
	detail := s.detail
	if s.detailFromErr {
		detail = err.Error()
	}
	p := newProblem(s.status, s.code, s.title, detail)
	if s.retryAfter != "" {
		p.header = map[string]string{"Retry-After": s.retryAfter}
	}
	return p
}

// sentinelProblems answers the sentinel errors, first match wins.
var sentinelProblems = []sentinelProblem{
	{
		errs:   []error{errClientShare},
		status: http.StatusTooManyRequests, code: CodeRateLimited, title: "Too many requests",
		detail:     "This client has as many requests in flight as one client may (a request still sending its body counts). Nothing was recorded: retry after the Retry-After delay, with the same Idempotency-Key.",
		retryAfter: retryAfterSeconds,
	},
	{
		errs:   []error{idem.ErrKeyBudgetExceeded},
		status: http.StatusTooManyRequests, code: CodeKeyBudgetExceeded, title: "Idempotency key budget exceeded",
		detail:     "This tenant holds as many live idempotency keys as its budget allows, so a request with a new key is refused. Nothing was recorded. Keys it holds still replay; the budget frees up as old keys pass their retention.",
		retryAfter: strconv.FormatInt(int64(keyBudgetRetryAfter/time.Second), 10),
	},
	{
		errs:   []error{idem.ErrKeyMissing},
		status: http.StatusBadRequest, code: CodeKeyMissing, title: "Idempotency-Key required",
		detailFromErr: true,
	},
	{
		errs:   []error{idem.ErrKeyInvalid},
		status: http.StatusBadRequest, code: CodeKeyInvalid, title: "Invalid Idempotency-Key",
		detailFromErr: true,
	},
	{
		errs:   []error{idem.ErrKeyInUse, idem.ErrLeaseLost},
		status: http.StatusConflict, code: CodeKeyInUse, title: "Request in progress",
		detail:     "A request with this Idempotency-Key is still being processed. Retry with the same key after the Retry-After delay.",
		retryAfter: retryAfterSeconds,
	},
	{
		errs:   []error{idem.ErrConflictingWrite},
		status: http.StatusConflict, code: CodeConflictingWrite, title: "Conflicting write in progress",
		detail:     "Another request, under another Idempotency-Key, is writing what this request must write (such as an order with the same reference) and has not finished. Nothing was recorded: retry with the same key after the Retry-After delay.",
		retryAfter: retryAfterSeconds,
	},
	{
		errs:   []error{idem.ErrKeyReused},
		status: http.StatusUnprocessableEntity, code: CodeKeyReused, title: "Idempotency-Key reused",
		detail: "This Idempotency-Key was already used with a different request. Use a new key for a new request.",
	},
	{
		errs:   []error{payments.ErrOrderNotFound},
		status: http.StatusUnprocessableEntity, code: CodeOrderNotFound, title: "Order not found",
		detail: "The order_id names no order of this tenant.",
	},
	{
		errs:   []error{payments.ErrNotRefundable},
		status: http.StatusConflict, code: CodeNotRefundable, title: "Payment not refundable",
		detailFromErr: true,
	},
	{
		errs:   []error{errPreconditionRequired},
		status: http.StatusPreconditionRequired, code: CodePreconditionRequired, title: "If-Match required",
		detailFromErr: true,
	},
	{
		errs:   []error{errWeakTag},
		status: http.StatusPreconditionFailed, code: CodePreconditionFailed, title: "Precondition failed",
		detailFromErr: true,
	},
	{
		errs:   []error{errPreconditionFailed},
		status: http.StatusPreconditionFailed, code: CodePreconditionFailed, title: "Precondition failed",
		detail: "The order changed since the ETag in If-Match was read. GET it again, check that the change still makes sense, and send it with the new ETag.",
	},
	{
		errs:   []error{orders.ErrNotFound, payments.ErrNotFound, payments.ErrRefundNotFound, customers.ErrNotFound, errRouteNotFound},
		status: http.StatusNotFound, code: CodeNotFound, title: "Not found",
	},
	{
		errs:   []error{errMethodNotAllowed},
		status: http.StatusMethodNotAllowed, code: CodeMethodNotAllowed, title: "Method not allowed",
	},
	{
		errs:   []error{cursor.ErrInvalid, errInvalidLimit, errEndpointParam, errInvalidOrderFilter, errMalformedQuery},
		status: http.StatusBadRequest, code: CodeInvalidQuery, title: "Invalid query parameter",
		detailFromErr: true,
	},
	{
		errs:   []error{errNotReady},
		status: http.StatusServiceUnavailable, code: CodeUnavailable, title: "Service unavailable",
		detail:     "The database does not answer; this instance cannot take traffic.",
		retryAfter: retryAfterSeconds,
	},
	{
		errs:   []error{errBrokerRefused},
		status: http.StatusServiceUnavailable, code: CodeUnavailable, title: "Service unavailable",
		detailFromErr: true, retryAfter: retryAfterSeconds,
	},
	{
		errs:   []error{errDraining},
		status: http.StatusServiceUnavailable, code: CodeUnavailable, title: "Service unavailable",
		detail:     "This instance is shutting down: it still serves what it is sent for a short while, but takes no new traffic. Send requests to another instance.",
		retryAfter: retryAfterSeconds,
	},
}

var (
	errRouteNotFound    = errors.New("no such route")
	errMethodNotAllowed = errors.New("method not allowed")
	errInvalidLimit     = errors.New("limit must be an integer from 1 to 100")
	// errMalformedQuery: a query string with a broken percent-encoding.
	errMalformedQuery = errors.New("the query string is not valid percent-encoding")
	// errInvalidOrderFilter: GET /v1/payments?order_id= that is not an
	// order id in canonical form.
	errInvalidOrderFilter = errors.New("order_id must be an order id (a lowercase UUID)")
	// errNotReady: /readyz found the database down.
	errNotReady = errors.New("not ready")
	// errBrokerRefused: /readyz found the broker refused (too old).
	errBrokerRefused = errors.New("the broker is refused")
	// errDraining: /readyz of a process that is shutting down.
	errDraining = errors.New("shutting down")
)

// encode renders the problem as the exact response bytes to send or record.
func (p Problem) encode() idem.Response {
	body, err := json.Marshal(p)
	if err != nil {
		panic(err) // a Problem always encodes
	}
	body = append(body, '\n') // as every JSON body (respond.go)
	h := http.Header{}
	h.Set("Content-Type", "application/problem+json")
	// Problem answers, recorded or not, must never be cached by an
	// intermediary and served to a retry in place of our own answer.
	h.Set("Cache-Control", "no-store")
	for k, v := range p.header {
		h.Set(k, v)
	}
	return idem.Response{Status: p.Status, Header: h, Body: body}
}

// isUnavailable is the one rule for "temporarily unavailable" (O2, L6): a
// failure that says nothing about the request, the idempotency layer's
// ErrUnavailable or any transient database error (db.IsTransient), from a
// create, a read or authentication alike, is 503 with Retry-After, and is
// never recorded (see Problem.recorded).
func isUnavailable(err error) bool {
	return errors.Is(err, idem.ErrUnavailable) || db.IsTransient(err)
}

// recorded is the one rule for which answers an idempotency record keeps
// (O1, O2), in both paths (idempotent, and payments through
// Renderer.Failure): a 4xx that the request's own operation returned is
// its deterministic outcome, recorded and replayed; a 5xx (unavailable,
// internal) rolls back and is never recorded, so the retry runs again.
func (p Problem) recorded() bool { return p.Status < 500 }
