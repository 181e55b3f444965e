// Package repocheck holds the tests that keep the repository true to
// itself rather than testing the service: the docs' links and paths, the
// Layout of docs/layout.md against the packages and their imports, the
// Makefile, the tracked files, the dependencies, the requirements table,
// and the contract (openapi.yaml) against its own rules, Spectral's and the
// route table. They run with every other test (make test) and read the
// repository from its root (main_test.go), so they live here and not at
// the root beside the packages a reader came for.
package repocheck
