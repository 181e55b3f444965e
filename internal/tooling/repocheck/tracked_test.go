package repocheck

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// largeFixtures are the tracked files allowed over maxTrackedBytes, each
// with why it is there.
var largeFixtures = map[string]string{
	// The API reference page's renderer, vendored so that GET /docs works
	// offline (internal/apidocs).
	"internal/apidocs/redoc.standalone.js": "vendored ReDoc bundle served at /docs",
}

// maxTrackedBytes bounds a tracked file: every fork inherits them.
const maxTrackedBytes = 1 << 20

// TestNoBuildOutputsTracked (W1): git tracks no executable but a script
// (its first bytes are #!) and no file over 1 MB but a documented
// fixture. A committed binary is tens of megabytes every fork inherits.
func TestNoBuildOutputsTracked(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-s", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	for entry := range strings.SplitSeq(strings.TrimRight(string(out), "\x00"), "\x00") {
		meta, path, ok := strings.Cut(entry, "\t")
		if !ok {
			continue
		}
		mode := strings.Fields(meta)[0]
		info, err := os.Stat(path)
		if err != nil {
			continue // deleted in the work tree, not yet committed
		}
		if mode == "100755" {
			head := make([]byte, 2)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = f.Read(head)
			f.Close()
			if !bytes.Equal(head, []byte("#!")) {
				t.Errorf("%s is tracked as an executable and is no script: a build output? Remove it (git rm --cached) and ignore it", path)
			}
		}
		if info.Size() > maxTrackedBytes {
			if _, ok := largeFixtures[path]; !ok {
				t.Errorf("%s is %d bytes, over %d: remove it, or document it in largeFixtures with its reason", path, info.Size(), maxTrackedBytes)
			}
		}
	}
}
