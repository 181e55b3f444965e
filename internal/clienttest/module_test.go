package clienttest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tooling/testkit"
)

// goModJSON is what go mod edit -json prints of a go.mod.
type goModJSON struct {
	Module  struct{ Path string }
	Go      string
	Require []struct {
		Path     string
		Version  string
		Indirect bool
	}
	Replace []struct{ New struct{ Path string } }
}

// readGoMod reads the go.mod of the module at dir.
func readGoMod(t *testing.T, dir string) goModJSON {
	t.Helper()
	var m goModJSON
	if err := json.Unmarshal([]byte(goIn(t, dir, nil, "mod", "edit", "-json")), &m); err != nil {
		t.Fatalf("go mod edit -json in %s: %v", dir, err)
	}
	return m
}

// goIn runs the go command in dir with this test's environment (its
// GOTOOLCHAIN, GOPROXY and caches) plus env, and fails the test, with the
// output, when it fails.
func goIn(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOWORK=off"), env...)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s in %s: %v\n%s%s", strings.Join(args, " "), dir, err, out, stderr)
	}
	return string(out)
}

// clientLinks are the modules a program using the client links, besides
// the client itself: a new one is a decision (docs/client.md lists them).
var clientLinks = []string{
	"github.com/google/uuid",             // the ids in the API's types
	"github.com/oapi-codegen/runtime",    // what the generated client/api calls
	"github.com/apapsch/go-jsonmerge/v2", // which the runtime imports
}

// TestClientModuleStandsAlone (G7): a program in a module of its own, whose
// go line is the client's minimum Go version, imports the client as a user
// would (a require, and here a replace to this tree's client/ in place of a
// tagged version), builds and passes go vet; it links the client and
// clientLinks only, and its module graph holds none of the server's own
// dependencies (no pgx, chi, NATS, ...).
func TestClientModuleStandsAlone(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the go command is not in PATH: the test runs it to build a module that imports the client")
	}
	t.Parallel()
	clientDir, err := filepath.Abs(filepath.Join("..", "..", "client"))
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(clientDir)
	cmod, smod := readGoMod(t, clientDir), readGoMod(t, root)
	if cmod.Module.Path != smod.Module.Path+"/client" {
		t.Fatalf("client/go.mod names module %q, want %q", cmod.Module.Path, smod.Module.Path+"/client")
	}

	// The user's module and, beside it, the clone docs/client.md's
	// replace names (../payments): this repository.
	dir := filepath.Join(t.TempDir(), "clientuser")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root, filepath.Join(filepath.Dir(dir), "payments")); err != nil {
		t.Fatal(err)
	}
	gomod := fmt.Sprintf("module example.com/clientuser\n\ngo %s\n", cmod.Go)
	main := fmt.Sprintf(`package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"%[1]s"
	"%[1]s/api"
)

func main() {
	c, err := client.New("http://127.0.0.1:1", "sk_test", client.WithPolicy(client.Policy{MaxAttempts: 1}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = c.CreateOrder(ctx, client.NewKey(), api.CreateOrderRequest{Reference: "inv-1", CustomerId: "cus_1", Amount: 2500, Currency: "EUR"})
	fmt.Println(errors.Is(err, client.ErrOutcomeUnknown))
}
`, cmod.Module.Path)
	// The client's go.sum holds the sums of its whole graph, so the copy
	// needs nothing from the checksum database.
	sums, err := os.ReadFile(filepath.Join(clientDir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "main.go": []byte(main), "go.sum": sums} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	env := []string{"GOFLAGS=-mod=mod"}
	// docs/client.md's steps before any tag, as written.
	blocks, err := testkit.ShellBlocks(filepath.Join(root, "docs", "client.md"), "### Before any tag: a replace")
	if err != nil {
		t.Fatal(err)
	}
	script := exec.CommandContext(t.Context(), "bash", "-euc", strings.Join(blocks, ""))
	script.Dir, script.Env = dir, append(append(os.Environ(), "GOWORK=off"), env...)
	if out, err := script.CombinedOutput(); err != nil {
		t.Fatalf("docs/client.md's replace and go mod tidy: %v\n%s", err, out)
	}
	if m := readGoMod(t, dir); len(m.Replace) != 1 || m.Replace[0].New.Path != "../payments/client" {
		t.Errorf("after docs/client.md's steps the user's go.mod replaces %+v, want the client with ../payments/client", m.Replace)
	}
	if got := readGoMod(t, dir).Go; got != cmod.Go {
		t.Errorf("go mod tidy moved the user's go line from %s to %s: the client needs a newer Go than client/go.mod says", cmod.Go, got)
	}
	goIn(t, dir, env, "build", "-o", filepath.Join(dir, "clientuser"), ".")
	goIn(t, dir, env, "vet", "./...")
	// A client with no server answers: one attempt, and an unknown outcome.
	if out, err := exec.CommandContext(t.Context(), filepath.Join(dir, "clientuser")).Output(); err != nil || strings.TrimSpace(string(out)) != "true" {
		t.Errorf("the program printed %q, %v; want true (an unknown outcome)", out, err)
	}

	all := strings.Fields(goIn(t, dir, env, "list", "-m", "-f", "{{.Path}}", "all"))
	t.Logf("go list -m all in the user's module:\n%s", strings.Join(all, "\n"))
	if !slices.Contains(all, cmod.Module.Path) {
		t.Errorf("go list -m all has no %s", cmod.Module.Path)
	}
	if slices.Contains(all, smod.Module.Path) {
		t.Errorf("go list -m all holds the server's module %s", smod.Module.Path)
	}
	for _, r := range smod.Require {
		if !r.Indirect && r.Path != cmod.Module.Path && !slices.Contains(clientLinks, r.Path) && slices.Contains(all, r.Path) {
			t.Errorf("go list -m all holds %s, a dependency of the server's, not the client's", r.Path)
		}
	}

	linked := strings.Fields(goIn(t, dir, env, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "."))
	slices.Sort(linked)
	linked = slices.Compact(linked)
	want := append([]string{"example.com/clientuser", cmod.Module.Path}, clientLinks...)
	slices.Sort(want)
	if !slices.Equal(linked, want) {
		t.Errorf("the program links the modules %v, want %v: a module the client adds is a dependency of every user (clientLinks)", linked, want)
	}
}
