// Package stripeproc is the Stripe adapter of processor.Processor
// (requirement S7), through stripe-go: a charge is a PaymentIntent created
// and confirmed in one call, a refund a Refund of that PaymentIntent.
//
// # The derived key, twice
//
// Each call sends the payment machine's derived key (S2) as Stripe's
// Idempotency-Key, so Stripe runs a resend of it at most once while it
// keeps the key (24 hours), and also writes it into the object's metadata
// (MetadataKey): Stripe has no "find by idempotency key", so a lookup
// searches the metadata instead.
//
// # Lookups lag (LookupLag)
//
// ChargesByIdempotencyKey uses the Search API
// (GET /v1/payment_intents/search), which Stripe documents as eventually
// consistent: a new PaymentIntent may take up to a minute to appear, longer
// during an outage at Stripe. An empty search is therefore "not found
// yet", never "no charge": LookupLag (Config.SearchLag, a minute by
// default) is added by the payment machine to its settle window, so a
// resend goes out only once the call can no longer land and the search
// has had time to show it. Refunds are listed with GET /v1/refunds, which
// reads what Stripe wrote; the one window covers them too.
//
// # What an answer means (S6)
//
// Every answer is classified once, in classify:
//
//	answer                                               class            error
//	2xx, PaymentIntent succeeded                         final            nil
//	2xx, PaymentIntent requires_payment_method/canceled  final            *DeclineError
//	2xx, PaymentIntent stopped (requires_action,
//	requires_capture, requires_confirmation): canceled   final            *DeclineError (abandoned)
//	  ... and its cancel got no 2xx                      outcome unknown  *UnsettledError
//	2xx, any other PaymentIntent status (processing)     outcome unknown  *UnsettledError
//	402 card_error                                       final            *DeclineError
//	401, 403, 404 but resource_missing (our key or URL)  not executed     *UnsettledError, ErrMisconfigured
//	other 4xx invalid_request_error                      final            *RequestError
//	429 (rate_limit, lock_timeout)                       not executed     *UnsettledError
//	409 (a request with the same key is running)         outcome unknown  *UnsettledError
//	4xx idempotency_error (key reused, other params)     outcome unknown  *UnsettledError
//	4xx with Stripe-Should-Retry: true                   outcome unknown  *UnsettledError
//	408, 425, 5xx (whatever Stripe-Should-Retry says)    outcome unknown  *UnsettledError
//	api_connection_error: refused before sending         not executed     *UnsettledError
//	api_connection_error: timeout, reset after sending   outcome unknown  *UnsettledError
//	2xx whose body cannot be read, or names no object    outcome unknown  *UnsettledError
//
// Stripe-Should-Retry says whether a resend with the same key may get
// another answer; it never says whether money moved. So it only ever makes
// an answer less final: a 4xx Stripe would have us retry is not the
// outcome, and a 5xx it would not (Stripe replays a 500 to the same key)
// is still unknown: only a lookup tells.
//
// A 401 (Invalid API Key: wrong, rolled or revoked), a 403 (a restricted
// key without the permission) and a 404 that is not resource_missing
// (Unrecognized request URL: a wrong STRIPE_API_URL) refuse our own
// configuration, never the request (S8, processor.Misconfigured): not
// executed, and the error keeps none of Stripe's message, which names the
// key's last characters.
//
// stripe-go retries by itself (twice by default); the adapter sets
// MaxNetworkRetries to 0, so every answer reaches classify and the payment
// machine decides what follows. Nor does net/http resend a POST on a
// reused connection that closed (noResend).
//
// # PaymentIntents that stop
//
// A PaymentIntent confirmed in its create can still stop at a state that
// waits for an action: requires_action (the customer must authenticate),
// requires_capture (authorized, to be captured), requires_confirmation.
// Read as "processing", such a payment would sit at charge_sent for ever,
// the completer polling it, since nobody here takes those actions: the
// customer is not there, and nothing captures or confirms later. So:
//
//   - The create asks for none of them: off_session and
//     error_on_requires_action (Stripe declines, 402, instead of stopping
//     at requires_action), capture_method automatic (explicit, whatever
//     the account's or the API version's default).
//   - One that stops anyway, seen in the create's answer or in a lookup,
//     is canceled at once (cancellation_reason abandoned) and read as a
//     decline with decline code "abandoned": no money moved, and it can
//     never move now. No settle window is waited: these states do not
//     end by themselves, so waiting would only delay the same cancel. A
//     cancel without a 2xx leaves the outcome unknown, and the next lookup
//     cancels again; a cancel refused because it succeeded meanwhile shows
//     as succeeded in that lookup.
//
// # Webhooks
//
// Stripe signs with Stripe-Signature, the t=,v1= scheme of
// internal/webhook. VerifyWebhook maps Stripe's event types onto the
// payment machine's: payment_intent.succeeded is charge.succeeded,
// payment_intent.payment_failed and payment_intent.canceled are
// charge.failed, charge.refunded is charge.refunded; every other type is
// recorded under "stripe:<type>" with no effect (Stripe's own
// charge.succeeded names a ch_ Charge, not the PaymentIntent the payment
// knows, and must not be taken for ours), and so is a charge.refunded
// about a charge with no PaymentIntent (a legacy charge on the account).
package stripeproc
