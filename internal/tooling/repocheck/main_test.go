package repocheck

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestMain runs the tests at the module's root, so that every path they
// read (docs/layout.md, the Makefile, openapi.yaml, .tools/) is written as
// the repository shows it, and git, go list and make run where a developer
// runs them.
func TestMain(m *testing.M) {
	root, err := moduleRoot()
	if err == nil {
		err = os.Chdir(root)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "repocheck:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// moduleRoot walks up from the working directory (the package's, under go
// test) to the first directory that holds go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod in the working directory or above it")
		}
		dir = parent
	}
}
