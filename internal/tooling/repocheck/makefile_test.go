package repocheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// make migrate-new runs under a POSIX /bin/sh (Debian's is dash, which has
// no 10#): it creates the next pair of files, numbered past the last, and
// creates nothing at all for a name it refuses.
func TestMigrateNewUnderPOSIXShell(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "db", "migrations"), 0o755); err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Makefile"), makefile, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"000009_x.up.sql", "000009_x.down.sql", "000010_y.up.sql", "000010_y.down.sql"} {
		if err := os.WriteFile(filepath.Join(dir, "db", "migrations", f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	migrations := func() []string {
		entries, err := os.ReadDir(filepath.Join(dir, "db", "migrations"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	run := func(name string) error {
		cmd := exec.Command("make", "-s", "migrate-new", "NAME="+name, "SHELL=/bin/sh")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		t.Logf("make migrate-new NAME=%q: %s", name, out)
		return err
	}
	if err := run("add_things"); err != nil {
		t.Fatalf("make migrate-new NAME=add_things: %v", err)
	}
	got := migrations()
	for _, want := range []string{"000011_add_things.up.sql", "000011_add_things.down.sql"} {
		if !slices.Contains(got, want) {
			t.Errorf("migrations = %v, want %s", got, want)
		}
	}
	for _, bad := range []string{"", "Bad name", "x;touch y"} {
		if err := run(bad); err == nil {
			t.Errorf("make migrate-new NAME=%q succeeded, want a refusal", bad)
		}
	}
	if after := migrations(); len(after) != len(got) {
		t.Errorf("refused names created files: %v, want only %v", after, got)
	}
}

// make help lists every documented target, the descriptions in one column
// however long the longest target name.
func TestMakeHelpAligns(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := regexp.MustCompile(`(?m)^([a-zA-Z_-]+):.*## (.*)$`).FindAllStringSubmatch(string(makefile), -1)
	if len(targets) < 10 {
		t.Fatalf("found %d documented targets in the Makefile: the pattern no longer matches them", len(targets))
	}
	out, err := exec.Command("make", "-s", "--no-print-directory", "help").CombinedOutput()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(targets) {
		t.Fatalf("make help printed %d lines for %d documented targets:\n%s", len(lines), len(targets), out)
	}
	column := -1
	for i, m := range targets {
		name, text := m[1], m[2]
		line := lines[i]
		if !strings.HasPrefix(line, "  "+name+" ") || !strings.HasSuffix(line, "  "+text) {
			t.Errorf("make help line %d = %q, want the target %s and its description", i+1, line, name)
			continue
		}
		at := len(line) - len(text)
		if column < 0 {
			column = at
		}
		if at != column {
			t.Errorf("make help: %s's description starts at column %d, the first one's at %d:\n%s", name, at, column, out)
		}
	}
}
