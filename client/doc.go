// Package client is the Go client of the payments API. It uses
// idempotency keys the way the server expects them, and retries only what
// is safe and useful to retry.
//
// The types and the one-method-per-operation transport are generated from
// the API's openapi.yaml (package api, checked by `make verify`), so the
// client cannot drift from the contract. This package adds, once, what a
// generator cannot know: the key, the retry policy and the outcome of an
// operation that never got a final answer.
//
// # Quick start
//
//	c, err := client.New("http://localhost:8080", apiKey)
//	key := client.NewKey()          // persist it with the job before sending
//	res, err := c.CreateOrder(ctx, key, api.CreateOrderRequest{
//		Reference: "inv-1001", CustomerId: "cus_42", Amount: 2500, Currency: "EUR",
//	})
//	switch {
//	case err == nil:
//		// res.Value is the order; res.Replayed says an earlier attempt
//		// (or an earlier process) had created it.
//	case errors.Is(err, client.ErrOutcomeUnknown):
//		// No final answer: resolve with the same key, now or later.
//		var unknown *client.OutcomeUnknownError
//		errors.As(err, &unknown)
//		st, err := c.Resolve(ctx, unknown) // what the server recorded (see below)
//	default:
//		// A final answer: *client.Error with the problem's code, such as
//		// client.HasCode(err, "order_reference_exists").
//	}
//
// See examples/createorder for a complete program that resumes an
// operation after a restart.
//
// # One key per logical operation
//
// Every create takes a key. NewKey mints one (128 random bits from
// crypto/rand); an empty key makes the method mint one itself, reported in
// Result.Key and in the error. The same key is sent on every attempt of the
// operation, never a new one per attempt: the key is how the server tells a
// retry (replayed, nothing runs twice) from a new request. A process that
// may crash mid-operation stores the key with its intent before the first
// send and calls the method again with it after a restart; the server then
// replays the recorded answer or runs the request for the first time.
//
// # The retry table
//
//	answer                                  retried  why
//	network error, cut connection           yes      the request may or may not have run; the key makes a retry safe
//	409 idempotency_key_in_use              yes      another attempt with this key is still running; wait Retry-After
//	409 conflicting_write_in_progress       yes      another key's request is writing the same order; nothing recorded, the retry runs (no replay)
//	429 rate_limited                        yes      rejected before the claim: nothing ran
//	502, 503, 504                           yes      a gateway or the server failed transiently; nothing final was recorded
//	400, 401, 403, 404, 422                 no       final: the same request gets the same answer (a recorded one is replayed)
//	409 order_reference_exists and other    no       final: the natural key (or the payment) exists; a retry cannot change that
//	409s (payment_exists, result_expired)
//	2xx, 402, 413, 415, 500                 no       final answers; a 500 was rolled back and may be retried by hand with the key
//
// Reads (GetOrder, ListOrders, GetPayment, KeyStatus) follow the same
// table without a key.
//
// # Waiting
//
// The wait before retry n is full-jitter exponential backoff, uniform in
// [0, min(MaxDelay, BaseDelay·2ⁿ⁻¹)) (defaults 100 ms, 5 s, 5 attempts in
// all). A Retry-After on the answer is the server's minimum and is always
// honoured: the wait is the larger of it and the backoff. The context's
// deadline caps everything: when the next attempt could not start before
// it, the client stops at once with an OutcomeUnknownError instead of
// sleeping for nothing (or retrying before the server asked). A
// Retry-After above Policy.MaxRetryAfter (60 s) also stops it.
//
// # The retry budget
//
// A Budget is a token bucket shared by every operation of a Client: a retry
// costs a token, a final answer earns a tenth of one back, first attempts
// are free. While the API is healthy the bucket stays full; in an outage
// the client sends its callers' first attempts plus at most Capacity
// retries in all (10 by default), so a thousand callers do not turn into
// five thousand requests against a server that is trying to recover.
//
// # Results and unknown outcomes
//
// A success is a Result with the decoded value, the key, the number of
// attempts and Replayed (the server's Idempotent-Replayed header). A final
// failure is an *Error with the problem document (type, code, status) and
// Replayed too. When retries run out without a final answer (attempts,
// budget or deadline exhausted, or the context ended while a request was in
// flight), the error is an *OutcomeUnknownError carrying the key and the
// endpoint and when its last attempt was sent (LastSent): the operation
// may have run, or may still be running. Resolve asks the server's
// key-status endpoint what became of the key: completed, with the recorded
// status and the resource created; in progress; or no record. No record is
// not yet "never ran": the server records a key when its request commits,
// and a request can commit until the server's commit window (its request
// timeout plus one lock wait, which the 404 states) has passed since it
// was sent. So Resolve returns ErrKeyUnknown, "no attempt committed and
// none can any more", only from a lookup sent after that window; inside
// it, Resolve waits the window out and asks again, or, when its context
// ends first, returns a *NotRecordedError (ErrKeyNotYetRecorded) saying
// when to ask again. Sending the same request with the same key again is
// the other way to resolve it, also while an attempt may still run (at
// most one attempt commits), and while the server replays the key's result
// (its TTL, 24 h by default, from when the result was recorded: the
// response's Idempotency-Expires says until when). Past that, until the
// key's retention ends (72 h by default), the same request gets 409
// idempotency_result_expired with the resource's link, never a second
// execution.
//
// # Compared with other clients
//
// stripe-go retries 2 times by default, waiting between 0.5 s and 5 s with
// jitter; it ignores Retry-After and instead follows Stripe's own
// Stripe-Should-Retry header. It also adds a key to every POST. This
// client waits for Retry-After because this server sends it precisely when
// an early retry is useless (a key in use, a rate limit, an outage), and it
// classifies by status and problem code because the contract documents
// them; it has a budget, which stripe-go lacks.
//
// hashicorp/go-retryablehttp retries connection errors, 429 and 5xx for
// every method, with no notion of a key: retrying a POST without one can
// create two orders. Here every retried write carries its operation's key,
// a 500 is not retried (the server rolled back and answered; retrying a
// bug in a loop only adds load) and a 409 is retried only when it means "in
// progress".
//
// The AWS SDKs' standard retry mode is the closest: at most 3 attempts,
// full-jitter exponential backoff capped at 20 s, and a client-wide token
// bucket (500 tokens, 5 per retry, 10 per timeout). It classifies errors
// by service error code and ignores Retry-After. The budget here is the
// same idea with smaller numbers, sized for one API rather than an SDK
// shared by many services; Retry-After is honoured for the reason above.
package client
