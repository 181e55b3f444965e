package processorsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/simproc"
)

// maxBodyBytes bounds a request body; the API's bodies are tiny.
const maxBodyBytes = 64 << 10

// maxKeyLength is Stripe's limit on an idempotency key.
const maxKeyLength = 255

// outcome is the response a call gets, and whether producing it created a
// charge or refund.
type outcome struct {
	status     int
	body       []byte
	executed   bool
	replayed   bool
	retryAfter time.Duration // sent as Retry-After when positive
}

// mutation is one parsed POST body.
type mutation interface {
	// fingerprint identifies the parameters, so a key reused with other
	// parameters is caught.
	fingerprint() string
	// execute runs the call with s.mu held. It returns executed=false when
	// it rejects the call, so nothing is stored against the key.
	execute(s *Simulator, key string) outcome
}

func (s *Simulator) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(s.refusing)
	r.Post(PathCharges, func(w http.ResponseWriter, r *http.Request) { s.serveMutation(w, r, PathCharges, parseCharge) })
	r.Get(PathCharges, s.listCharges)
	r.Get(PathCharges+"/{id}", s.getCharge)
	r.Post(PathRefunds, func(w http.ResponseWriter, r *http.Request) { s.serveMutation(w, r, PathRefunds, parseRefund) })
	r.Get(PathRefunds, s.listRefunds)

	r.Get("/_sim/calls", s.adminCalls)
	r.Get("/_sim/idle", s.adminIdle)
	r.Post("/_sim/faults", s.adminFaults)
	r.Post("/_sim/mode", s.adminMode)
	r.Post("/_sim/reset", s.adminReset)
	r.Post("/_sim/webhooks", s.adminWebhooks)
	r.Post("/_sim/webhook-faults", s.adminWebhookFaults)
	r.Get("/_sim/deliveries", s.adminDeliveries)

	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeOutcome(w, errorOutcome(http.StatusNotFound, simproc.APIError{
			Type: simproc.ErrorTypeInvalidRequest, Message: "Unrecognized request URL (" + r.Method + " " + r.URL.Path + ").",
		}))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeOutcome(w, errorOutcome(http.StatusMethodNotAllowed, simproc.APIError{
			Type: simproc.ErrorTypeInvalidRequest, Message: "Method " + r.Method + " not allowed on " + r.URL.Path + ".",
		}))
	})
	return r
}

// serveMutation runs one POST: record the call, apply latency and any
// fault that answers before the call is accepted, validate it, then
// execute or replay it under its key, at once or after a fault holds it.
func (s *Simulator) serveMutation(w http.ResponseWriter, r *http.Request, path string, parse func([]byte) (mutation, *outcome)) {
	call, fault, latency := s.begin(r, path)
	// Whatever it waits in, no call executes later than this, so callers
	// can bound how long an unknown outcome stays open (MaxExecution).
	deadline := time.Now().Add(s.cfg.maxExecution)
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()

	// Read the whole body before anything else: net/http only notices a
	// client hanging up once the body is consumed, and the timeout and
	// latency faults rely on that to end when the client gives up.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		s.respond(w, call, invalidRequest(simproc.CodeParameterInvalid, "", "Could not read the request body."))
		return
	}
	if !sleep(ctx, latency) {
		s.drop(w, call)
		return
	}
	switch fault.Kind {
	case FaultTimeout:
		if s.cfg.onBlock != nil {
			s.cfg.onBlock()
		}
		<-ctx.Done()
		s.drop(w, call)
		return
	case FaultServerError, FaultStatus:
		s.respond(w, call, faultOutcome(fault))
		return
	default:
		// No fault, or one that acts once the call is accepted (lost
		// response, latency, late execution): below.
	}

	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	switch {
	case key == "":
		s.respond(w, call, invalidRequest(simproc.CodeParameterMissing, "Idempotency-Key", "The Idempotency-Key header is required."))
		return
	case len(key) > maxKeyLength:
		s.respond(w, call, invalidRequest(simproc.CodeParameterInvalid, "Idempotency-Key",
			fmt.Sprintf("The Idempotency-Key header must be at most %d characters.", maxKeyLength)))
		return
	}
	m, rejected := parse(body)
	if rejected != nil {
		s.respond(w, call, *rejected)
		return
	}
	// The call is accepted.
	if holds(fault.Kind) {
		s.serveHeld(w, r, &heldCall{call: call, path: path, key: key, m: m, fault: fault, deadline: deadline})
		return
	}
	out := s.execute(call, path, key, m)
	if fault.Kind == FaultLostResponse {
		s.drop(w, call)
		return
	}
	s.respond(w, call, out)
}

// begin records the call and takes the next fault queued for faultPath
// (none when faultPath is empty). It also snapshots the latency, so a mode
// change does not affect calls already in flight.
func (s *Simulator) begin(r *http.Request, faultPath string) (*Call, Fault, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	call := &Call{
		Seq:            s.seq,
		Method:         r.Method,
		Path:           r.URL.Path,
		IdempotencyKey: strings.TrimSpace(r.Header.Get("Idempotency-Key")),
		At:             time.Now().UTC(),
	}
	var fault Fault
	if q := s.faults[faultPath]; faultPath != "" && len(q) > 0 {
		fault, s.faults[faultPath] = q[0], q[1:]
		call.Fault = fault.Kind
	}
	s.calls = append(s.calls, call)
	return call, fault, s.latency
}

// execute answers an accepted call that no fault holds. The key lookup,
// the execution and storing the response happen under one hold of s.mu,
// so a duplicate sees either the key in flight under a held call, or the
// stored response, never a half-executed call.
func (s *Simulator) execute(call *Call, path, key string, m mutation) outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	dedupe := !s.ignoreKeys
	if out, answered := s.lookupLocked(call, path, key, m, dedupe); answered {
		return out
	}
	return s.runLocked(call, path, key, m, dedupe)
}

// lookupLocked answers a call from its key, when keys are honoured: with
// the stored response, a reuse error when the parameters differ, or 409
// while a held call has the key in flight. answered is false when the key
// is free and the call is to execute.
func (s *Simulator) lookupLocked(call *Call, path, key string, m mutation, dedupe bool) (out outcome, answered bool) {
	if !dedupe {
		return outcome{}, false
	}
	if stored, ok := s.keys[key]; ok {
		if stored.path != path || stored.fingerprint != m.fingerprint() {
			return errorOutcome(http.StatusBadRequest, simproc.APIError{
				Type:    simproc.ErrorTypeIdempotency,
				Code:    simproc.CodeIdempotencyKeyReused,
				Message: "Keys for idempotent requests can only be used with the same parameters they were first used with.",
			}), true
		}
		call.Replayed = true
		return outcome{status: stored.status, body: stored.body, replayed: true}, true
	}
	if _, ok := s.inFlight[key]; ok {
		// Like Stripe: the first call may still succeed, so this one
		// neither waits for it nor executes.
		return errorOutcome(http.StatusConflict, simproc.APIError{
			Type: simproc.ErrorTypeIdempotency,
			Code: simproc.CodeIdempotencyKeyInUse,
			Message: "There is currently another in-progress request using this Idempotency-Key " +
				"(probably a retry sent while the first call is still executing). Try again later.",
		}), true
	}
	return outcome{}, false
}

// runLocked executes m and, when keys are honoured, stores what it
// produced under key.
func (s *Simulator) runLocked(call *Call, path, key string, m mutation, dedupe bool) outcome {
	out := m.execute(s, key)
	call.Executed = out.executed
	if out.executed && dedupe {
		s.keys[key] = storedResponse{path: path, fingerprint: m.fingerprint(), status: out.status, body: out.body}
	}
	return out
}

// heldCall is an accepted call that a latency or late_execution fault
// holds before it executes.
type heldCall struct {
	call      *Call
	path, key string
	m         mutation
	fault     Fault
	deadline  time.Time // see serveMutation
	// Set when the call is admitted: whether keys are honoured for it (a
	// mode change does not affect a call already held), and the state it
	// belongs to (done once Reset forgot it).
	dedupe    bool
	forgotten context.Context
}

// serveHeld claims the call's key, holds the call for its fault's latency,
// then executes it and answers if the client is still there.
//
// A latency fault gives up, without executing, when its client does. A
// late_execution fault does not: like Stripe, the processor keeps working
// on a call whose client disconnected. Either gives up without executing
// when Reset forgets the call, when its MaxExecution passes, and when the
// server shuts down, which keeps Shutdown bounded by the calls' answers
// rather than by their delays.
func (s *Simulator) serveHeld(w http.ResponseWriter, r *http.Request, h *heldCall) {
	if out, answered := s.admit(h); answered {
		s.respond(w, h.call, out)
		return
	}
	defer s.settle()
	out, ran := s.land(h, s.hold(r.Context(), h))
	if !ran || r.Context().Err() != nil {
		// Abandoned, or executed with nobody left to answer.
		s.drop(w, h.call)
		return
	}
	s.respond(w, h.call, out)
}

// admit answers the call from its key if lookupLocked can. Otherwise it
// marks the key in flight (when keys are honoured) and counts the call as
// held until settle.
func (s *Simulator) admit(h *heldCall) (out outcome, answered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h.dedupe, h.forgotten = !s.ignoreKeys, s.forgotten
	if out, answered := s.lookupLocked(h.call, h.path, h.key, h.m, h.dedupe); answered {
		return out, true
	}
	if h.dedupe {
		s.inFlight[h.key] = h.call
	}
	if s.held == 0 {
		s.idle = make(chan struct{})
	}
	s.held++
	return outcome{}, false
}

// hold waits out the call's delay and reports whether it did; reqCtx is
// the request's context, which only a latency fault gives up with.
func (s *Simulator) hold(reqCtx context.Context, h *heldCall) bool {
	parent := reqCtx
	if h.fault.Kind == FaultLateExecution {
		parent = s.lifetime
	}
	ctx, cancel := context.WithDeadline(parent, h.deadline)
	defer cancel()
	stop := context.AfterFunc(h.forgotten, cancel)
	defer stop()
	timer := s.cfg.HoldTimer(h.fault.Latency)
	select {
	case <-timer:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// land releases the call's key and, if run and Reset has not forgotten the
// call meanwhile, executes it. ran is false when it did not get that far.
func (s *Simulator) land(h *heldCall, run bool) (out outcome, ran bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// After a Reset the key may be in flight under a newer call.
	if s.inFlight[h.key] == h.call {
		delete(s.inFlight, h.key)
	}
	if !run || h.forgotten.Err() != nil {
		return outcome{}, false
	}
	return s.runLocked(h.call, h.path, h.key, h.m, h.dedupe), true
}

// settle counts a held call out once its record is final.
func (s *Simulator) settle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held--
	if s.held == 0 {
		close(s.idle)
	}
}

// respond records the status before writing, so that by the time a client
// has its response the call record is complete.
func (s *Simulator) respond(w http.ResponseWriter, call *Call, out outcome) {
	s.finish(call, out.status)
	writeOutcome(w, out)
}

// drop records the call as unanswered and closes the connection.
func (s *Simulator) drop(w http.ResponseWriter, call *Call) {
	s.finish(call, 0)
	dropConnection(w)
}

func (s *Simulator) finish(call *Call, status int) {
	s.mu.Lock()
	call.Status = status
	c := *call
	s.mu.Unlock()
	s.logger.LogAttrs(context.Background(), slog.LevelInfo, "processor call",
		slog.Int64("seq", c.Seq),
		slog.String("method", c.Method),
		slog.String("path", c.Path),
		slog.String("idempotency_key", c.IdempotencyKey),
		slog.Int("status", c.Status),
		slog.String("fault", string(c.Fault)),
		slog.Bool("executed", c.Executed),
		slog.Bool("replayed", c.Replayed),
	)
}

func writeOutcome(w http.ResponseWriter, out outcome) {
	w.Header().Set("Content-Type", "application/json")
	if out.replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if out.retryAfter > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds(out.retryAfter))
	}
	w.WriteHeader(out.status)
	_, _ = w.Write(out.body)
}

func jsonOutcome(status int, v any) outcome {
	body, err := json.Marshal(v)
	if err != nil {
		// Only the package's own wire types get here; they always marshal.
		panic(fmt.Sprintf("processorsim: marshal %T: %v", v, err))
	}
	return outcome{status: status, body: append(body, '\n')}
}

func errorOutcome(status int, e simproc.APIError) outcome {
	return jsonOutcome(status, simproc.ErrorResponse{Error: e})
}

func invalidRequest(code, param, message string) outcome {
	return errorOutcome(http.StatusBadRequest, simproc.APIError{
		Type: simproc.ErrorTypeInvalidRequest, Code: code, Param: param, Message: message,
	})
}

// decodeStrict decodes exactly one JSON object with no unknown fields, so
// a client sending a misspelled parameter hears about it.
func decodeStrict(body []byte, dst any) *outcome {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	if err == nil && dec.More() {
		err = errors.New("unexpected data after the JSON object")
	}
	if err != nil {
		out := invalidRequest(simproc.CodeParameterInvalid, "", "Invalid request body: "+err.Error())
		return &out
	}
	return nil
}

// chargeMutation is a parsed POST /v1/charges.
type chargeMutation struct{ req processor.ChargeRequest }

func parseCharge(body []byte) (mutation, *outcome) {
	var req processor.ChargeRequest
	if rejected := decodeStrict(body, &req); rejected != nil {
		return nil, rejected
	}
	var out outcome
	switch _, known := declineCodes[req.PaymentMethod]; {
	case req.Amount <= 0:
		out = invalidRequest(simproc.CodeParameterInvalid, "amount", "Amount must be a positive integer in minor units.")
	case !isCurrency(req.Currency):
		out = invalidRequest(simproc.CodeParameterInvalid, "currency", "Currency must be a three-letter ISO 4217 code.")
	case req.PaymentMethod == "":
		out = invalidRequest(simproc.CodeParameterMissing, "payment_method", "Missing required param: payment_method.")
	case !known:
		out = invalidRequest(processor.CodeResourceMissing, "payment_method", "No such PaymentMethod: '"+req.PaymentMethod+"'")
	default:
		return chargeMutation{req}, nil
	}
	return nil, &out
}

func isCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for _, r := range c {
		if (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') {
			return false
		}
	}
	return true
}

func (m chargeMutation) fingerprint() string {
	req := m.req
	if len(req.Metadata) == 0 {
		// Absent and empty metadata are the same parameters.
		req.Metadata = nil
	}
	// encoding/json sorts map keys, so equal requests give equal bytes.
	b, _ := json.Marshal(req)
	return string(b)
}

func (m chargeMutation) execute(s *Simulator, key string) outcome {
	declineCode := declineCodes[m.req.PaymentMethod]
	if declineCode == "" {
		ch := s.newChargeLocked(m.req, key, processor.StatusSucceeded)
		return executed(jsonOutcome(http.StatusOK, ch))
	}
	// A declined card still leaves a failed charge behind, as at Stripe.
	ch := s.newChargeLocked(m.req, key, processor.StatusFailed)
	return executed(errorOutcome(http.StatusPaymentRequired, simproc.APIError{
		Type:        simproc.ErrorTypeCard,
		Code:        processor.CodeCardDeclined,
		DeclineCode: declineCode,
		Message:     "Your card was declined.",
		Charge:      ch.ID,
	}))
}

func executed(out outcome) outcome {
	out.executed = true
	return out
}

// refundMutation is a parsed POST /v1/refunds.
type refundMutation struct{ req processor.RefundRequest }

func parseRefund(body []byte) (mutation, *outcome) {
	var req processor.RefundRequest
	if rejected := decodeStrict(body, &req); rejected != nil {
		return nil, rejected
	}
	var out outcome
	switch {
	case req.Charge == "":
		out = invalidRequest(simproc.CodeParameterMissing, "charge", "Missing required param: charge.")
	case req.Amount < 0:
		out = invalidRequest(simproc.CodeParameterInvalid, "amount", "Amount must be a positive integer in minor units.")
	default:
		return refundMutation{req}, nil
	}
	return nil, &out
}

func (m refundMutation) fingerprint() string {
	b, _ := json.Marshal(m.req)
	return string(b)
}

func (m refundMutation) execute(s *Simulator, key string) outcome {
	i, ok := s.chargeIndex[m.req.Charge]
	if !ok {
		return invalidRequest(processor.CodeResourceMissing, "charge", "No such charge: '"+m.req.Charge+"'")
	}
	ch := &s.charges[i]
	if ch.Status != processor.StatusSucceeded {
		return invalidRequest(simproc.CodeChargeNotRefundable, "charge",
			"Charge "+ch.ID+" has status "+ch.Status+"; only succeeded charges can be refunded.")
	}
	remaining := ch.Amount - ch.RefundedAmount
	if remaining == 0 {
		return invalidRequest(processor.CodeChargeAlreadyRefunded, "charge", "Charge "+ch.ID+" has already been refunded.")
	}
	amount := m.req.Amount
	if amount == 0 {
		amount = remaining
	}
	if amount > remaining {
		return invalidRequest(simproc.CodeAmountTooLarge, "amount",
			fmt.Sprintf("Refund amount (%d) is greater than the unrefunded amount on charge (%d).", amount, remaining))
	}
	ch.RefundedAmount += amount
	re := processor.Refund{
		ID:             newID("re_"),
		Object:         "refund",
		Charge:         ch.ID,
		Amount:         amount,
		Status:         processor.StatusSucceeded,
		IdempotencyKey: key,
		Created:        time.Now().Unix(),
	}
	s.refunds = append(s.refunds, re)
	s.emitLocked(processor.EventChargeRefunded, *ch)
	return executed(jsonOutcome(http.StatusOK, re))
}

// listCharges serves GET /v1/charges, optionally filtered by the key of
// the creating call or by one metadata entry; both filters may combine.
// It pages like every list (see listPage).
func (s *Simulator) listCharges(w http.ResponseWriter, r *http.Request) {
	call, _, _ := s.begin(r, "")
	q := r.URL.Query()
	key, byKey := q.Get("idempotency_key"), q.Has("idempotency_key")
	mdKey, mdValue, byMetadata := q.Get("metadata_key"), q.Get("metadata_value"), q.Has("metadata_key")
	if byMetadata != q.Has("metadata_value") {
		s.respond(w, call, invalidRequest(simproc.CodeParameterMissing, "metadata_value",
			"metadata_key and metadata_value must be given together."))
		return
	}
	p, rejected := parseListPage(q)
	if rejected != nil {
		s.respond(w, call, *rejected)
		return
	}
	s.mu.Lock()
	list, found := listPage(s.charges, p, func(ch processor.Charge) string { return ch.ID }, func(ch processor.Charge) bool {
		v, ok := ch.Metadata[mdKey]
		return (!byKey || ch.IdempotencyKey == key) && (!byMetadata || ok && v == mdValue)
	})
	for i, ch := range list.Data {
		list.Data[i] = cloneCharge(ch)
	}
	s.mu.Unlock()
	if !found {
		s.respond(w, call, noSuchCursor("charge", p.after))
		return
	}
	s.respond(w, call, jsonOutcome(http.StatusOK, list))
}

func (s *Simulator) getCharge(w http.ResponseWriter, r *http.Request) {
	call, _, _ := s.begin(r, "")
	id := chi.URLParam(r, "id")
	s.mu.Lock()
	i, ok := s.chargeIndex[id]
	var ch processor.Charge
	if ok {
		ch = cloneCharge(s.charges[i])
	}
	s.mu.Unlock()
	if !ok {
		s.respond(w, call, errorOutcome(http.StatusNotFound, simproc.APIError{
			Type: simproc.ErrorTypeInvalidRequest, Code: processor.CodeResourceMissing, Param: "id", Message: "No such charge: '" + id + "'",
		}))
		return
	}
	s.respond(w, call, jsonOutcome(http.StatusOK, ch))
}

// listRefunds serves GET /v1/refunds, optionally filtered by charge. It
// pages like every list (see listPage).
func (s *Simulator) listRefunds(w http.ResponseWriter, r *http.Request) {
	call, _, _ := s.begin(r, "")
	q := r.URL.Query()
	charge, byCharge := q.Get("charge"), q.Has("charge")
	p, rejected := parseListPage(q)
	if rejected != nil {
		s.respond(w, call, *rejected)
		return
	}
	s.mu.Lock()
	list, found := listPage(s.refunds, p, func(re processor.Refund) string { return re.ID }, func(re processor.Refund) bool {
		return !byCharge || re.Charge == charge
	})
	s.mu.Unlock()
	if !found {
		s.respond(w, call, noSuchCursor("refund", p.after))
		return
	}
	s.respond(w, call, jsonOutcome(http.StatusOK, list))
}

// pageParams are a list request's limit and starting_after.
type pageParams struct {
	limit int
	after string
	// paging says starting_after was given: the page starts after that
	// item rather than with the oldest.
	paging bool
}

func parseListPage(q url.Values) (pageParams, *outcome) {
	p := pageParams{limit: simproc.DefaultListLimit, after: q.Get("starting_after"), paging: q.Has("starting_after")}
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > simproc.MaxListLimit {
			out := invalidRequest(simproc.CodeParameterInvalid, "limit",
				fmt.Sprintf("limit must be an integer from 1 to %d.", simproc.MaxListLimit))
			return pageParams{}, &out
		}
		p.limit = n
	}
	return p, nil
}

// listPage is one page of items (all of one kind, in creation order): the
// ones that match, after the item p.after names, at most p.limit of them.
// Filtering before paging means a page is full unless it is the last, and
// the cursor is a position in creation order, so it may name an item the
// filter leaves out. found is false when p.after names no item at all.
func listPage[T any](items []T, p pageParams, id func(T) string, match func(T) bool) (list simproc.List[T], found bool) {
	start := 0
	if p.paging {
		i := slices.IndexFunc(items, func(it T) bool { return id(it) == p.after })
		if i < 0 {
			return simproc.List[T]{}, false
		}
		start = i + 1
	}
	list = simproc.List[T]{Object: "list", Data: []T{}}
	for _, it := range items[start:] {
		if !match(it) {
			continue
		}
		if len(list.Data) == p.limit {
			list.HasMore = true
			break
		}
		list.Data = append(list.Data, it)
	}
	return list, true
}

func noSuchCursor(object, id string) outcome {
	return invalidRequest(processor.CodeResourceMissing, "starting_after", "No such "+object+": '"+id+"'")
}
