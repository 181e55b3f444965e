package repocheck

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tooling/testkit"
)

// spectralResult is one finding of `spectral lint -f json`.
type spectralResult struct {
	Code     string   `json:"code"`
	Message  string   `json:"message"`
	Path     []string `json:"path"`
	Severity int      `json:"severity"` // 0 error, 1 warning, 2 information, 3 hint
	Range    struct {
		Start struct {
			Line int `json:"line"`
		} `json:"start"`
	} `json:"range"`
}

// openapi.yaml passes Spectral's OpenAPI ruleset and the OWASP API
// Security ruleset with no error. The findings the contract keeps on
// purpose are switched off, place by place, in .spectral.yaml, and
// justified in docs/contract.md; warnings are logged, not failed.
func TestSpectralFindsNoErrors(t *testing.T) {
	t.Parallel()
	spectral := testkit.NodeTool(t, ".", "spectral")
	nodeModules, err := filepath.Abs(filepath.Join(".tools", "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), spectral, "lint", "openapi.yaml",
		"--ruleset", ".spectral.yaml", "--format", "json", "--quiet")
	// The ruleset extends an npm package; Node finds it here.
	cmd.Env = append(os.Environ(), "NODE_PATH="+nodeModules)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run() // exits 1 when it found errors; the JSON says which
	var results []spectralResult
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil {
		t.Fatalf("spectral: %v (%v)\nstdout: %s\nstderr: %s", err, runErr, stdout.Bytes(), stderr.Bytes())
	}
	counts := map[string]int{}
	for _, r := range results {
		counts[r.Code]++
		if r.Severity == 0 {
			t.Errorf("openapi.yaml:%d: %s: %s (at %s)", r.Range.Start.Line+1, r.Code, r.Message, strings.Join(r.Path, "."))
		}
	}
	codes := make([]string, 0, len(counts))
	for c := range counts {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	for _, c := range codes {
		t.Logf("%4d %s", counts[c], c)
	}
	if len(results) == 0 && runErr != nil {
		t.Fatalf("spectral: %v\nstderr: %s", runErr, stderr.Bytes())
	}
}
