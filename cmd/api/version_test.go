package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/buildinfo"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// parseVersion reads what `api version` printed: name -> value.
func parseVersion(t *testing.T, out string) map[string]string {
	t.Helper()
	fields := map[string]string{}
	for line := range strings.Lines(out) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(name, "(") {
			continue
		}
		fields[name] = strings.TrimSpace(value)
	}
	for _, name := range []string{"version", "revision", "time", "modified", "go"} {
		if fields[name] == "" {
			t.Fatalf("api version printed no %s line:\n%s", name, out)
		}
	}
	return fields
}

// api version needs no configuration (a broken one included) and prints
// the Go version that built it; extra arguments are a usage error.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	broken := func(name string) string {
		if name == "IDEMPOTENCY_TTL" {
			return "forever"
		}
		return ""
	}
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"version"}, broken, &stdout, &stderr); err != nil {
		t.Fatalf("api version: %v", err)
	}
	fields := parseVersion(t, stdout.String())
	if fields["go"] != runtime.Version() {
		t.Errorf("go %q, want %q", fields["go"], runtime.Version())
	}
	err := run(context.Background(), []string{"version", "--short"}, broken, &stdout, &stderr)
	if !errors.Is(err, errUsage) {
		t.Errorf("api version --short: %v, want a usage error", err)
	}
}

// A binary built in a git checkout with VCS stamping prints the module
// version, revision, time and modified flag the go command stamped into it
// (go version -m reads the same build information from the file).
func TestVersionOfAStampedBinary(t *testing.T) {
	t.Parallel()
	if err := exec.Command("git", "rev-parse", "--is-inside-work-tree").Run(); err != nil {
		t.Skipf("not a git checkout, nothing to stamp: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "api")
	build := exec.Command("go", "build", "-buildvcs=true", "-trimpath", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("api version: %v", err)
	}
	got := parseVersion(t, string(out))
	t.Logf("api version:\n%s", out)

	meta, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	want := map[string]string{}
	for line := range strings.Lines(string(meta)) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "mod":
			want["version"] = f[2]
		case len(f) == 2 && f[0] == "build":
			if k, v, ok := strings.Cut(f[1], "="); ok {
				want[strings.TrimPrefix(k, "vcs.")] = v
			}
		}
	}
	for _, name := range []string{"version", "revision", "time", "modified"} {
		if got[name] != want[name] {
			t.Errorf("%s %q, want %q as go version -m reads it", name, got[name], want[name])
		}
	}
	if !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(got["revision"]) {
		t.Errorf("revision %q is no git commit hash", got["revision"])
	}
	if got["version"] == "(devel)" {
		t.Errorf("version (devel): the go command stamped no module version from the VCS")
	}
	if (got["modified"] == "true") != strings.HasSuffix(got["version"], "+dirty") {
		t.Errorf("modified %s with version %s: a modified tree's version ends in +dirty", got["modified"], got["version"])
	}
}

// /metrics carries payments_build_info = 1 with the labels api version
// prints for the same binary.
func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(apiBinary(t), "version").Output()
	if err != nil {
		t.Fatalf("api version: %v", err)
	}
	v := parseVersion(t, string(out))
	srv := startServer(t, testdb.New(t))
	// Prometheus writes the labels sorted by name.
	sample := fmt.Sprintf(`%s{goversion=%q,revision=%q,version=%q}`, buildinfo.Metric, v["go"], v["revision"], v["version"])
	if got := metric(t, srv, sample); got != 1 {
		t.Errorf("%s = %v, want 1; the build_info lines of /metrics:\n%s", sample, got, metricLines(t, srv, buildinfo.Metric))
	}
}

// metricLines returns the lines of a process's /metrics that start with
// name.
func metricLines(t *testing.T, p *serverProcess, name string) string {
	t.Helper()
	res, err := client.Get(p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), name) {
			b.WriteString(sc.Text() + "\n")
		}
	}
	return b.String()
}
