package processorsim

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemref/payments/internal/processor/simproc"
)

// The /_sim endpoints let a test or a person with curl drive a simulator
// running in another process. They are not processor calls, so they are
// not recorded and take no faults.

func (s *Simulator) adminCalls(w http.ResponseWriter, _ *http.Request) {
	writeOutcome(w, jsonOutcome(http.StatusOK, struct {
		Data []Call `json:"data"`
	}{s.Calls()}))
}

func (s *Simulator) adminFaults(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Path         string    `json:"path"`
		Kind         FaultKind `json:"kind"`
		LatencyMS    int64     `json:"latency_ms"`
		Status       int       `json:"status"`
		RetryAfterMS int64     `json:"retry_after_ms"`
	}
	if rejected := decodeAdmin(w, r, &req); rejected != nil {
		writeOutcome(w, *rejected)
		return
	}
	f := Fault{
		Path: req.Path, Kind: req.Kind, Status: req.Status,
		Latency:    milliseconds(req.LatencyMS),
		RetryAfter: milliseconds(req.RetryAfterMS),
	}
	if !validFault(f) {
		writeOutcome(w, invalidRequest(simproc.CodeParameterInvalid, "", fmt.Sprintf(
			`Want {"path":"/v1/charges"|"/v1/refunds","kind":"timeout"|"server_error"|"lost_response"|"latency"|"late_execution"|"status"}, `+
				`with "latency_ms":0..%d for latency and late_execution, "status":%s for status, and "retry_after_ms":N>=0 for status 429.`,
			MaxExecution.Milliseconds(), statusList())))
		return
	}
	s.InjectFault(f)
	w.WriteHeader(http.StatusNoContent)
}

// modeBody is the body of POST /_sim/mode and its answer; a field left
// out of the request keeps its current value.
type modeBody struct {
	IgnoreIdempotencyKeys *bool  `json:"ignore_idempotency_keys"`
	LatencyMS             *int64 `json:"latency_ms"`
	RefuseKey             *bool  `json:"refuse_key"`
}

func (s *Simulator) adminMode(w http.ResponseWriter, r *http.Request) {
	var req modeBody
	if rejected := decodeAdmin(w, r, &req); rejected != nil {
		writeOutcome(w, *rejected)
		return
	}
	if req.LatencyMS != nil && (*req.LatencyMS < 0 || milliseconds(*req.LatencyMS) > MaxExecution) {
		// Above MaxExecution every call would be dropped unexecuted: that
		// is the timeout fault, not a latency.
		writeOutcome(w, invalidRequest(simproc.CodeParameterInvalid, "latency_ms",
			fmt.Sprintf("latency_ms must be from 0 to %d.", MaxExecution.Milliseconds())))
		return
	}
	if req.IgnoreIdempotencyKeys != nil {
		s.SetIgnoreIdempotencyKeys(*req.IgnoreIdempotencyKeys)
	}
	if req.LatencyMS != nil {
		s.SetLatency(milliseconds(*req.LatencyMS))
	}
	if req.RefuseKey != nil {
		s.SetRefuseKey(*req.RefuseKey)
	}
	s.mu.Lock()
	ignore, latencyMS, refuse := s.ignoreKeys, s.latency.Milliseconds(), s.refuseKey
	s.mu.Unlock()
	writeOutcome(w, jsonOutcome(http.StatusOK, modeBody{IgnoreIdempotencyKeys: &ignore, LatencyMS: &latencyMS, RefuseKey: &refuse}))
}

// adminIdle answers 204 once WaitIdle returns: a test driving a simulator
// in another process waits with it for a late charge to land.
func (s *Simulator) adminIdle(w http.ResponseWriter, r *http.Request) {
	if s.WaitIdle(r.Context()) != nil {
		// The client left, or the server is shutting down: idle was not
		// reached, and a 2xx would say it was.
		dropConnection(w)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Simulator) adminReset(w http.ResponseWriter, _ *http.Request) {
	s.Reset()
	w.WriteHeader(http.StatusNoContent)
}

func decodeAdmin(w http.ResponseWriter, r *http.Request, dst any) *outcome {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		out := invalidRequest(simproc.CodeParameterInvalid, "", "Could not read the request body.")
		return &out
	}
	return decodeStrict(body, dst)
}

// milliseconds converts an admin endpoint's *_ms field. Values too large
// for a Duration saturate rather than wrap, so range checks still see them
// as too large.
func milliseconds(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	if ms < math.MinInt64/int64(time.Millisecond) {
		return math.MinInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// statusList spells faultStatuses for an error message: 408|425|....
func statusList() string {
	s := make([]string, len(faultStatuses))
	for i, st := range faultStatuses {
		s[i] = strconv.Itoa(st)
	}
	return strings.Join(s, "|")
}

// adminWebhooks serves POST /_sim/webhooks: where and how events are
// delivered ({"url":"","secrets":[...]}; an empty url turns them off).
func (s *Simulator) adminWebhooks(w http.ResponseWriter, r *http.Request) {
	var req struct {
		URL     string   `json:"url"`
		Secrets []string `json:"secrets"`
	}
	if rejected := decodeAdmin(w, r, &req); rejected != nil {
		writeOutcome(w, *rejected)
		return
	}
	s.SetWebhooks(WebhookConfig{URL: req.URL, Secrets: req.Secrets})
	w.WriteHeader(http.StatusNoContent)
}

// adminWebhookFaults serves POST /_sim/webhook-faults: a one-shot fault
// for the next event ({"duplicates":N,"delay_ms":N}).
func (s *Simulator) adminWebhookFaults(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Duplicates int   `json:"duplicates"`
		DelayMS    int64 `json:"delay_ms"`
	}
	if rejected := decodeAdmin(w, r, &req); rejected != nil {
		writeOutcome(w, *rejected)
		return
	}
	if req.Duplicates < 0 || req.Duplicates > 100 || req.DelayMS < 0 || milliseconds(req.DelayMS) > MaxExecution {
		writeOutcome(w, invalidRequest(simproc.CodeParameterInvalid, "", fmt.Sprintf(
			`Want {"duplicates":0..100,"delay_ms":0..%d}.`, MaxExecution.Milliseconds())))
		return
	}
	s.InjectWebhookFault(WebhookFault{Duplicates: req.Duplicates, Delay: milliseconds(req.DelayMS)})
	w.WriteHeader(http.StatusNoContent)
}

// adminDeliveries serves GET /_sim/deliveries: every webhook attempt.
func (s *Simulator) adminDeliveries(w http.ResponseWriter, _ *http.Request) {
	writeOutcome(w, jsonOutcome(http.StatusOK, struct {
		Data []Delivery `json:"data"`
	}{s.Deliveries()}))
}
