// Package stripefake serves Stripe's answers, as Stripe's API reference
// documents them, to the Stripe adapter's tests (internal/processor/
// stripeproc): the endpoints the adapter calls, with enough state for the
// contract suite (PaymentIntents, refunds, deduplication by
// Idempotency-Key as Stripe does it for 24 hours), the Search API's lag,
// one-shot recorded answers (a decline, an idempotency error, a 409, a
// rate limit, a 500) served before or after the call executes, and
// Stripe refusing our configuration: a 401 for any key but a test-mode
// secret key, a 404 Unrecognized request URL for any other path, and
// Refuse, which answers every call alike until Lift.
//
// stripe-mock checks the shape of the adapter's requests against Stripe's
// OpenAPI specification, but it is stateless and cannot fail; this server
// is what lets the semantic tests see a search that lags, a charge that
// landed behind a 500, and a resend. Its bodies carry the fields the
// adapter reads, in Stripe's shape (the success and decline bodies follow
// stripe-mock's fixtures, which are Stripe's own).
package stripefake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Test payment methods, as in Stripe's test mode.
const (
	PaymentMethodVisa              = "pm_card_visa"
	PaymentMethodDeclined          = "pm_card_chargeDeclined"
	PaymentMethodInsufficientFunds = "pm_card_chargeDeclinedInsufficientFunds"
)

// Answer is a recorded answer: served instead of the call's own.
type Answer struct {
	Status int
	Header http.Header
	Body   string
}

// Recorded answers: Stripe's error bodies for each case the
// classification must tell apart.
var (
	// IdempotencyError: the key was used before with other parameters.
	IdempotencyError = Answer{Status: 400, Body: `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than 'k' if you meant to execute a different request."}}`}
	// KeyInUse: a request with the same key is still running.
	KeyInUse = Answer{Status: 409, Header: http.Header{"Stripe-Should-Retry": {"true"}}, Body: `{"error":{"type":"idempotency_error","code":"idempotency_key_in_use","message":"There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): k. Please try again later."}}`}
	// RateLimited: too many requests.
	RateLimited = Answer{Status: 429, Header: http.Header{"Stripe-Should-Retry": {"true"}}, Body: `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits."}}`}
	// ServerError: something went wrong on Stripe's end; replayed to the
	// same key, so Stripe says not to retry.
	ServerError = Answer{Status: 500, Header: http.Header{"Stripe-Should-Retry": {"false"}}, Body: `{"error":{"type":"api_error","message":"Sorry, something went wrong. We've already been notified of the problem, but if you need any help, you can reach out to support."}}`}
	// ServiceUnavailable: a 503 Stripe would have retried.
	ServiceUnavailable = Answer{Status: 503, Header: http.Header{"Stripe-Should-Retry": {"true"}}, Body: `{"error":{"type":"api_error","message":"Stripe is temporarily unavailable."}}`}
	// LockTimeout: a 400 Stripe says to retry (the object was locked).
	LockTimeout = Answer{Status: 400, Header: http.Header{"Stripe-Should-Retry": {"true"}}, Body: `{"error":{"type":"invalid_request_error","code":"lock_timeout","message":"This object cannot be accessed right now because another API request or Stripe process is currently accessing it."}}`}
	// InvalidRequest: a parameter is wrong.
	InvalidRequest = Answer{Status: 400, Body: `{"error":{"type":"invalid_request_error","code":"parameter_invalid_integer","param":"amount","message":"Invalid integer: -1"}}`}
	// BadGateway: a proxy's plain-text 502.
	BadGateway = Answer{Status: 502, Body: "<html>502 Bad Gateway</html>"}
	// Unauthorized: the secret key is wrong, rolled or revoked. Stripe
	// names the key it got, masked but for its last four characters.
	Unauthorized = Answer{Status: 401, Body: `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided: sk_test_****************1234"}}`}
	// Forbidden: a restricted key without the permission the call needs.
	Forbidden = Answer{Status: 403, Body: `{"error":{"type":"invalid_request_error","message":"The provided key 'rk_test_*********************1234' does not have the required permissions for this endpoint on account 'acct_1Fake'. Having the 'rak_payment_intent_write' permission would allow this request to continue."}}`}
	// UnrecognizedURL: the request went to a path Stripe has no endpoint
	// at (a wrong base URL).
	UnrecognizedURL = Answer{Status: 404, Body: `{"error":{"type":"invalid_request_error","message":"Unrecognized request URL (POST: /v1/payment_intents). Please see https://stripe.com/docs or we can help at https://support.stripe.com/."}}`}
	// ResourceMissing: the PaymentIntent a call names does not exist; the
	// request's own answer, unlike UnrecognizedURL.
	ResourceMissing = Answer{Status: 404, Body: `{"error":{"type":"invalid_request_error","code":"resource_missing","param":"payment_intent","message":"No such payment_intent"}}`}
)

// PaymentIntent is a PaymentIntent as the server keeps it.
type PaymentIntent struct {
	ID             string            `json:"id"`
	Amount         int64             `json:"amount"`
	Currency       string            `json:"currency"`
	PaymentMethod  string            `json:"payment_method"`
	Status         string            `json:"status"`
	Metadata       map[string]string `json:"metadata"`
	Created        int64             `json:"created"`
	AmountRefunded int64             `json:"-"`
	DeclineCode    string            `json:"-"`
	// CancellationReason is the reason a cancel gave.
	CancellationReason string `json:"cancellation_reason,omitempty"`
	createdAt          time.Time
}

// Refund is a refund as the server keeps it.
type Refund struct {
	ID            string            `json:"id"`
	Amount        int64             `json:"amount"`
	PaymentIntent string            `json:"payment_intent"`
	Status        string            `json:"status"`
	Metadata      map[string]string `json:"metadata"`
	Created       int64             `json:"created"`
}

// Call is one request the server received.
type Call struct {
	Method, Path   string
	IdempotencyKey string
	Form           url.Values
	Status         int
	// At is when the call arrived.
	At time.Time
}

// When a one-shot answer is served.
type When int

const (
	// Before: instead of executing (nothing happens).
	Before When = iota
	// After: the call executes, then this answer goes out instead of its
	// own (a charge behind a 500).
	After
)

// Server is the fake. Its zero value is not usable: Start it.
type Server struct {
	URL string

	mu sync.Mutex
	// searchLag hides a PaymentIntent from search for this long after
	// its creation, as Stripe's Search API may.
	searchLag  time.Duration
	ignoreKeys bool
	intents    []*PaymentIntent
	refunds    []*Refund
	replays    map[string]stored
	once       map[string][]oneShot // by path
	// refusal answers every call until lifted: a configuration Stripe
	// refuses (Refuse).
	refusal *Answer
	// stopAt is the status the next PaymentIntent stops at ("": none).
	stopAt string
	calls  []Call
	seq    int
	now    func() time.Time
}

type stored struct {
	form   string
	status int
	body   []byte
}

type oneShot struct {
	when   When
	answer Answer
}

// Start serves a new fake on 127.0.0.1 until the test ends.
func Start(t testing.TB) *Server {
	s := &Server{replays: map[string]stored{}, once: map[string][]oneShot{}, now: time.Now}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// SetSearchLag makes every new PaymentIntent invisible to search for d.
func (s *Server) SetSearchLag(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.searchLag = d
}

// IgnoreKeys makes the server execute every call, whatever its key, as a
// processor that keeps no key (or Stripe past the 24 hours it keeps one)
// does: a resend is a second charge.
func (s *Server) IgnoreKeys() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ignoreKeys = true
}

// Queue serves a on the next call to path (such as /v1/payment_intents),
// once.
func (s *Server) Queue(path string, when When, a Answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.once[path] = append(s.once[path], oneShot{when, a})
}

// StopNext makes the next PaymentIntent created stop at status after its
// confirm, whatever its parameters: requires_action (the card asks for
// authentication), requires_capture (authorized, not captured) or
// requires_confirmation. Such a PaymentIntent waits for an action; only a
// cancel (POST /v1/payment_intents/{id}/cancel) ends it.
func (s *Server) StopNext(status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopAt = status
}

// Refuse answers every call with a, before anything executes, until
// Lift: Stripe refusing our configuration (Unauthorized for a revoked
// key, Forbidden, UnrecognizedURL) until an operator fixes it.
func (s *Server) Refuse(a Answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refusal = &a
}

// Lift ends Refuse: calls execute again.
func (s *Server) Lift() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refusal = nil
}

// Calls returns every call received so far.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// PaymentIntents returns every PaymentIntent created so far.
func (s *Server) PaymentIntents() []PaymentIntent { return copies(s, &s.intents) }

// Refunds returns every refund created so far.
func (s *Server) Refunds() []Refund { return copies(s, &s.refunds) }

// copies copies the objects *list points at, read under s.mu.
func copies[T any](s *Server, list *[]*T) []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]T, 0, len(*list))
	for _, v := range *list {
		out = append(out, *v)
	}
	return out
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	call := Call{Method: r.Method, Path: r.URL.Path, IdempotencyKey: r.Header.Get("Idempotency-Key"), Form: r.Form, At: s.now()}
	status, header, body := s.handle(r, call)
	call.Status = status
	s.calls = append(s.calls, call)
	for k, v := range header {
		w.Header()[k] = v
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Request-Id", fmt.Sprintf("req_%d", len(s.calls)))
	w.WriteHeader(status)
	_, _ = w.Write(body) //nolint:gosec // a test server answering JSON it built itself to a test's client
}

// handle answers one call, under s.mu.
func (s *Server) handle(r *http.Request, call Call) (int, http.Header, []byte) {
	if key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); !strings.HasPrefix(key, "sk_test_") {
		body, _ := json.Marshal(map[string]any{"error": map[string]any{"type": "invalid_request_error", "message": "Invalid API Key provided: " + masked(key)}})
		return 401, nil, body
	}
	if s.refusal != nil {
		return s.refusal.Status, s.refusal.Header, []byte(s.refusal.Body)
	}
	var shot *oneShot
	if q := s.once[r.URL.Path]; len(q) > 0 {
		shot, s.once[r.URL.Path] = &q[0], q[1:]
	}
	if shot != nil && shot.when == Before {
		return shot.answer.Status, shot.answer.Header, []byte(shot.answer.Body)
	}
	var status int
	var body []byte
	switch {
	case r.Method == http.MethodPost && (r.URL.Path == "/v1/payment_intents" || r.URL.Path == "/v1/refunds"):
		status, body = s.mutation(r, call)
	case r.Method == http.MethodPost && cancelPath.MatchString(r.URL.Path):
		status, body = s.cancelIntent(cancelPath.FindStringSubmatch(r.URL.Path)[1], r.PostForm)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/payment_intents/search":
		status, body = s.search(r.Form)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/refunds":
		status, body = s.listRefunds(r.Form)
	default:
		body, _ = json.Marshal(map[string]any{"error": map[string]any{"type": "invalid_request_error",
			"message": fmt.Sprintf("Unrecognized request URL (%s: %s). Please see https://stripe.com/docs or we can help at https://support.stripe.com/.", r.Method, r.URL.Path)}})
		status = http.StatusNotFound
	}
	if shot != nil {
		return shot.answer.Status, shot.answer.Header, []byte(shot.answer.Body)
	}
	return status, nil, body
}

// mutation creates a PaymentIntent or a refund, deduplicated by key as at
// Stripe: the same key and parameters replay the first answer; other
// parameters are an idempotency_error.
func (s *Server) mutation(r *http.Request, call Call) (int, []byte) {
	form := r.PostForm.Encode()
	scope := r.URL.Path + " " + call.IdempotencyKey
	if !s.ignoreKeys && call.IdempotencyKey != "" {
		if st, ok := s.replays[scope]; ok {
			if st.form != form {
				return IdempotencyError.Status, []byte(IdempotencyError.Body)
			}
			return st.status, st.body
		}
	}
	var status int
	var body []byte
	if r.URL.Path == "/v1/payment_intents" {
		status, body = s.createIntent(r.PostForm)
	} else {
		status, body = s.createRefund(r.PostForm)
	}
	// Like Stripe, only calls that began executing are kept under the key.
	if status != 400 && call.IdempotencyKey != "" {
		s.replays[scope] = stored{form: form, status: status, body: body}
	}
	return status, body
}

func (s *Server) createIntent(f url.Values) (int, []byte) {
	amount, err := strconv.ParseInt(f.Get("amount"), 10, 64)
	if err != nil || amount <= 0 {
		return InvalidRequest.Status, []byte(InvalidRequest.Body)
	}
	s.seq++
	now := s.now()
	pi := &PaymentIntent{
		ID: fmt.Sprintf("pi_fake%06d", s.seq), Amount: amount, Currency: f.Get("currency"), PaymentMethod: f.Get("payment_method"),
		Status: "succeeded", Metadata: metadataOf(f), Created: now.Unix(), createdAt: now,
	}
	switch {
	case s.stopAt != "":
		pi.Status, s.stopAt = s.stopAt, ""
	case pi.PaymentMethod == PaymentMethodDeclined:
		pi.Status, pi.DeclineCode = "requires_payment_method", "generic_decline"
	case pi.PaymentMethod == PaymentMethodInsufficientFunds:
		pi.Status, pi.DeclineCode = "requires_payment_method", "insufficient_funds"
	}
	s.intents = append(s.intents, pi)
	if pi.DeclineCode != "" {
		body, _ := json.Marshal(map[string]any{"error": map[string]any{
			"type": "card_error", "code": "card_declined", "decline_code": pi.DeclineCode,
			"message": "Your card was declined.", "charge": "ch_" + pi.ID[3:], "payment_intent": intentJSON(pi, false),
		}})
		return 402, body
	}
	body, _ := json.Marshal(intentJSON(pi, false))
	return 200, body
}

// cancelPath is POST /v1/payment_intents/{id}/cancel.
var cancelPath = regexp.MustCompile(`^/v1/payment_intents/([^/]+)/cancel$`)

// cancelIntent cancels a PaymentIntent that has not succeeded, as Stripe
// does; a succeeded or canceled one cannot be.
func (s *Server) cancelIntent(id string, f url.Values) (int, []byte) {
	i := slices.IndexFunc(s.intents, func(pi *PaymentIntent) bool { return pi.ID == id })
	if i < 0 {
		return ResourceMissing.Status, []byte(ResourceMissing.Body)
	}
	pi := s.intents[i]
	if pi.Status == "succeeded" || pi.Status == "canceled" {
		body, _ := json.Marshal(map[string]any{"error": map[string]any{"type": "invalid_request_error", "code": "payment_intent_unexpected_state",
			"message": "You cannot cancel this PaymentIntent because it has a status of " + pi.Status + "."}})
		return 400, body
	}
	pi.Status, pi.CancellationReason = "canceled", f.Get("cancellation_reason")
	body, _ := json.Marshal(intentJSON(pi, false))
	return 200, body
}

func (s *Server) createRefund(f url.Values) (int, []byte) {
	var pi *PaymentIntent
	for _, p := range s.intents {
		if p.ID == f.Get("payment_intent") {
			pi = p
		}
	}
	if pi == nil {
		return ResourceMissing.Status, []byte(ResourceMissing.Body)
	}
	left := pi.Amount - pi.AmountRefunded
	if pi.Status != "succeeded" || left <= 0 {
		return 400, []byte(`{"error":{"type":"invalid_request_error","code":"charge_already_refunded","message":"Charge has already been refunded."}}`)
	}
	amount := left
	if f.Get("amount") != "" {
		var err error
		if amount, err = strconv.ParseInt(f.Get("amount"), 10, 64); err != nil || amount <= 0 {
			return InvalidRequest.Status, []byte(InvalidRequest.Body)
		}
	}
	if amount > left {
		return 400, []byte(`{"error":{"type":"invalid_request_error","code":"amount_too_large","param":"amount","message":"Refund amount is greater than unrefunded amount on charge"}}`)
	}
	s.seq++
	pi.AmountRefunded += amount
	re := &Refund{ID: fmt.Sprintf("re_fake%06d", s.seq), Amount: amount, PaymentIntent: pi.ID, Status: "succeeded", Metadata: metadataOf(f), Created: s.now().Unix()}
	s.refunds = append(s.refunds, re)
	body, _ := json.Marshal(refundJSON(re))
	return 200, body
}

// searchQuery is the one query form the adapter sends.
var searchQuery = regexp.MustCompile(`^metadata\['([a-z_]+)'\]:'((?:[^'\\]|\\.)*)'$`)

// search answers the Search API: only PaymentIntents older than the lag.
func (s *Server) search(f url.Values) (int, []byte) {
	m := searchQuery.FindStringSubmatch(f.Get("query"))
	if m == nil {
		return 400, []byte(`{"error":{"type":"invalid_request_error","code":"parameter_invalid","param":"query","message":"Invalid search query"}}`)
	}
	field, value := m[1], strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(m[2])
	expand := slices.Contains(f["expand[]"], "data.latest_charge") || slices.Contains(f["expand[0]"], "data.latest_charge")
	data := []any{}
	// Newest first, as Stripe orders a search.
	for i := len(s.intents) - 1; i >= 0; i-- {
		pi := s.intents[i]
		if pi.Metadata[field] == value && s.now().Sub(pi.createdAt) >= s.searchLag {
			data = append(data, intentJSON(pi, expand))
		}
	}
	body, _ := json.Marshal(map[string]any{"object": "search_result", "url": "/v1/payment_intents/search", "data": data, "has_more": false, "next_page": nil})
	return 200, body
}

// listRefunds answers GET /v1/refunds?payment_intent=..., newest first,
// in pages of limit after starting_after.
func (s *Server) listRefunds(f url.Values) (int, []byte) {
	limit := 10
	if l, err := strconv.Atoi(f.Get("limit")); err == nil && l > 0 && l <= 100 {
		limit = l
	}
	var all []*Refund
	for i := len(s.refunds) - 1; i >= 0; i-- {
		if re := s.refunds[i]; f.Get("payment_intent") == "" || re.PaymentIntent == f.Get("payment_intent") {
			all = append(all, re)
		}
	}
	if after := f.Get("starting_after"); after != "" {
		i := slices.IndexFunc(all, func(re *Refund) bool { return re.ID == after })
		all = all[i+1:]
	}
	more := len(all) > limit
	if more {
		all = all[:limit]
	}
	data := []any{}
	for _, re := range all {
		data = append(data, refundJSON(re))
	}
	body, _ := json.Marshal(map[string]any{"object": "list", "url": "/v1/refunds", "data": data, "has_more": more})
	return 200, body
}

func intentJSON(pi *PaymentIntent, expand bool) map[string]any {
	out := map[string]any{
		"id": pi.ID, "object": "payment_intent", "amount": pi.Amount, "currency": pi.Currency,
		"payment_method": pi.PaymentMethod, "status": pi.Status, "metadata": pi.Metadata, "created": pi.Created,
		"amount_received": 0, "latest_charge": "ch_" + pi.ID[3:], "last_payment_error": nil,
	}
	if pi.CancellationReason != "" {
		out["cancellation_reason"] = pi.CancellationReason
	}
	if pi.Status == "succeeded" {
		out["amount_received"] = pi.Amount
	}
	if pi.DeclineCode != "" {
		out["last_payment_error"] = map[string]any{"type": "card_error", "code": "card_declined", "decline_code": pi.DeclineCode, "message": "Your card was declined."}
	}
	if expand {
		out["latest_charge"] = map[string]any{"id": "ch_" + pi.ID[3:], "object": "charge", "amount": pi.Amount, "amount_refunded": pi.AmountRefunded, "payment_intent": pi.ID}
	}
	return out
}

func refundJSON(re *Refund) map[string]any {
	return map[string]any{"id": re.ID, "object": "refund", "amount": re.Amount, "payment_intent": re.PaymentIntent,
		"status": re.Status, "metadata": re.Metadata, "created": re.Created, "currency": "eur"}
}

func metadataOf(f url.Values) map[string]string {
	md := map[string]string{}
	for k, v := range f {
		if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") && len(v) > 0 {
			md[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	return md
}

// masked shows a key as Stripe's 401 does: its last four characters.
func masked(key string) string {
	if len(key) <= 4 {
		return strings.Repeat("*", len(key))
	}
	return strings.Repeat("*", len(key)-4) + key[len(key)-4:]
}
