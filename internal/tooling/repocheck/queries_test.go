package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// queryEntities is, for each file of db/queries, the entities its queries
// may be named after: the singular of the tables they read and write.
// Tx names a query that sets the transaction itself (set_config(..., true)).
var queryEntities = map[string][]string{
	"customers.sql":          {"Customer"},
	"idempotency_keys.sql":   {"IdemKey", "Tx"},
	"orders.sql":             {"Order"},
	"outbox.sql":             {"Outbox"},
	"payments.sql":           {"Payment", "Compensation"},
	"processed_messages.sql": {"ProcessedMessage"},
	"reaper.sql":             {"IdemKey", "Tx"},
	"refunds.sql":            {"Refund"},
	"tenants.sql":            {"Tenant", "APIKey"},
}

var queryName = regexp.MustCompile(`(?m)^-- name: (\w+) `)

// TestQueryNamesFollowTheConvention: every sqlc query is named
// <Entity><Verb...>, the entity one of its file's, so the generated methods
// of one table sort together and read alike (PaymentClaimSweep beside
// PaymentSweepDone, not PaymentsClaimSweep).
func TestQueryNamesFollowTheConvention(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("db", "queries", "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no db/queries/*.sql: %v", err)
	}
	for _, file := range files {
		entities, ok := queryEntities[filepath.Base(file)]
		if !ok {
			t.Errorf("%s: no entities in queryEntities; add its tables' singular", file)
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range queryName.FindAllStringSubmatch(string(b), -1) {
			if !namedAfter(m[1], entities) {
				t.Errorf("%s: query %s is not named <Entity><Verb...> with an entity of %v", file, m[1], entities)
			}
		}
	}
}

// namedAfter reports whether name is one of entities followed by a new
// word: PaymentGet is, PaymentsClaimSweep and Payment alone are not.
func namedAfter(name string, entities []string) bool {
	for _, e := range entities {
		rest, ok := strings.CutPrefix(name, e)
		if ok && rest != "" && rest[0] >= 'A' && rest[0] <= 'Z' {
			return true
		}
	}
	return false
}
