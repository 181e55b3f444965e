// Package processor owns the wire format of the payment processor and the
// client the API uses to call it over HTTP (requirement S5).
//
// The JSON types here are the one definition of that format: the simulator
// in internal/processorsim serves exactly these types, so client and
// simulator cannot drift apart.
//
// Every error from a call the client sent falls in one of three classes,
// and the class decides what a caller may do next:
//
//   - *DeclineError (HTTP 402): the processor refused the card. Final;
//     retrying gives the same answer.
//   - *RequestError (other 4xx): the request itself is wrong (unknown
//     charge, amount too large, key reused with other parameters). Final.
//   - ErrTransient (timeouts, connection errors, a response lost mid-way,
//     5xx, 429): the outcome is unknown or the processor is unavailable.
//     The charge may or may not exist. Retry with the SAME idempotency key,
//     or ask the processor (ChargesByIdempotencyKey) what happened
//     (requirement S4); never retry with a fresh key.
//
// The client itself never retries: retries, their budget and the decision
// to reconcile instead belong to the payment state machine (requirement S1).
package processor
