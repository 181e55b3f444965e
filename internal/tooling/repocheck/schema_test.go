package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// Ready to shard by tenant (D8). Every table of db/schema.sql is tenant
// data, unless it is listed below as the directory or as reference data;
// docs/capacity.md ("A schema ready to shard") says what each class
// becomes on a sharded database.

// directoryTables are read before the request's tenant is known, or to
// learn it: on a sharded database they stay one directory beside the
// shards, or are replicated to each of them.
var directoryTables = map[string]string{
	"tenants": "the directory itself: a tenant's id and its name, unique across tenants by design",
	"api_keys": "read to authenticate the request that names the tenant; its key leads with tenant_id " +
		"(the API key's prefix carries the tenant id) but it belongs with the directory, not a shard",
}

// referenceTables hold no tenant's rows: the same everywhere, copied to
// every shard (or kept per node), never partitioned.
var referenceTables = map[string]string{
	"state_transitions": "the allowed changes of state of every machine: fixed rows, the same for each tenant",
	"processed_messages_horizon": "a singleton: how far the inbox's ids were pruned, the database's own " +
		"state (on a sharded database, each node's inbox has its own)",
}

var (
	schemaTable     = regexp.MustCompile(`(?m)^CREATE TABLE public\.(\w+) \(\n((?:    .*\n)+)\);`)
	schemaColumn    = regexp.MustCompile(`(?m)^    (\w+) `)
	schemaKey       = regexp.MustCompile(`(?m)^ALTER TABLE ONLY public\.(\w+)\n    ADD CONSTRAINT (\w+) (PRIMARY KEY|UNIQUE) \((.*?)\)`)
	schemaUniqueIdx = regexp.MustCompile(`(?m)^CREATE UNIQUE INDEX (\w+) ON (?:ONLY )?public\.(\w+) USING \w+ \((.*?)\)(?: INCLUDE \(.*?\))?(?: WHERE .*)?;$`)
)

// tenantKeyViolations reads a schema as tools/schema writes it (pg_dump's
// statements) and returns, sorted, one line for each primary key, unique
// constraint or unique index of a tenant-data table that does not hold
// tenant_id, each tenant-data table without a tenant_id column, and each
// listed table the schema does not have.
func tenantKeyViolations(schema string) []string {
	var out []string
	tables := map[string]bool{}
	for _, m := range schemaTable.FindAllStringSubmatch(schema, -1) {
		name := m[1]
		tables[name] = true
		if exempt(name) {
			continue
		}
		var cols []string
		for _, c := range schemaColumn.FindAllStringSubmatch(m[2], -1) {
			cols = append(cols, c[1])
		}
		if !slices.Contains(cols, "tenant_id") {
			out = append(out, "table "+name+": tenant data without a tenant_id column (or list it as directory or reference data)")
		}
	}
	check := func(table, name, kind, columns string) {
		if exempt(table) {
			return
		}
		for _, c := range strings.Split(columns, ",") {
			if strings.TrimSpace(c) == "tenant_id" {
				return
			}
		}
		out = append(out, kind+" "+name+" on "+table+" ("+columns+") does not include tenant_id: "+
			"a database sharded or partitioned by tenant cannot enforce it")
	}
	for _, m := range schemaKey.FindAllStringSubmatch(schema, -1) {
		check(m[1], m[2], strings.ToLower(m[3]), m[4])
	}
	for _, m := range schemaUniqueIdx.FindAllStringSubmatch(schema, -1) {
		check(m[2], m[1], "unique index", m[3])
	}
	for _, listed := range []map[string]string{directoryTables, referenceTables} {
		for name := range listed {
			if !tables[name] {
				out = append(out, "table "+name+" is listed as directory or reference data but is not in the schema")
			}
		}
	}
	sort.Strings(out)
	return out
}

func exempt(table string) bool {
	_, dir := directoryTables[table]
	_, ref := referenceTables[table]
	return dir || ref
}

// TestTenantDataKeysIncludeTheTenant: every primary key, unique constraint
// and unique index of a tenant's data holds tenant_id (D8), so PostgreSQL's
// partitioning by tenant or Citus distributing by tenant can enforce each
// of them within one tenant's partition or shard, and a request's key
// claim, business rows and recorded response stay in one.
func TestTenantDataKeysIncludeTheTenant(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("db", "schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	schema := string(b)
	if n := len(schemaTable.FindAllString(schema, -1)); n < len(directoryTables)+len(referenceTables)+5 {
		t.Fatalf("read %d tables from db/schema.sql: has its format changed?", n)
	}
	for _, v := range tenantKeyViolations(schema) {
		t.Errorf("db/schema.sql: %s", v)
	}

	// The check itself: a global key on tenant data is caught, whichever
	// form pg_dump gives it.
	planted := schema + `
CREATE UNIQUE INDEX orders_reference_everywhere ON public.orders USING btree (reference);

ALTER TABLE ONLY public.payments
    ADD CONSTRAINT payments_charge_id_key UNIQUE (charge_id);
`
	want := []string{
		"unique index orders_reference_everywhere on orders (reference) does not include tenant_id: " +
			"a database sharded or partitioned by tenant cannot enforce it",
		"unique payments_charge_id_key on payments (charge_id) does not include tenant_id: " +
			"a database sharded or partitioned by tenant cannot enforce it",
	}
	want = append(want, tenantKeyViolations(schema)...)
	sort.Strings(want)
	if got := tenantKeyViolations(planted); !slices.Equal(got, want) {
		t.Errorf("with two global keys planted, violations = %q, want %q", got, want)
	}
}
