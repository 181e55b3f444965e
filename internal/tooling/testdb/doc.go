// Package testdb gives tests real PostgreSQL databases in two tiers, both
// cloned from a template database that is migrated once.
//
// A test binary opts in from TestMain:
//
//	func TestMain(m *testing.M) { testdb.Main(m) }
//
// # Which tier
//
// Tx is the default, the fast tier: a transaction on a database that the
// whole test binary shares, rolled back when the test ends. It costs one
// BEGIN, so tests using it run in parallel and leave nothing behind. Use
// it for logic that one transaction can exercise: validation against real
// constraints, inserts and reads, the natural-key backstop, pagination,
// authentication. Code that opens its own transactions through a
// db.Beginner works inside it, as savepoints. Write under a fresh tenant
// in each test, so that parallel tests never touch the same rows.
//
// New and NewPool give a test a database of its own. Use them when the
// behaviour under test needs what one transaction cannot show: real
// commits (a crash after commit, what a second transaction sees), several
// connections at once (concurrent duplicates, lock waits and lock
// timeouts), or several processes on one database (a real server started
// by the test). CreateEmptyDatabase is for tests of the migrations
// themselves.
//
// # The server
//
// With TEST_DATABASE_URL set, that server is used; its URL must let us
// CREATE DATABASE. Otherwise the first test that asks for a database starts
// a private server (package pgtmp) in a temporary directory, stopped when
// the tests end.
//
// The template is named after a hash of the migration files, so a changed
// migration builds a new one, and test binaries sharing one server build it
// once between them. Cloning a template costs a few milliseconds, which is
// why a test that needs real commits can afford a database of its own; the
// database behind Tx is cloned once per test binary, lazily, and dropped
// by Main when the tests end.
package testdb
