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
//     other parameters, or on the other endpoint, is a 400
//     idempotency_error with code idempotency_key_reused. Keys are global
//     across both endpoints, as at Stripe. Calls rejected before executing
//     (a malformed body, an unknown payment method, a refund above the
//     refundable amount) store nothing, so the key stays free.
//   - Calls in flight. A call is accepted once its body is read, its key
//     checked and its parameters validated. From then until its response
//     is stored the key is in flight, and another call with it gets 409
//     idempotency_error with code idempotency_key_in_use: not a replay,
//     not an execution, nothing stored. Only calls held by a latency or
//     late_execution fault stay in flight for long; any other call looks
//     up its key, executes and stores its response in one step.
//   - A processor without idempotency support (requirement S4). With
//     IgnoreIdempotencyKeys every call executes, even one whose key is in
//     flight; keys are recorded on the charges and refunds but never
//     consulted, so a retry charges twice and
//     GET /v1/charges?idempotency_key=K shows the duplicates that
//     reconciliation must compensate.
//   - Card outcomes, decided by the test payment method (PaymentMethodVisa
//     and so on). A decline still creates a failed charge, as at Stripe.
//   - Faults, one-shot per call and queued per path. Answered before the
//     call is accepted, without executing or storing anything: no answer
//     at all (FaultTimeout), a 500 (FaultServerError), or any answer that
//     is not an outcome (FaultStatus: 401 and 403 refusing the caller's
//     key, 408, 425, 429 with Retry-After and a rate_limit_error, 500,
//     502, 503, 504). After acceptance: executed
//     but the connection closed before any response (FaultLostResponse);
//     held with the key in flight, then executed, unless the client gave
//     up meanwhile (FaultLatency); held whether or not the client is
//     still there, then executed and stored, answering only a client
//     still connected (FaultLateExecution: the charge lands after its
//     caller gave up, as at a processor that keeps working on a call
//     whose client disconnected). Plus a latency added to every call.
//   - A bound on execution. No call lands later than MaxExecution (30 s)
//     after it arrived: faults holding a call longer are rejected, and a
//     call still waiting when MaxExecution passes is dropped without
//     executing. Callers' settle windows rest on this bound. A call held
//     by a fault also gives up without executing when the server shuts
//     down (Server.Shutdown, so shutdown stays bounded) or when Reset
//     forgets the state it belongs to.
//   - Webhooks (webhooks.go). With a URL set, every charge and refund
//     becomes an event (charge.succeeded, charge.failed, charge.refunded)
//     delivered at least once: signed like Stripe's with every configured
//     secret, retried on non-2xx and timeouts on a backoff, and, by
//     one-shot fault, duplicated or delayed so later events overtake it.
//   - A record of every call to /v1 (Calls), which tests use to assert on
//     the side effect itself (requirement T4) rather than on status codes.
//     WaitIdle (or GET /_sim/idle) waits until no call is held by a fault,
//     so a test can wait for a late charge to land without sleeping.
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
//	GET  /_sim/idle                  204 once no call is held by a fault
//	POST /_sim/faults                queue a fault: {"path":"/v1/charges",
//	                                 "kind":"timeout|server_error|status|lost_response|latency|late_execution",
//	                                 "latency_ms":N, "status":N, "retry_after_ms":N}
//	                                 (latency_ms up to 30000, for latency and
//	                                 late_execution; status for status;
//	                                 retry_after_ms for status 429, default 1000)
//	POST /_sim/mode                  {"ignore_idempotency_keys":bool,"latency_ms":N,
//	                                 "refuse_key":bool}; any field may be omitted;
//	                                 refuse_key answers every /v1 call 401
//	                                 unexecuted and unrecorded (a revoked key)
//	POST /_sim/reset                 forget everything and restore the
//	                                 configured mode
//	POST /_sim/webhooks              {"url":"...","secrets":["..."]}: deliver events
//	POST /_sim/webhook-faults        {"duplicates":N,"delay_ms":N} for the next event
//	GET  /_sim/deliveries            every webhook delivery attempt
//
// Lists are pages, oldest first, as at Stripe: limit=N (1 to 100, default
// 10) items after the one named by starting_after=<id>, and has_more when
// more follow. Filters apply before paging. A bad limit is a 400
// parameter_invalid; an unknown starting_after is a 400 resource_missing.
//
// State lives in memory. Run as its own process (tools/processor), the
// simulator survives restarts of the API, which crash tests need; started
// inside another process (Start) it lives and dies with that process.
// Either way it does not survive its own restart.
package processorsim
