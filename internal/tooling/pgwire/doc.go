// Package pgwire counts what a PostgreSQL client says to its server, at the
// wire: a TCP proxy between the two that parses the protocol's framing and
// counts, per connection and in total, round trips and statements. It is
// how a test or the load benchmark can say "this one HTTP request cost N
// round trips and M statements" without trusting the code under test to
// report on itself.
//
// A test puts the proxy in front of its database and the code under test
// behind it, then measures one request at a time:
//
//	p, _ := pgwire.Listen("127.0.0.1:5432")
//	defer p.Close()
//	url, _ := p.URL(databaseURL) // give this URL to the server under test
//	got, err := p.Measure(ctx, func() error { _, err := http.Post(...); return err })
//	// got.RoundTrips, got.Statements
//
// Snapshot and Reset give the counts per connection and in total; Record
// and Statements list the statement texts, grouped by round trip.
//
// # Losing a COMMIT
//
// Since the proxy reads both directions, it can also break a connection
// at the worst moment on purpose: CutAtCommit arms it to cut the next
// connection that sends a COMMIT, either after the COMMIT reached the
// server (the transaction committed, the client never hears so) or
// before (the server rolls back). Either way the client sees its
// connection drop while it waits for the COMMIT's answer, and cannot tell
// which happened: what a test of an unknown outcome needs, without
// timing.
//
//	p.CutAtCommit(pgwire.CommitDelivered)
//	err := tx.Commit(ctx) // a connection error, yet the work committed
//
// pgx sends a transaction's COMMIT as a simple Query (pgx.Tx.Commit) or,
// queued in a batch (db.CommitAfterNext), as an extended-protocol Execute
// of a statement prepared from "COMMIT"; the proxy recognises both.
//
// # What is counted
//
// A round trip is one wait of the client on the server. The proxy sees no
// waiting, only messages, so it counts the turns of the conversation: a
// round trip is counted at a client message that arrives after the server
// has answered something since the client's previous message (or after
// the connection became ready). Everything a client sends before the
// server's next answer belongs to that round trip: a pipelined pgx.Batch
// (Parse, Bind, Execute... for every statement, then one Sync) is one
// round trip however many statements it carries.
//
// Not counted as an answer: the server's asynchronous messages
// (NoticeResponse, NotificationResponse, ParameterStatus), which may
// arrive at any time; a real answer always includes another message
// (CommandComplete, ReadyForQuery, ParseComplete...). Not counted as a
// round trip: the connection's startup and authentication (counted as
// Connections instead), and Terminate, which waits for nothing.
//
// A statement is one simple Query message ('Q', counted once even when
// its text holds several statements) or one extended-protocol Execute
// message ('E'). A statement pgx runs for the first time on a connection
// costs an extra round trip (Parse, Describe, Sync) and no statement:
// pgx prepares it once and caches it per connection.
//
// A pgxpool connection that sat idle for more than a second is pinged
// when acquired (an empty simple query): one more round trip and
// statement, which requests under load do not pay.
//
// # Limits
//
// The proxy speaks plain TCP: connect through it with sslmode=disable (see
// URL). A server that accepts an SSL or GSS encryption request makes the
// rest of that connection unreadable; it is then passed through uncounted
// and reported in Counts.Opaque. The definition of a round trip assumes a
// client that waits for an answer before it sends what depends on it,
// which every client does; a client that streams one pipeline in several
// writes while answers to the first part already arrive would be counted
// as several round trips.
package pgwire
