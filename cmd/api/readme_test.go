package main

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// The README's curl examples run, in order, against a real server and
// answer what the README says: each `# HTTP/1.1 NNN` line under a command,
// and each `# NNN ...` comment at the end of one, is the status that
// command must get. The examples cannot rot unnoticed: the keyed POSTs, the
// payments, and the PUT and PATCH that need no key.
func TestReadmeExamplesRun(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the README's examples need curl on the PATH")
	}
	blocks, err := testkit.ShellBlocks("../../README.md", "## Every idempotency outcome, with curl")
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	var want []string
	statusLine := regexp.MustCompile(`^# HTTP/1\.1 (\d{3})`)
	inline := regexp.MustCompile(`\s# (\d{3}) [a-z_]+`)
	for _, block := range blocks {
		script.WriteString(block)
		for _, line := range strings.Split(block, "\n") {
			if m := statusLine.FindStringSubmatch(line); m != nil {
				want = append(want, m[1])
			} else if m := inline.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, "#") {
				want = append(want, m[1])
			}
		}
	}
	if len(want) < 10 {
		t.Fatalf("found %d documented statuses in the README's examples; the parser no longer understands them", len(want))
	}
	for _, method := range []string{"-X POST", "-X PUT", "-X PATCH"} {
		if !strings.Contains(script.String(), method) {
			t.Errorf("the README's examples have no %s request", strings.TrimPrefix(method, "-X "))
		}
	}

	pool, url := testdb.NewPool(t)
	_, key, err := tenants.Create(t.Context(), pool, "readme")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := processorsim.Start("127.0.0.1:0", processorsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Shutdown(t.Context()) })
	srv := startServer(t, url, "PROCESSOR_URL="+sim.URL())

	cmd := exec.CommandContext(t.Context(), "bash", "-u", "-c", script.String())
	cmd.Env = append(os.Environ(), "API="+srv.base, "API_KEY="+key, "SIM="+sim.URL())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the examples failed: %v\n%s", err, out)
	}
	// Every status line starts a line of its own: bodies end with a
	// newline, and curl -sS prints no progress meter.
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^HTTP/1\.1 (\d{3}) `).FindAllStringSubmatch(string(out), -1) {
		got = append(got, m[1])
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("statuses of the README's examples:\n got  %v\n want %v (as documented)\noutput:\n%s", got, want, out)
	}
	// The side effects the examples describe: one order per reference, one
	// charge for the paid order, one refund, one customer replaced in place,
	// one conditional change applied once.
	for _, q := range []struct {
		sql  string
		want int
	}{
		{`SELECT count(*) FROM orders WHERE reference = 'readme-1001'`, 1},
		{`SELECT count(*) FROM payments WHERE status = 'succeeded'`, 2},                                             // readme-2001's, and the one held at the processor (readme-2003)
		{`SELECT count(*) FROM payments p JOIN orders o ON o.id = p.order_id WHERE o.reference = 'readme-2003'`, 1}, // the 409's request ran once
		{`SELECT count(*) FROM payments WHERE status = 'declined'`, 1},
		{`SELECT count(*) FROM refunds WHERE amount = 1000`, 1},
		{`SELECT count(*) FROM customers`, 1},
		{`SELECT count(*) FROM customers WHERE name = 'Ada King'`, 1},
		{`SELECT count(*) FROM orders WHERE reference = 'readme-3001' AND description = 'gift wrap'`, 1},
	} {
		if n := count(t, pool, q.sql); n != q.want {
			t.Errorf("%s = %d, want %d", q.sql, n, q.want)
		}
	}
}
