package processorsim

import (
	"io"
	"net/http"
	"time"

	"github.com/idemref/payments/internal/processor"
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
		Path      string    `json:"path"`
		Kind      FaultKind `json:"kind"`
		LatencyMS int64     `json:"latency_ms"`
	}
	if rejected := decodeAdmin(w, r, &req); rejected != nil {
		writeOutcome(w, *rejected)
		return
	}
	f := Fault{Path: req.Path, Kind: req.Kind, Latency: time.Duration(req.LatencyMS) * time.Millisecond}
	if !validFault(f) {
		writeOutcome(w, invalidRequest(processor.CodeParameterInvalid, "",
			`Want {"path":"/v1/charges"|"/v1/refunds","kind":"timeout"|"server_error"|"lost_response"|"latency","latency_ms":N>=0}.`))
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
}

func (s *Simulator) adminMode(w http.ResponseWriter, r *http.Request) {
	var req modeBody
	if rejected := decodeAdmin(w, r, &req); rejected != nil {
		writeOutcome(w, *rejected)
		return
	}
	if req.LatencyMS != nil && *req.LatencyMS < 0 {
		writeOutcome(w, invalidRequest(processor.CodeParameterInvalid, "latency_ms", "latency_ms must not be negative."))
		return
	}
	if req.IgnoreIdempotencyKeys != nil {
		s.SetIgnoreIdempotencyKeys(*req.IgnoreIdempotencyKeys)
	}
	if req.LatencyMS != nil {
		s.SetLatency(time.Duration(*req.LatencyMS) * time.Millisecond)
	}
	s.mu.Lock()
	ignore, latencyMS := s.ignoreKeys, s.latency.Milliseconds()
	s.mu.Unlock()
	writeOutcome(w, jsonOutcome(http.StatusOK, modeBody{IgnoreIdempotencyKeys: &ignore, LatencyMS: &latencyMS}))
}

func (s *Simulator) adminReset(w http.ResponseWriter, _ *http.Request) {
	s.Reset()
	w.WriteHeader(http.StatusNoContent)
}

func decodeAdmin(w http.ResponseWriter, r *http.Request, dst any) *outcome {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		out := invalidRequest(processor.CodeParameterInvalid, "", "Could not read the request body.")
		return &out
	}
	return decodeStrict(body, dst)
}
