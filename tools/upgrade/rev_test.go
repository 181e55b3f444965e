package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The rule for the previous release, on a repository made for the test:
// each case adds what moves the choice, in the order the rule looks.
func TestPreviousRelease(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is not installed: the rule reads a repository's history (apt-get install git)")
	}
	dir := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		out, err := git(dir, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	write := func(name, text string) {
		t.Helper()
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(name, text, message string) string {
		t.Helper()
		write(name, text)
		run("add", name)
		run("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", message)
		return run("rev-parse", "HEAD")
	}
	want := func(from, wantRev, wantRule string) {
		t.Helper()
		got, err := previousRelease(dir, from)
		if err != nil {
			t.Fatalf("previousRelease(%q): %v", from, err)
		}
		if got.Rev != wantRev || !strings.Contains(got.Rule, wantRule) {
			t.Errorf("previousRelease(%q) = %s (%s), want %s (rule containing %q)", from, got.Rev, got.Rule, wantRev, wantRule)
		}
	}

	run("init", "-q")
	first := commit("db/migrations/000001_a.up.sql", "CREATE TABLE a ();", "first schema")
	if _, err := previousRelease(dir, ""); err == nil {
		t.Error("the commit that made the first schema has no parent, and no error said so")
	}
	second := commit("db/migrations/000002_b.up.sql", "CREATE TABLE b ();", "second migration")
	want("", first, "the parent of")
	// Commits that change no up migration move nothing; a down file is
	// not a schema change either.
	commit("README", "x", "docs")
	down := commit("db/migrations/000002_b.down.sql", "DROP TABLE b;", "a down file")
	want("", first, "the parent of "+second[:12])
	// An edited up migration is a schema change.
	edited := commit("db/migrations/000002_b.up.sql", "CREATE TABLE b (x int);", "edit a migration")
	want("", down, "the parent of "+edited[:12])
	// An up migration the work tree has and HEAD has not: HEAD.
	head := run("rev-parse", "HEAD")
	write("db/migrations/000003_c.up.sql", "CREATE TABLE c ();")
	want("", head, "HEAD")
	if err := os.Remove(filepath.Join(dir, "db", "migrations", "000003_c.up.sql")); err != nil {
		t.Fatal(err)
	}
	// A v* tag HEAD descends from wins, but not HEAD's own tag.
	run("tag", "v1.0.0", second)
	run("tag", "not-a-release", edited)
	want("", second, "tag v1.0.0")
	run("tag", "v1.1.0", "HEAD")
	want("", second, "tag v1.0.0")
	later := commit("db/migrations/000003_c.up.sql", "CREATE TABLE c ();", "third migration")
	want("", head, "tag v1.1.0")
	// UPGRADE_FROM wins over everything.
	want("v1.0.0", second, "UPGRADE_FROM=v1.0.0")
	want(first[:10], first, "UPGRADE_FROM")
	if _, err := previousRelease(dir, "no-such-rev"); err == nil {
		t.Error("UPGRADE_FROM=no-such-rev: no error")
	}

	// A shallow clone cannot say; outside git neither.
	shallow := t.TempDir()
	out, err := exec.Command("git", "clone", "-q", "--depth=1", "file://"+dir, shallow).CombinedOutput()
	if err != nil {
		t.Fatalf("git clone --depth=1: %v\n%s", err, out)
	}
	if _, err := previousRelease(shallow, ""); !errors.Is(err, errNoHistory) {
		t.Errorf("shallow clone: err = %v, want errNoHistory", err)
	}
	if got, err := previousRelease(shallow, later); err != nil || got.Rev != later {
		t.Errorf("shallow clone with UPGRADE_FROM=HEAD's commit: %v %v", got, err)
	}
	if _, err := previousRelease(t.TempDir(), ""); !errors.Is(err, errNoHistory) {
		t.Errorf("outside git: err = %v, want errNoHistory", err)
	}
}

func TestInCI(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "false": false, "FALSE": false, "1": true, "true": true} {
		if got := inCI(func(string) string { return v }); got != want {
			t.Errorf("CI=%q: inCI = %v, want %v", v, got, want)
		}
	}
}
