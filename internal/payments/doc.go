// Package payments owns payments and refunds: requests whose side effect
// leaves our database, because they call an external payment processor.
// They cannot claim, execute and record in one transaction, so they run as
// a state machine (S1) on internal/idem's multi-step keys:
//
//	started ─(tx 1: claim + payment row, marked charge_sent)─▶ charge_sent ─(charge call, derived key)─▶ (tx 2: outcome + response) ─▶ finished
//
// Every step commits with the key's recovery point, under the lease's
// fencing token (S3). Only a final processor answer completes the key
// (S6). Any other answer releases it at charge_sent (503 to the client);
// the retry, or the Completer for a client that never comes back, resumes
// there: it looks the charge up by the derived key (S2) and sends again
// only once the settle window has passed since the last call with nothing
// found, because the processor may still execute a call whose caller gave
// up (unsettled.go). The reconciliation sweep (sweep.go) looks again after
// the window and refunds a charge that landed late beside the recorded one
// (S4).
//
// Files: payments.go holds what payments and refunds share (the endpoints,
// the errors, the Service); events.go the events they publish; payment.go the payment, its stored states and
// its reads; refund.go the refund, its stored states, its reads and its
// steps; charge.go the payment's steps; flow.go drives the state machine;
// create.go is its first transaction; unsettled.go the settle-window rule
// both share; sweep.go the reconciliation sweep; completer.go the
// background worker.
//
// The natural-key backstop (N1) is a partial unique index: at most one
// payment per order that has not been declined or failed.
package payments
