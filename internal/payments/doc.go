// Package payments owns payments and refunds: requests whose side effect
// leaves our database, because they call an external payment processor.
// They cannot claim, execute and record in one transaction, so they run as
// a state machine (S1) on internal/idem's multi-step keys:
//
//	started ─(tx 1: claim + payment row)─▶ payment_created
//	payment_created ─(tx)─▶ charge_sent ─(charge call, derived key)─▶ (tx 2: outcome + response) ─▶ finished
//
// Every step commits with the key's recovery point, under the lease's
// fencing token (S3). A processor timeout, 5xx or lost answer releases the
// key at charge_sent (503 to the client); the retry, or the Completer for a
// client that never comes back, resumes there with the same derived key
// (S2), so the processor's deduplication guarantees one charge. A resumed
// attempt first looks the charge up by that key, which is what keeps a
// processor without idempotency support from charging twice, and refunds
// any duplicate it finds (S4).
//
// Refunds follow the same machine: refund_created ─▶ refund_sent ─▶ finished.
//
// The natural-key backstop (N1) is a partial unique index: at most one
// payment per order that has not been declined or failed.
package payments
