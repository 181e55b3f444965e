package main

import (
	"os"
	"strings"
	"testing"
)

// docs/deployment.md is the deployment's contract (D5, D6): it names every
// setting a guarantee relies on, and its scenario table lists every
// scenario this harness runs, under the name -run takes.
func TestDeploymentDocListsEveryScenarioAndSetting(t *testing.T) {
	b, err := os.ReadFile("../../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, s := range scenarios() {
		if row := "| " + s.id + " | `" + s.name + "` |"; !strings.Contains(doc, row) {
			t.Errorf("docs/deployment.md's scenario table has no row %q", row)
		}
	}
	for _, setting := range []string{
		"synchronous_standby_names", "synchronous_commit", "target_session_attrs=read-write",
		"default_query_exec_mode", "DATABASE_DIRECT_URL", "pool_mode", "EVENTS_REPLICAS",
		"EVENTS_DUPLICATE_WINDOW", "OUTBOX_CLAIM_HOLD", "MESSAGE_RETENTION",
		// Patroni's (D6).
		"synchronous_mode", "synchronous_mode_strict", "ttl", "loop_wait", "retry_timeout",
		"maximum_lag_on_failover", "primary_start_timeout", "use_pg_rewind",
	} {
		if !strings.Contains(doc, "`"+setting) {
			t.Errorf("docs/deployment.md does not name the setting %s", setting)
		}
	}
}
