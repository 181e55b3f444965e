package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/webhook"
)

// webhookError is a webhook rejected before anything was written.
type webhookError struct{ err error }

func (e *webhookError) Error() string { return e.err.Error() }
func (e *webhookError) Unwrap() error { return e.err }

// webhookResponse is the body of a webhook's 200.
type webhookResponse struct {
	Received bool   `json:"received"`
	EventID  string `json:"event_id"`
	// Result says what the event did: confirmed, compensating, recorded,
	// or duplicate (processed before: nothing done).
	Result string `json:"result"`
}

// processorWebhook is POST /v1/webhooks/processor. It verifies
// the signature over the raw bytes before parsing or writing anything,
// applies the event in one transaction with its inbox row, and answers
// 200 only after that transaction committed: a crash before the answer
// leaves the processor retrying, and the retry is a duplicate (200, no
// effect) or, if nothing committed, applies the event.
func (a *api) processorWebhook(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		writeError(w, r, &bodyError{http.StatusBadRequest, CodeInvalidJSON, "Invalid JSON body", fmt.Errorf("read body: %w", err)})
		return
	}
	if len(body) > MaxBodyBytes {
		writeError(w, r, &bodyError{http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "Body too large",
			fmt.Errorf("the body exceeds %d bytes", MaxBodyBytes)})
		return
	}
	// The bytes as received: the signature covers them (M4), not a
	// re-encoding.
	// The processor's adapter knows its signature header and its events'
	// shape; the secrets are this deployment's.
	ev, err := a.payments.VerifyProcessorEvent(body, r.Header, webhook.Verifier{
		Scheme: a.webhookScheme, Secrets: a.webhookSecrets, Tolerance: a.webhookTolerance,
	})
	switch {
	case errors.Is(err, processor.ErrBadEvent):
		writeError(w, r, &bodyError{http.StatusBadRequest, CodeInvalidJSON, "Invalid JSON body", err})
		return
	case err != nil:
		writeError(w, r, &webhookError{err})
		return
	}
	result, err := a.payments.HandleProcessorEvent(r.Context(), ev)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, webhookResponse{Received: true, EventID: ev.ID, Result: string(result)})
}
