package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tracing"
)

// secretToken is in every malformed value below: it must never be printed.
const secretToken = "S3cretPassQz7"

// secretVariables are the variables that hold a credential or may carry
// one: the settings marked secret, and OpenTelemetry's exporter's.
func secretVariables() []string {
	var names []string
	for _, s := range config.Settings {
		if s.Secret {
			names = append(names, s.Name)
		}
	}
	return append(names, tracing.SecretVariables...)
}

// malformedSecrets are values of the usual wrong shapes, each carrying
// secretToken: a key read from a file with its newline, pasted with a
// space or quotes, of the wrong kind; URLs that do not parse, or parse and
// are refused, with the token as their password; and URLs that are fine
// and logged, with the token as a password or as a user alone (a NATS
// token), in a list of servers too.
var malformedSecrets = []string{
	"sk_live_" + secretToken + "\n",
	"sk_live_" + secretToken + " x",
	"pk_live_" + secretToken,
	`"sk_test_` + secretToken + `"`,
	"whsec_" + secretToken + "!",
	"postgres://u:" + secretToken + "@host:notaport/db",
	"postgres://u:" + secretToken + "@127.0.0.1:1/db?sslmode=bogus",
	"nats://u:" + secretToken + "@host:notaport",
	"u:" + secretToken + "@127.0.0.1:1",
	"https://u:" + secretToken + "@127.0.0.1:1/v1",
	"Authorization=Bearer " + secretToken + "%zz",
	"Authorization" + secretToken,
	"https://" + secretToken + "@127.0.0.1:1",
	"nats://" + secretToken + "@127.0.0.1:1,nats://u:" + secretToken + "@127.0.0.1:2",
}

// No secret is printed, whatever its shape (R8): api serve, and api dev
// where serve started, run with each secret variable set to each malformed
// value, under the simulator, under Stripe and under Standard Webhooks,
// never print the value, neither in an error nor in a log line nor in the
// banner. Each run either refuses the value, naming the variable, or
// starts (a webhook secret is any string).
func TestMalformedSecretsAreNeverPrinted(t *testing.T) {
	t.Parallel()
	base := []string{
		"DATABASE_URL=" + testdb.New(t), "NATS_URL=nats://127.0.0.1:" + strconv.Itoa(freePort(t)),
		"ADDR=127.0.0.1:0", "SHUTDOWN_GRACE=0", "SHUTDOWN_TIMEOUT=5s",
		// Traces exported nowhere, briefly: OpenTelemetry's variables are
		// read, and what it logs is seen.
		"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:" + strconv.Itoa(freePort(t)), "OTEL_EXPORTER_OTLP_TIMEOUT=200",
	}
	contexts := map[string][]string{
		"simulator": nil,
		"stripe":    {"PROCESSOR=stripe", "STRIPE_API_KEY=sk_test_fine", "STRIPE_API_URL=http://127.0.0.1:" + strconv.Itoa(freePort(t))},
		"standard":  {"WEBHOOK_SCHEME=standard"},
	}
	for _, name := range secretVariables() {
		for ctxName, extra := range contexts {
			for i, value := range malformedSecrets {
				t.Run(fmt.Sprintf("%s/%s/%d", name, ctxName, i), func(t *testing.T) {
					t.Parallel()
					env := append(slices.Concat(base, extra), name+"="+value)
					out, started := runUntilReady(t, "serve", env)
					if strings.Contains(out, secretToken) {
						t.Fatalf("api serve with %s=%q printed the value:\n%s", name, value, out)
					}
					if !started && !strings.Contains(out, name) {
						t.Fatalf("api serve with %s=%q neither started nor named %s:\n%s", name, value, name, out)
					}
					if started && ctxName != "standard" {
						if out, _ := runUntilReady(t, "dev", env); strings.Contains(out, secretToken) {
							t.Fatalf("api dev with %s=%q printed the value:\n%s", name, value, out)
						}
					}
				})
			}
		}
	}
}

// runUntilReady runs api command with env (and none of the configuration
// the test's own environment may hold) in a directory of its own until it
// exits or is ready, then stops it; it returns everything the process
// printed, and whether it was ready.
func runUntilReady(t *testing.T, command string, env []string) (out string, ready bool) {
	t.Helper()
	cmd := exec.Command(apiBinary(t), command)
	cmd.Dir = t.TempDir()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "OTEL_") && !slices.ContainsFunc(config.Settings, func(s config.Setting) bool { return s.Name == name }) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var output syncBuffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	marker := map[string]string{"serve": `"msg":"listening"`, "dev": "Press Ctrl-C to stop."}[command]
	deadline := time.After(time.Minute)
	for !ready {
		select {
		case <-exited:
			return output.String(), false
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("api %s neither exited nor was ready within a minute:\n%s", command, output.String())
		case <-time.After(20 * time.Millisecond):
			ready = strings.Contains(output.String(), marker)
		}
	}
	// A moment for what starts in the background (the broker's connection,
	// the first exports) to log, then a drain.
	time.Sleep(300 * time.Millisecond)
	stopProcess(cmd, exited, syscall.SIGTERM)
	return output.String(), true
}

// stopProcess sends sig to cmd and waits until it exited (exited closed),
// killing it after 30 s.
func stopProcess(cmd *exec.Cmd, exited <-chan struct{}, sig os.Signal) {
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}
