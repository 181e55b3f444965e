// Package pgtmp runs a private PostgreSQL server from the locally installed
// server binaries: a persistent cluster for the service's dev mode, or a
// throwaway one per test binary.
//
// The server listens on 127.0.0.1 only, trusts every local connection and
// lives in its own process group, so a Ctrl-C in the terminal reaches the
// parent first and the parent stops the server cleanly. On Linux the server
// also gets a signal when its parent dies, so a killed test binary leaves no
// server behind.
//
// For fault tests a server can also be a streaming standby of another one
// (Options.Standby), run with extra settings, be stopped in PostgreSQL's
// immediate mode or killed outright, and lend its user to helper processes
// such as pgbouncer (Cluster.StartProcess).
//
// PostgreSQL refuses to run as root. When the caller is root, initdb and
// postgres run as the user that owns an existing data directory, or else as
// user postgres (created by Debian's package), or else as nobody; every
// parent of the data directory must then be searchable by that user.
package pgtmp
