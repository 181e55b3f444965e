package repocheck

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dependenciesDoc lists the direct dependencies and whether the api binary
// links each.
const dependenciesDoc = "docs/dependencies.md"

// TestDependenciesDoc: docs/dependencies.md has one row per direct
// dependency of go.mod, and its last column says what go list -deps
// ./cmd/api says: whether the service binary links the module.
func TestDependenciesDoc(t *testing.T) {
	doc, err := os.ReadFile(dependenciesDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{} // module -> linked by the api binary
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\| [^|]+ \\| (yes|no)\\b[^|]*\\|$").FindAllStringSubmatch(string(doc), -1) {
		if _, dup := rows[m[1]]; dup {
			t.Errorf("%s has two rows for %s: keep one", dependenciesDoc, m[1])
		}
		rows[m[1]] = m[2] == "yes"
	}
	if len(rows) == 0 {
		t.Fatalf("%s has no table rows of the form | `module` | what for | yes or no |", dependenciesDoc)
	}

	direct := directRequirements(t)
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "./cmd/api").Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/api: %v", err)
	}
	linked := map[string]bool{}
	for _, m := range strings.Fields(string(out)) {
		linked[m] = true
	}
	for _, m := range direct {
		inDoc, ok := rows[m]
		switch {
		case !ok:
			t.Errorf("%s has no row for %s, a direct dependency in go.mod: add \"| `%s` | <what it is for> | %s |\"", dependenciesDoc, m, m, yesNo(linked[m]))
		case inDoc != linked[m]:
			t.Errorf("%s says the api binary links %s: %s, but go list -deps ./cmd/api says %s: fix the row (or the import that pulls it in)", dependenciesDoc, m, yesNo(inDoc), yesNo(linked[m]))
		}
	}
	for m := range rows {
		if !slices.Contains(direct, m) {
			t.Errorf("%s has a row for %s, which go.mod does not require directly: remove the row", dependenciesDoc, m)
		}
	}
}

// directRequirements returns the modules go.mod requires without an
// "// indirect" comment.
func directRequirements(t *testing.T) []string {
	t.Helper()
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var mods []string
	inBlock := false
	for line := range strings.Lines(string(gomod)) {
		line = strings.TrimSpace(line)
		switch {
		case line == "require (":
			inBlock = true
			continue
		case inBlock && line == ")":
			inBlock = false
			continue
		case strings.HasPrefix(line, "require "):
			line = strings.TrimPrefix(line, "require ")
		case !inBlock:
			continue
		}
		if f := strings.Fields(line); len(f) >= 2 && !strings.Contains(line, "// indirect") {
			mods = append(mods, f[0])
		}
	}
	if len(mods) == 0 {
		t.Fatal("go.mod requires no module directly")
	}
	return mods
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
