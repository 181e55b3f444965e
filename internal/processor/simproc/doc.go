// Package processor owns the wire format of the payment processor and the
// client the API uses to call it over HTTP (requirement S5).
//
// The JSON types here are the one definition of that format: the simulator
// in internal/tooling/processorsim serves exactly these types, so client and
// simulator cannot drift apart.
//
// # What an answer means (S6)
//
// Every answer is classified once, in classify, into one of three classes.
// The class, not the status code, decides what a caller may do next; only
// a final answer may complete an idempotency key or mark a payment failed.
//
//	answer                                         class            error
//	2xx                                            final            nil
//	402 card declined                              final            *DeclineError
//	401, 403, 404 but resource_missing (ours)      not executed     *UnsettledError, ErrMisconfigured
//	other 4xx about the request (400, 404, 422)    final            *RequestError
//	429 rate limited                               not executed     *UnsettledError, ErrNotExecuted
//	connection refused (nothing was sent)          not executed     *UnsettledError, ErrNotExecuted
//	409 another call with this key is running      outcome unknown  *UnsettledError, ErrOutcomeUnknown
//	4xx idempotency_error (key reused)             outcome unknown  *UnsettledError, ErrOutcomeUnknown
//	408, 425, 5xx, 1xx, 3xx                        outcome unknown  *UnsettledError, ErrOutcomeUnknown
//	timeout, reset or EOF after sending            outcome unknown  *UnsettledError, ErrOutcomeUnknown
//	2xx whose body cannot be read                  outcome unknown  *UnsettledError, ErrOutcomeUnknown
//
// A 401, a 403 or a 404 that names no missing object refuses our own
// configuration (the secret key, the URL), never the request (S8,
// Misconfigured): the payment machine treats it as any call not executed,
// and processor_misconfigured_calls_total counts it for an alert.
//
// "Not executed" means this call did nothing; a call sent before it may
// still land. "Outcome unknown" means the charge may exist, may appear
// later (a processor keeps executing a call whose caller gave up), or
// another call with the same key is still running and may succeed. The only
// safe resend reuses the same idempotency key, and against a processor that
// ignores keys (S4) even that is safe only once the earlier call can no
// longer land: see docs/payments.md, "Unknown outcomes".
//
// List calls (ChargesByIdempotencyKey, RefundsByCharge, ...) read every
// page: a lookup that stopped at the first page would take "not found"
// for an answer.
//
// The client itself never retries: retries, their budget and the decision
// to look up instead belong to the payment state machine (requirement S1).
package simproc
