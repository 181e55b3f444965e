// Package testdb gives tests real PostgreSQL databases, each a fresh clone
// of a template database that is migrated once.
//
// A test binary opts in from TestMain:
//
//	func TestMain(m *testing.M) { testdb.Main(m) }
//
// With TEST_DATABASE_URL set, that server is used; its URL must let us
// CREATE DATABASE. Otherwise the first test that asks for a database starts
// a private server (package pgtmp) in a temporary directory, stopped when
// the tests end.
//
// The template is named after a hash of the migration files, so a changed
// migration builds a new one, and test binaries sharing one server build it
// once between them. Cloning a template costs a few milliseconds, which is
// why every test can afford its own database; tests that only need
// isolation inside one connection may still prefer a rolled-back
// transaction.
package testdb
