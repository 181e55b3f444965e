package config

import (
	"flag"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// Every documented default is the value the configuration takes when the
// variable is unset: setting each variable to its documented default
// changes nothing.
func TestDocumentedDefaultsAreTheDefaults(t *testing.T) {
	t.Parallel()
	base, err := Load(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Settings {
		if s.Default == "" {
			continue
		}
		cfg, err := Load(func(name string) string {
			if name == s.Name {
				return s.Default
			}
			return ""
		})
		if err != nil {
			t.Errorf("%s=%s (its documented default): %v", s.Name, s.Default, err)
		} else if !reflect.DeepEqual(cfg, base) {
			t.Errorf("%s=%s (its documented default) changes the configuration", s.Name, s.Default)
		}
	}
}

// updateDocs rewrites docs/configuration.md's table from settings:
// go test ./internal/config -run TestConfigurationTableInDocs -update-docs
var updateDocs = flag.Bool("update-docs", false, "rewrite docs/configuration.md's table from settings")

// configurationDoc is the documentation of the configuration, whose table
// shows settings row by row.
const configurationDoc = "../../docs/configuration.md"

// markdownRow is s as a row of configurationDoc's table; a backticked path
// under docs/ becomes a link.
func markdownRow(s Setting) string {
	link := regexp.MustCompile("`docs/([a-z-]+\\.md)`")
	cell := func(text string) string { return link.ReplaceAllString(text, "[$1]($1)") }
	return "| `" + s.Name + "` | " + cell(s.DefaultText()) + " | " + cell(s.Meaning()) + " |"
}

// The table in docs/configuration.md is settings, row by row, in its order.
func TestConfigurationTableInDocs(t *testing.T) {
	data, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	const header = "| variable | default | meaning |\n|---|---|---|\n"
	before, rest, ok := strings.Cut(string(data), header)
	if !ok {
		t.Fatalf("%s has no table starting %q", configurationDoc, header)
	}
	var got []string
	for rest != "" && strings.HasPrefix(rest, "|") {
		var row string
		row, rest, _ = strings.Cut(rest, "\n")
		got = append(got, row)
	}
	var want []string
	for _, s := range Settings {
		want = append(want, markdownRow(s))
	}
	if *updateDocs {
		table := strings.Join(want, "\n") + "\n"
		if err := os.WriteFile(configurationDoc, []byte(before+header+table+rest), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	for i := range max(len(got), len(want)) {
		switch {
		case i >= len(want):
			t.Errorf("%s: row %d is not in settings (config.go): %s", configurationDoc, i+1, got[i])
		case i >= len(got):
			t.Errorf("%s: row %d is missing: %s", configurationDoc, i+1, want[i])
		case got[i] != want[i]:
			t.Errorf("%s: row %d differs from settings (config.go)\n got  %s\n want %s", configurationDoc, i+1, got[i], want[i])
		}
	}
	if t.Failed() {
		t.Log("Settings in config.go is the source: go test ./internal/config -run TestConfigurationTableInDocs -update-docs rewrites the table")
	}
}
