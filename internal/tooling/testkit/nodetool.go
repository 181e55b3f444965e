package testkit

import (
	"os"
	"path/filepath"
	"testing"
)

// NodeTool finds name, a tool installed from .tools/package.json (npm ci
// in .tools/, which .ci/run does), with root the repository's root as the
// calling test's directory reaches it. On CI its absence fails the test;
// elsewhere it skips.
func NodeTool(t testing.TB, root, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join(root, ".tools", "node_modules", ".bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not installed (.ci/run installs it: npm ci --prefix .tools)", name)
	}
	t.Skipf("%s is not installed: npm ci --prefix .tools", name)
	return ""
}
