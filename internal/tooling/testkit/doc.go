// Package testkit holds the helpers that the tests of several packages
// share, so that each exists once instead of as a copy per package.
//
// It is a normal package, not a _test.go file, because test files of one
// package cannot import those of another; but only tests import it, and
// production code must not. It imports nothing of this module, so any
// package's tests, internal or external, can use it without an import
// cycle.
package testkit
