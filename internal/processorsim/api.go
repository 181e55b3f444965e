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
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/idemref/payments/internal/processor"
)

// maxBodyBytes bounds a request body; the API's bodies are tiny.
const maxBodyBytes = 64 << 10

// maxKeyLength is Stripe's limit on an idempotency key.
const maxKeyLength = 255

// outcome is the response a call gets, and whether producing it created a
// charge or refund.
type outcome struct {
	status   int
	body     []byte
	executed bool
	replayed bool
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
	r.Post(PathCharges, func(w http.ResponseWriter, r *http.Request) { s.serveMutation(w, r, PathCharges, parseCharge) })
	r.Get(PathCharges, s.listCharges)
	r.Get(PathCharges+"/{id}", s.getCharge)
	r.Post(PathRefunds, func(w http.ResponseWriter, r *http.Request) { s.serveMutation(w, r, PathRefunds, parseRefund) })
	r.Get(PathRefunds, s.listRefunds)

	r.Get("/_sim/calls", s.adminCalls)
	r.Post("/_sim/faults", s.adminFaults)
	r.Post("/_sim/mode", s.adminMode)
	r.Post("/_sim/reset", s.adminReset)

	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeOutcome(w, errorOutcome(http.StatusNotFound, processor.APIError{
			Type: processor.ErrorTypeInvalidRequest, Message: "Unrecognized request URL (" + r.Method + " " + r.URL.Path + ").",
		}))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeOutcome(w, errorOutcome(http.StatusMethodNotAllowed, processor.APIError{
			Type: processor.ErrorTypeInvalidRequest, Message: "Method " + r.Method + " not allowed on " + r.URL.Path + ".",
		}))
	})
	return r
}

// serveMutation runs one POST: record the call, apply latency and any
// fault, then execute or replay under the key.
func (s *Simulator) serveMutation(w http.ResponseWriter, r *http.Request, path string, parse func([]byte) (mutation, *outcome)) {
	call, fault, latency := s.begin(r, path)
	ctx := r.Context()

	// Read the whole body before anything else: net/http only notices a
	// client hanging up once the body is consumed, and the timeout fault
	// relies on that to end when the client gives up.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		s.respond(w, call, invalidRequest(processor.CodeParameterInvalid, "", "Could not read the request body."))
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
		sleep(ctx, timeoutFaultCap)
		s.drop(w, call)
		return
	case FaultServerError:
		s.respond(w, call, errorOutcome(http.StatusInternalServerError, processor.APIError{
			Type: processor.ErrorTypeAPI, Message: "An unexpected error occurred (injected server_error fault).",
		}))
		return
	case FaultLatency:
		if !sleep(ctx, fault.Latency) {
			s.drop(w, call)
			return
		}
	}

	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	switch {
	case key == "":
		s.respond(w, call, invalidRequest(processor.CodeParameterMissing, "Idempotency-Key", "The Idempotency-Key header is required."))
		return
	case len(key) > maxKeyLength:
		s.respond(w, call, invalidRequest(processor.CodeParameterInvalid, "Idempotency-Key",
			fmt.Sprintf("The Idempotency-Key header must be at most %d characters.", maxKeyLength)))
		return
	}
	m, rejected := parse(body)
	if rejected != nil {
		s.respond(w, call, *rejected)
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

// execute replays the response stored for key or, when there is none (or
// keys are ignored), executes m and stores what it produced.
func (s *Simulator) execute(call *Call, path, key string, m mutation) outcome {
	fingerprint := m.fingerprint()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ignoreKeys {
		if stored, ok := s.keys[key]; ok {
			if stored.path != path || stored.fingerprint != fingerprint {
				return errorOutcome(http.StatusBadRequest, processor.APIError{
					Type:    processor.ErrorTypeIdempotency,
					Message: "Keys for idempotent requests can only be used with the same parameters they were first used with.",
				})
			}
			call.Replayed = true
			return outcome{status: stored.status, body: stored.body, replayed: true}
		}
	}
	out := m.execute(s, key)
	call.Executed = out.executed
	if out.executed && !s.ignoreKeys {
		s.keys[key] = storedResponse{path: path, fingerprint: fingerprint, status: out.status, body: out.body}
	}
	return out
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

func errorOutcome(status int, e processor.APIError) outcome {
	return jsonOutcome(status, processor.ErrorResponse{Error: e})
}

func invalidRequest(code, param, message string) outcome {
	return errorOutcome(http.StatusBadRequest, processor.APIError{
		Type: processor.ErrorTypeInvalidRequest, Code: code, Param: param, Message: message,
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
		out := invalidRequest(processor.CodeParameterInvalid, "", "Invalid request body: "+err.Error())
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
		out = invalidRequest(processor.CodeParameterInvalid, "amount", "Amount must be a positive integer in minor units.")
	case !isCurrency(req.Currency):
		out = invalidRequest(processor.CodeParameterInvalid, "currency", "Currency must be a three-letter ISO 4217 code.")
	case req.PaymentMethod == "":
		out = invalidRequest(processor.CodeParameterMissing, "payment_method", "Missing required param: payment_method.")
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
	return executed(errorOutcome(http.StatusPaymentRequired, processor.APIError{
		Type:        processor.ErrorTypeCard,
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
		out = invalidRequest(processor.CodeParameterMissing, "charge", "Missing required param: charge.")
	case req.Amount < 0:
		out = invalidRequest(processor.CodeParameterInvalid, "amount", "Amount must be a positive integer in minor units.")
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
		return invalidRequest(processor.CodeChargeNotRefundable, "charge",
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
		return invalidRequest(processor.CodeAmountTooLarge, "amount",
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
	return executed(jsonOutcome(http.StatusOK, re))
}

// listCharges serves GET /v1/charges, optionally filtered by the key of
// the creating call or by one metadata entry; both filters may combine.
func (s *Simulator) listCharges(w http.ResponseWriter, r *http.Request) {
	call, _, _ := s.begin(r, "")
	q := r.URL.Query()
	key, byKey := q.Get("idempotency_key"), q.Has("idempotency_key")
	mdKey, mdValue, byMetadata := q.Get("metadata_key"), q.Get("metadata_value"), q.Has("metadata_key")
	if byMetadata != q.Has("metadata_value") {
		s.respond(w, call, invalidRequest(processor.CodeParameterMissing, "metadata_value",
			"metadata_key and metadata_value must be given together."))
		return
	}
	s.mu.Lock()
	data := []processor.Charge{}
	for _, ch := range s.charges {
		if byKey && ch.IdempotencyKey != key {
			continue
		}
		if v, ok := ch.Metadata[mdKey]; byMetadata && (!ok || v != mdValue) {
			continue
		}
		data = append(data, cloneCharge(ch))
	}
	s.mu.Unlock()
	s.respond(w, call, jsonOutcome(http.StatusOK, processor.List[processor.Charge]{Object: "list", Data: data}))
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
		s.respond(w, call, errorOutcome(http.StatusNotFound, processor.APIError{
			Type: processor.ErrorTypeInvalidRequest, Code: processor.CodeResourceMissing, Param: "id", Message: "No such charge: '" + id + "'",
		}))
		return
	}
	s.respond(w, call, jsonOutcome(http.StatusOK, ch))
}

// listRefunds serves GET /v1/refunds, optionally filtered by charge.
func (s *Simulator) listRefunds(w http.ResponseWriter, r *http.Request) {
	call, _, _ := s.begin(r, "")
	q := r.URL.Query()
	charge, byCharge := q.Get("charge"), q.Has("charge")
	s.mu.Lock()
	data := []processor.Refund{}
	for _, re := range s.refunds {
		if !byCharge || re.Charge == charge {
			data = append(data, re)
		}
	}
	s.mu.Unlock()
	s.respond(w, call, jsonOutcome(http.StatusOK, processor.List[processor.Refund]{Object: "list", Data: data}))
}
