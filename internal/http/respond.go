package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/idemref/payments/internal/idem"
)

// Every response leaves through this file: a success is encoded once into
// the exact bytes that are sent and, under a key, recorded (encodeJSON);
// a failure becomes its problem (writeError); a recorded response is
// written as stored, marked when it is a replay (respond).
//
// Every JSON body ends with a newline, so that a terminal (curl -i) does
// not glue what follows onto it. A record written before bodies had one
// replays without it: a replay sends the stored bytes, the same as its
// first answer, and the newline is whitespace to every JSON parser.

// encodeJSON renders a success as the exact bytes to send and record.
func encodeJSON(status int, v any, location string) (idem.Response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return idem.Response{}, err
	}
	body = append(body, '\n')
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	if location != "" {
		h.Set("Location", location)
	}
	return idem.Response{Status: status, Header: h, Body: body}, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	res, err := encodeJSON(status, v, "")
	if err != nil {
		panic(err) // our own types always encode; recovered and logged as 500
	}
	writeResponse(w, res)
}

func writeResponse(w http.ResponseWriter, res idem.Response) {
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// respond writes a keyed endpoint's recorded (or replayed) response, or
// the problem for err.
func respond(w http.ResponseWriter, r *http.Request, res idem.Response, replayed bool, err error) {
	if err != nil {
		writeKeyedError(w, r, err)
		return
	}
	if replayed {
		res.Header.Set(ReplayedHeader, "true")
	}
	writeResponse(w, res)
}

// writeError answers with the problem for err. Its code goes on the
// request's one access log line; a 5xx also logs its internal cause, at
// error level, since only the server can act on it.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	writeProblem(w, r, problemFor(err), err)
}

// writeKeyedError is writeError for a keyed endpoint: its problem links to
// the rules of keys.
func writeKeyedError(w http.ResponseWriter, r *http.Request, err error) {
	writeProblem(w, r, problemFor(err).keyed(), err)
}

func writeProblem(w http.ResponseWriter, r *http.Request, p Problem, err error) {
	logProblem(r.Context(), p, err)
	writeResponse(w, p.encode())
}

func logProblem(ctx context.Context, p Problem, err error) {
	if n, ok := ctx.Value(ctxProblemCode).(*string); ok {
		*n = p.Code
	}
	// A draining process's 503 on /readyz is what it is meant to answer,
	// not a failure: the request line says it.
	if p.Status >= 500 && !errors.Is(err, errDraining) {
		loggerFrom(ctx).ErrorContext(ctx, "request failed", slog.String("code", p.Code), slog.Any("error", err))
	}
}
