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
// Store.Execute then runs the one-transaction path. Its four steps, in the
// order they run:
//
//  1. Replay, looked up first: one read of the key (L4, L5), ahead of the
//     transaction's BEGIN in the round trip of exec's first statement.
//     Completed with the same fingerprint → the stored response, replayed
//     = true (the HTTP layer adds Idempotent-Replayed: true), and exec
//     does not run; a different fingerprint → ErrKeyReused (422);
//     unfinished → ErrKeyInUse (409 with Retry-After). No row: the request
//     is new.
//  2. Execute: in a new READ COMMITTED transaction, exec runs (L2), with
//     an UndoableTx: the transaction's statements and nothing else. No
//     savepoint (see Outcomes).
//  3. Claim and record, in one statement: the key row is inserted on the
//     primary key (tenant_id, endpoint, idem_key) (L1, K2) already
//     completed with the exact status, the RecordedHeaders and the body
//     bytes (L3), as the transaction's last statement, with COMMIT behind
//     it. The business rows and the record commit together or not at all.
//  4. Replay, after a lost race: when that insert finds the key taken, the
//     transaction rolls back, this request's business rows with it, and it
//     answers what the winner recorded, as in step 1.
//
// A key store that is unreachable or fails transiently gives ErrUnavailable
// (503 with Retry-After): nothing the request wrote commits, and nothing is
// recorded (L6).
//
// Outcomes (O1-O3): a response with status >= 400 is a deterministic
// failure (validation, natural-key conflict); its transaction is rolled
// back (so no half-written business row survives, nor a statement that
// aborted it) and the failure is recorded, alone in a transaction of its
// own, and replayed like a success. Rolling back the transaction rather
// than a savepoint keeps SAVEPOINT and RELEASE off the path that commits
// (P7); a failure costs one more round trip instead. Recording it apart
// commits nothing the one transaction would not: its work is rolled back
// either way, and a duplicate that records the key first wins as at step
// 4. An error from exec rolls everything back, and nothing is recorded, so
// the retry runs again; transient errors come back wrapped in
// ErrUnavailable, others as they are.
//
// Why the claim comes last: the key row is then written once, complete,
// instead of inserted in progress and updated to completed (two heap
// tuples, two sets of index entries, twice the WAL): an idempotent create
// costs PostgreSQL little more than the business insert plus that one row
// (P7; docs/load-benchmark.md has the measurements and the shapes that
// lost). Why it is still safe: the primary key decides, at the insert, as
// it did when the insert came first; a duplicate that arrives while the
// first request runs finds no row in step 1 and executes too, but its
// insert waits on the first one's uncommitted row and then fails, and its
// work rolls back with its transaction. Why an insert and not a select:
// two requests can both see "no row"; only the unique index decides
// between them, and the read of step 1 only serves replays. Why the wait
// is bounded: the duplicate of a slow request would otherwise hold a
// connection for as long as the first one runs, so after lock_timeout
// (Config.LockTimeout) its claim gives up with ErrKeyInUse and it retries
// later. A wait past it inside exec, on a business row another transaction
// is writing (another key's order with the same reference), is
// ErrConflictingWrite instead: this request's key is not in use, another
// request's write is. Why READ COMMITTED matters: the read of step 4 takes
// a new snapshot, which sees the row the winner committed while our insert
// waited for it.
//
// The rule exec lives by: every effect through its UndoableTx, and none
// anywhere else. A duplicate runs exec too, concurrently, and all but one
// run roll back (TestExecuteConcurrentDuplicatesCommitOnce counts them);
// so does any run whose transaction fails. An e-mail sent, a message
// published, an HTTP call or a write through the pool inside exec would
// happen once per attempt. UndoableTx makes the transaction's statements
// all that exec gets: no Commit, no Begin, no connection, and no way back
// to the pgx.Tx behind it. To announce a change, write it to the outbox in
// the same transaction (outbox.Write takes the UndoableTx); to call another
// service, use the multi-step path below.
//
// While exec runs, the key has no row: Status reports ErrKeyUnknown, and
// the key budget (budget.go) does not count it. Both last at most until
// the request's deadline plus one lock wait (CommitWindow): every
// statement runs under the request's context. The key-status endpoint
// therefore says, with its 404, how long after a request was sent no
// record becomes final, and the Go client's Resolve waits that long before
// it concludes that nothing committed.
//
// What it costs (P2): two round trips to PostgreSQL for a create, one for
// a replay. The transaction is a db.Tx, asked for by name
// (db.WithPipelinedTxOn; db.WithTx is plain pgx), which pipelines: the
// key's read and IdemKeyAbsent go ahead of BEGIN (db.Ahead), and they,
// BEGIN and the lock_timeout setting travel with exec's first statement;
// the COMMIT with the claim. When the key has a row, IdemKeyAbsent fails,
// the server skips the rest of that round trip (BEGIN and exec's
// statement included) and rolls back, and the read's row is replayed: a
// replay's one round trip runs nothing of exec's in the database (exec's
// Go code runs until its first statement, which returns the failure).
// exec must pass its statements' errors on, as it must anyway; one that
// swallowed this one would find the transaction closed. Since the lookup
// precedes BEGIN READ WRITE, it refuses a standby itself (IdemKeyGet's
// on_primary()): a replay comes from the primary only. The steps above
// are still statements run in order, each seeing the one before it;
// pipelining only saves the waits between those whose results nothing
// reads. The one rule it adds: COMMIT may travel behind a statement only
// when nothing that statement returns could decide a rollback (see
// db.Tx.CommitAfterNext); an error from it still aborts the transaction and
// the COMMIT then rolls back. TestRoundTripsPerRequest in internal/http
// counts them on the wire.
//
// Side effects outside our database (a payment processor) cannot share one
// transaction; they use the multi-step path in lease.go (S1-S3).
//
// A duplicate that finds its key's first attempt in flight gets ErrKeyInUse
// (409), unless its client asked to wait (Prefer: wait=N): then Waiters
// polls the key's row until the answer is recorded and replays it (L7,
// wait.go).
package idem
