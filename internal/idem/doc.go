// Package idem makes a mutating request safe to retry: however many times a
// client sends it under one Idempotency-Key, its side effect happens once
// and every retry gets the first outcome back, byte for byte.
//
// Before the claim, nothing is stored (O3):
//
//   - The key (K1): ParseKey accepts the IETF sf-string ("…") and the bare
//     token, 1 to 255 visible ASCII characters, on one header line.
//   - The fingerprint (F1-F4): DecodeStrict rejects a body with more than one
//     reading (duplicate or unknown members, case variants, wrong types,
//     trailing data); Fingerprint hashes the endpoint, the path parameters
//     and the decoded body after Canonicalize (sorted members, one number
//     format, minimal escapes); FingerprintVersion is stored with the hash.
//
// Store.Execute then runs the one-transaction path, in a READ COMMITTED
// transaction:
//
//  1. Claim: INSERT … ON CONFLICT DO NOTHING on the primary key
//     (tenant_id, endpoint, idem_key) (L1, K2).
//  2. Execute: exec runs in the same transaction, inside a savepoint (L2).
//  3. Record: the key row becomes completed with the exact status, the
//     RecordedHeaders and the body bytes, and commits with the business rows (L3).
//  4. Replay: a claim that inserted nothing reads the row instead (L4, L5):
//     completed with the same fingerprint → the stored response, replayed
//     = true (the HTTP layer adds Idempotent-Replayed: true); a different
//     fingerprint → ErrKeyReused (422); in progress → ErrKeyInUse (409 with
//     Retry-After), also when the claim waited longer than
//     Config.LockTimeout on another transaction's uncommitted claim. A key
//     store that is unreachable or fails transiently gives ErrUnavailable
//     (503 with Retry-After): without a claim nothing executes, and nothing
//     is recorded (L6).
//
// Outcomes (O1-O3): a response with status >= 400 is a deterministic
// failure; its savepoint is rolled back (so a statement that aborted the
// transaction leaves no trace) and the failure is recorded and replayed. An
// error from exec rolls everything back, key row included, so the retry
// runs again; transient errors come back wrapped in ErrUnavailable.
//
// Why an insert and not a select: two requests can both see "no row"; only
// the unique index decides between them. Why the wait is bounded: the
// duplicate of a slow request would otherwise hold a connection for as
// long as the first one runs, so after lock_timeout it gets a 409 and
// retries later. Why READ COMMITTED matters: when the insert waited on
// another transaction's claim and that transaction committed, the insert
// does nothing, and the next statement takes a new snapshot that sees the
// committed row, so the duplicate replays it. Under REPEATABLE READ the
// old snapshot would not see it and the duplicate would fail instead.
//
// What it costs (P2): three round trips to PostgreSQL for a create, two for
// a replay. The transaction is a db.Tx, which pipelines: BEGIN and the
// lock_timeout setting travel with the claim; the SAVEPOINT with exec's
// first statement; the RELEASE and the COMMIT with the record. The four
// steps above are still four statements, run in order, each seeing the one
// before it; pipelining only saves the waits between those whose results
// nothing reads. The one rule it adds: COMMIT may travel behind a statement
// only when nothing that statement returns could decide a rollback (see
// db.Tx.CommitAfterNext); an error from it still aborts the transaction and
// the COMMIT then rolls back. TestRoundTripsPerRequest in internal/http
// counts them on the wire.
//
// Side effects outside our database (a payment processor) cannot share one
// transaction; they use the multi-step path in lease.go (S1-S3).
package idem
