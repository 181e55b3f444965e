// Package simproc is the adapter of processor.Processor to the processor
// simulator (requirements S5, S7): its wire format and the client the API
// uses to call it over HTTP.
//
// The JSON types here, with the charges, refunds and events of package
// processor whose JSON form they carry, are the one definition of that
// format: the simulator in internal/tooling/processorsim serves exactly
// these types, so client and simulator cannot drift apart.
//
// # What an answer means (S6)
//
// Every answer is classified once, in classify, into one of the three
// classes of package processor:
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
// processor.Misconfigured): the payment machine treats it as any call not
// executed, and processor_misconfigured_calls_total counts it for an
// alert. What each class allows is package processor's to say.
//
// List calls (ChargesByIdempotencyKey, RefundsByCharge, ...) read every
// page: a lookup that stopped at the first page would take "not found"
// for an answer.
//
// The client itself never retries: retries, their budget and the decision
// to look up instead belong to the payment state machine (requirement S1).
package simproc
