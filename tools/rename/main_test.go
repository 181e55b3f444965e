package main

import (
	"bytes"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// forked are the names the fork test gives its copy.
var forked = names{module: "example.com/acme/orders", name: "orders", keyPrefix: "ok_"}

// TestForkRenamesAndBuilds (W2): a copy of the tracked files, renamed, has
// none of the old names left, builds (the client's module too), passes go
// vet and runs a package's tests; every rule found something to rename (a rule that matches nothing
// is stale); and a second run, by the rewritten command, changes nothing.
func TestForkRenamesAndBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a renamed copy of the module")
	}
	dir := forkCopy(t)

	var out bytes.Buffer
	changes, err := run(dir, forked, &out)
	t.Logf("rename:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rules {
		if r.old != r.new(forked) && !ruleUsed(changes, i) {
			t.Errorf("rule %q found no %s to rename: remove it, or fix its spelling", r.what, r.old)
		}
	}

	files := gitFiles(t, dir)
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		for i, line := range strings.Split(string(src), "\n") {
			for _, r := range rules {
				if r.old != r.new(forked) && containsName(line, r) {
					t.Errorf("%s:%d still has %s (%s): %.120s", f, i+1, r.old, r.what, strings.TrimSpace(line))
				}
			}
		}
		if strings.HasSuffix(f, ".go") {
			if formatted, err := format.Source(src); err != nil || !bytes.Equal(formatted, src) {
				t.Errorf("%s is not gofmt-formatted after the rename (%v)", f, err)
			}
		}
	}

	// The rewritten command knows the new names: run again, nothing changes.
	again := goCmd(t, dir, "run", "./tools/rename", "-module", forked.module, "-name", forked.name,
		"-key-prefix", forked.keyPrefix)
	if !strings.Contains(again, "nothing to change") {
		t.Errorf("a second rename with the same names changed something:\n%s", again)
	}

	goCmd(t, dir, "build", "./...")
	goCmd(t, dir, "vet", "./...")
	// The client is a module of its own (client/go.mod, G7): its path
	// follows the module's, in its go.mod and in the server's require and
	// replace lines, and it builds on its own.
	client := forked.module + "/client"
	if got := strings.TrimSpace(goCmd(t, filepath.Join(dir, "client"), "list", "-m")); got != client {
		t.Errorf("client/go.mod names module %q after the rename, want %q", got, client)
	}
	if got := goCmd(t, dir, "list", "-m", "-f", "{{.Replace.Path}}", client); strings.TrimSpace(got) != "./client" {
		t.Errorf("go.mod replaces %s with %q after the rename, want ./client", client, strings.TrimSpace(got))
	}
	goCmd(t, filepath.Join(dir, "client"), "build", "./...")
	goCmd(t, filepath.Join(dir, "client"), "vet", "./...")
	// The root package's tests check openapi.yaml's examples against its
	// problem type pattern, which neither the build nor vet reads.
	goCmd(t, dir, "test", "-count=1", "./internal/validation/", ".")
}

// TestRewriteWholeNames: a name is rewritten where it stands as a whole
// word, every rule in one pass (a new name is never taken for an old one).
func TestRewriteWholeNames(t *testing.T) {
	n := names{module: "payments.example.com/x", name: "orders", keyPrefix: "ok_"}
	for _, tc := range []struct{ in, want string }{
		{`import "github.com/idemref/payments/internal/db"`, `import "payments.example.com/x/internal/db"`},
		{"github.com/idemref/paymentsx", "github.com/idemref/paymentsx"},
		{"sub 'payments.events.>' PAYMENTS_EVENTS", "sub 'orders.events.>' ORDERS_EVENTS"},
		{"mypayments.events payments_events_broker_connected", "mypayments.events payments_events_broker_connected"},
		{`"sk_" + id, task_sk_, sk_<tenant>`, `"ok_" + id, task_sk_, ok_<tenant>`},
		// The alerts' default runbook base, and the dashboard's uid and title.
		{`{{ or $externalLabels.runbook_base "https://github.com/idemref/payments/blob/main/docs" }}`,
			`{{ or $externalLabels.runbook_base "https://payments.example.com/x/blob/main/docs" }}`},
		{`"uid": "idemref-payments", "title": "Payments API: idempotency, payments, messages"`,
			`"uid": "x", "title": "Orders API: idempotency, payments, messages"`},
		// The npm name: a module with one element after its host has no
		// scope to give it.
		{`"name": "@idemref/payments", import "@idemref/paymentsx"`, `"name": "orders", import "@idemref/paymentsx"`},
		// The image's label keys.
		{`SBOM_LABEL := io.github.idemref.payments.sbom`, `SBOM_LABEL := com.example.payments.x.sbom`},
	} {
		if got, _ := rewrite([]byte(tc.in), n); string(got) != tc.want {
			t.Errorf("rewrite(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct{ module, want string }{
		{"example.com/acme/orders", "@acme/orders"},
		{"github.com/Acme_Corp/orders/v2", "@acme_corp/orders"},
		{"example.com/_x~y/orders", "@-x-y/orders"},
		{"example.com/orders", "orders"},
	} {
		if got := npmName(names{module: tc.module, name: "orders"}); got != tc.want {
			t.Errorf("npmName(%s) = %q, want %q", tc.module, got, tc.want)
		}
	}
	for _, tc := range []struct{ module, want string }{
		{"example.com/acme/orders", "com.example.acme.orders"},
		{"github.com/Acme_Corp/orders/v2", "com.github.acme-corp.orders.v2"},
		{"orders.internal", "internal.orders"},
	} {
		if got := labelPrefix(names{module: tc.module, name: "orders"}); got != tc.want {
			t.Errorf("labelPrefix(%s) = %q, want %q", tc.module, got, tc.want)
		}
	}
}

// TestNamesAreChecked: each value is checked, and the defaults follow MODULE.
func TestNamesAreChecked(t *testing.T) {
	for _, c := range []struct{ module, want string }{
		{"example.com/acme/orders", "acme-orders"},
		{"shop.example.com", "shop"},
		{"example.com/a.b/c~d/orders", "a-b-c-d-orders"},
		{"example.com/" + strings.Repeat("x", 40) + "/orders", strings.Repeat("x", 33) + "-orders"},
	} {
		n, err := names{module: c.module, name: "shop"}.withDefaults()
		if got := dashboardUID(n); err != nil || got != c.want {
			t.Errorf("dashboardUID(%s) = %q, %v; want %q", c.module, got, err, c.want)
		}
	}
	n, err := names{module: "example.com/acme/orders/v2"}.withDefaults()
	if err != nil || n.name != "orders" || n.keyPrefix != keyPrefixNow {
		t.Errorf("defaults = %+v, %v; want name orders, the current key prefix", n, err)
	}
	for _, bad := range []names{
		{},
		{module: "orders"},
		{module: "example.com/acme/Orders"},
		{module: "example.com/a..b"},
		{module: "example.com/acme/orders", name: "or.ders"},
		{module: "example.com/acme/orders", name: "orders>"},
		{module: "example.com/acme/orders", keyPrefix: "ok"},
		{module: "example.com/acme/orders", keyPrefix: "o.k_"},
	} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v accepted, want an error", bad)
		}
	}
}

// containsName is the rename's own test of a whole word: sk_ inside task_ is
// no key prefix.
func containsName(line string, r rule) bool {
	for i := 0; ; {
		j := strings.Index(line[i:], r.old)
		if j < 0 {
			return false
		}
		at, end := i+j, i+j+len(r.old)
		if (at == 0 || !isWord(line[at-1])) && (r.prefix || end == len(line) || !isWord(line[end])) {
			return true
		}
		i = at + 1
	}
}

func ruleUsed(changes []change, rule int) bool {
	for _, c := range changes {
		if c.rule == rule {
			return true
		}
	}
	return false
}

// forkCopy copies the work tree as a commit would hold it (the files git
// tracks, and new ones it does not ignore, so a file is checked before its
// first commit) into a new git checkout, as a forker's clone would be.
func forkCopy(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	listed := git(t, root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	for _, f := range strings.Split(strings.TrimRight(listed, "\x00"), "\x00") {
		info, err := os.Lstat(filepath.Join(root, f))
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree
		}
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, src, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	git(t, dir, "init", "-q")
	git(t, dir, "add", "-A")
	return dir
}

func gitFiles(t *testing.T, dir string) []string {
	t.Helper()
	out := git(t, dir, "ls-files", "-z")
	return strings.Split(strings.TrimRight(out, "\x00"), "\x00")
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git %s in %s: %v (not a git checkout?)", strings.Join(args, " "), dir, err)
	}
	return string(out)
}

// goCmd runs the go command in the copy with this test's environment
// (GOTOOLCHAIN, the shared build and module caches) and fails the test,
// with the output, when it fails.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	// CI is unset in the copy: it has no .tools/node_modules, so the tests
	// that need the Node tools (Spectral, Prism) skip there, as they do on a
	// machine without them, instead of failing as CI makes them.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly", "CI=")
	out, err := cmd.CombinedOutput()
	t.Logf("go %s (%s)", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("go %s in the renamed copy: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
