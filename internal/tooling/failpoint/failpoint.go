//go:build !failpoints

// Package failpoint marks the places where crash tests stop the real server
// binary: between a commit and the response, between two payment steps. In
// a normal build Inject compiles to nothing. Built with -tags failpoints,
// the FAILPOINTS environment variable arms them (see failpoint_on.go).
package failpoint

// Enabled reports whether failpoints are compiled in.
const Enabled = false

// Inject does nothing in a normal build.
func Inject(name string) {}
