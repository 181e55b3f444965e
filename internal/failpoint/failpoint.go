//go:build !failpoints

// Package failpoint marks the places where crash tests stop the real server
// binary: between a commit and the response, between two payment steps,
// between a publish and its mark.
//
// It ships in every binary, because the code it marks does: idem, the
// outbox relay, the consumer and the payment flow call Inject on their
// paths. In a normal build that costs nothing: Inject is an empty function
// the compiler inlines away, Enabled is a constant false, and nothing reads
// the FAILPOINTS environment variable. Only a binary built with -tags
// failpoints (the crash tests of cmd/api build one) arms them, from
// FAILPOINTS (see failpoint_on.go).
package failpoint

// Enabled reports whether failpoints are compiled in.
const Enabled = false

// Inject does nothing in a normal build.
func Inject(name string) {}
