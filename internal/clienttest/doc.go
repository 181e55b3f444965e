// Package clienttest holds the tests of the Go client that need the server:
// the client (module github.com/idemref/payments/client, in client/) against
// the real API on its own database, through a fault-injecting transport,
// and its idempotent operations against the table of endpoints
// (httpapi.Endpoints). They live in the server's module because a module of
// its own, as the client is (G7), cannot import the server's internal
// packages; the server's go.mod points at client/ with a replace directive,
// so they test the client as it is in the work tree. The client's own tests
// (client/, go test there) need nothing but the standard library.
//
// TestClientModuleStandsAlone builds a program in a throwaway module that
// imports the client as a user would, and checks that it resolves none of
// the server's dependencies.
//
// The package has no code: only tests.
package clienttest
