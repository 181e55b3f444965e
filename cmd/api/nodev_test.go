package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A binary built as make image builds it (-tags nodev) links neither the
// embedded NATS server nor the tooling of development mode (the private
// PostgreSQL, the processor simulator), and its dev command says why it is
// missing; the rest of the command line is the same. Mutation: drop the
// build constraint of dev.go and the build fails (dev declared twice);
// import natstmp from serve.go and the module list names nats-server.
func TestProductionBuildLeavesOutDevelopmentMode(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "api")
	if out, err := exec.Command("go", "build", "-tags", "nodev", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags nodev: %v\n%s", err, out)
	}
	mods, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, linked := range []string{"github.com/nats-io/nats-server/v2"} {
		if strings.Contains(string(mods), linked) {
			t.Errorf("the -tags nodev binary links %s:\n%s", linked, mods)
		}
	}
	syms, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"internal/tooling/", "nats-server/v2/server."} {
		if strings.Contains(string(syms), pkg) {
			t.Errorf("the -tags nodev binary has symbols of %s", pkg)
		}
	}
	out, err := exec.Command(bin, "dev").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "built without development mode") {
		t.Errorf("api dev of a -tags nodev binary: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "version").CombinedOutput(); err != nil || !strings.Contains(string(out), "revision") {
		t.Errorf("api version of a -tags nodev binary: %v\n%s", err, out)
	}
}
