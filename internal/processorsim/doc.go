// Package processorsim owns the payment processor simulator: a small,
// Stripe-shaped HTTP API that the payments API calls over the network
// (requirement S5). It serves the wire types of internal/processor.
//
// What it simulates:
//
//   - Idempotency. POST /v1/charges and POST /v1/refunds require an
//     Idempotency-Key header. The first call with a key that executes has
//     its exact response (status and body) stored; every later call with
//     that key gets the stored response again, marked with the header
//     Idempotent-Replayed: true, and creates nothing. Reusing a key with
//     other parameters, or on the other endpoint, is an idempotency_error.
//     Keys are global across both endpoints, as at Stripe. Calls rejected
//     before executing (a malformed body, an unknown payment method, a
//     refund above the refundable amount) store nothing, so the key stays
//     free. Calls with one key are serialized: a duplicate arriving while
//     the first executes waits for it and then gets the replay.
//   - A processor without idempotency support (requirement S4). With
//     IgnoreIdempotencyKeys every call executes; keys are recorded on the
//     charges and refunds but never consulted, so a retry charges twice and
//     GET /v1/charges?idempotency_key=K shows the duplicates that
//     reconciliation must compensate.
//   - Card outcomes, decided by the test payment method (PaymentMethodVisa
//     and so on). A decline still creates a failed charge, as at Stripe.
//   - Faults, one-shot per call and queued per path: no answer at all
//     (FaultTimeout), a 500 without executing (FaultServerError), executed
//     but the connection closed before any response (FaultLostResponse),
//     and extra latency (FaultLatency); plus a latency added to every call.
//   - A record of every call to /v1 (Calls), which tests use to assert on
//     the side effect itself (requirement T4) rather than on status codes.
//
// The HTTP API:
//
//	POST /v1/charges                 create a charge
//	GET  /v1/charges                 list; filters: idempotency_key=K, or
//	                                 metadata_key=K&metadata_value=V
//	GET  /v1/charges/{id}            one charge
//	POST /v1/refunds                 refund a succeeded charge
//	GET  /v1/refunds                 list; filter: charge=ch_...
//	GET  /_sim/calls                 the call record
//	POST /_sim/faults                queue a fault: {"path":"/v1/charges",
//	                                 "kind":"timeout|server_error|lost_response|latency",
//	                                 "latency_ms":N}
//	POST /_sim/mode                  {"ignore_idempotency_keys":bool,"latency_ms":N};
//	                                 either field may be omitted
//	POST /_sim/reset                 forget everything and restore the
//	                                 configured mode
//
// State lives in memory. Run as its own process (cmd/processor), the
// simulator survives restarts of the API, which crash tests need; started
// inside another process (Start) it lives and dies with that process.
// Either way it does not survive its own restart.
package processorsim
