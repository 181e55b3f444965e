package repocheck

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxBytes bounds the README: a front door (what this is, the two
// commands, the outcomes with curl, a map of docs/), not the manual (W3).
const readmeMaxBytes = 15 * 1024

// markdownFiles are the documents whose links TestDocsLinksResolve checks:
// the README and every file in docs/.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append([]string{"README.md"}, docs...)
}

var (
	// fence opens or closes a fenced code block.
	fence = regexp.MustCompile("^ {0,3}(```|~~~)")
	// codeSpan is inline code, whose brackets are not links.
	codeSpan = regexp.MustCompile("`[^`]*`")
	// inlineLink is [text](target), and an image's ![alt](target).
	inlineLink = regexp.MustCompile(`\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	// headingLine is an ATX heading.
	headingLine = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$`)
)

// proseLine is a line of a markdown document outside its code blocks.
type proseLine struct {
	n    int // from 1
	text string
}

// proseLines returns the lines of a markdown document outside fenced code
// blocks, in order; code blocks hold no links or headings.
func proseLines(text string) []proseLine {
	var out []proseLine
	inFence := false
	for i, line := range strings.Split(text, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if !inFence {
			out = append(out, proseLine{i + 1, line})
		}
	}
	return out
}

// anchors returns the ids GitHub gives the headings of a markdown
// document: the text lower-cased, punctuation dropped, each space a
// hyphen, and -1, -2 ... after a repeated id.
func anchors(text string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(text) {
		m := headingLine.FindStringSubmatch(line.text)
		if m == nil {
			continue
		}
		id := slug(inlineLink.ReplaceAllString(m[2], "$1"))
		if k := seen[id]; k > 0 {
			ids[id+"-"+strconv.Itoa(k)] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

// slug is a heading's id as GitHub writes it.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestSlug pins slug on the forms of heading the docs use.
func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Unknown outcomes (S6)":                     "unknown-outcomes-s6",
		"The stream and the consumers (M1, M3)":     "the-stream-and-the-consumers-m1-m3",
		"The chaos harness (`make chaos`)":          "the-chaos-harness-make-chaos",
		"Where a create's price goes":               "where-a-creates-price-goes",
		"Conditional update with `If-Match`/`ETag`": "conditional-update-with-if-matchetag",
		"payments — idempotency keys done right":    "payments--idempotency-keys-done-right",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestDocsLinksResolve: every link of the README and of docs/ to a file of
// the repository names a file that exists, and every #anchor names a
// heading of the document it points into. Moving a section breaks no link
// unnoticed.
func TestDocsLinksResolve(t *testing.T) {
	texts := map[string]string{}
	read := func(name string) (string, bool) {
		if s, ok := texts[name]; ok {
			return s, true
		}
		data, err := os.ReadFile(filepath.FromSlash(name))
		if err != nil {
			return "", false
		}
		texts[name] = string(data)
		return texts[name], true
	}
	headings := map[string]map[string]bool{} // the anchors of each document
	checked := 0
	for _, file := range markdownFiles(t) {
		text, _ := read(file)
		for _, line := range proseLines(text) {
			for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line.text, "``"), -1) {
				target := m[2]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				where := file + ":" + strconv.Itoa(line.n)
				name, anchor, _ := strings.Cut(target, "#")
				if name == "" {
					name = file
				} else {
					name = path.Clean(path.Join(path.Dir(file), name))
				}
				if strings.HasPrefix(name, "../") {
					t.Errorf("%s: %s points outside the repository", where, target)
					continue
				}
				if _, err := os.Stat(filepath.FromSlash(name)); err != nil {
					t.Errorf("%s: %s names %s, which does not exist", where, target, name)
					continue
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(name, ".md") {
					continue // an anchor into code or YAML: GitHub's line anchors are not checked
				}
				ids, ok := headings[name]
				if !ok {
					doc, _ := read(name)
					ids = anchors(doc)
					headings[name] = ids
				}
				if !ids[anchor] {
					t.Errorf("%s: %s: %s has no heading with the id %q", where, target, name, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d local links in the README and docs/: the link pattern no longer matches them", checked)
	}
}

// repoPath is a backticked path into one of the repository's folders, such
// as `internal/idem/store.go` or `cmd/api`.
var repoPath = regexp.MustCompile("`((?:internal|cmd|client|db|examples|docs|deploy)/[^`\\s]*)`")

// TestDocsNameExistingPaths: every file or folder the README and docs/
// name in backticks exists, so moving a package or a file leaves no
// stale path in the prose.
func TestDocsNameExistingPaths(t *testing.T) {
	checked := 0
	for _, file := range markdownFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, m := range repoPath.FindAllStringSubmatch(line, -1) {
				name, _, _ := strings.Cut(m[1], "#")
				checked++
				if _, err := os.Stat(filepath.FromSlash(strings.TrimSuffix(name, "/"))); err != nil {
					t.Errorf("%s:%d: `%s` does not exist: fix the path", file, i+1, m[1])
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("checked %d paths in the README and docs/: the pattern no longer matches them", checked)
	}
}

// TestReadmeIsAFrontDoor (W3): the README stays short, gives the two
// commands and the outcomes with curl, and its table of contents names
// every document in docs/.
func TestReadmeIsAFrontDoor(t *testing.T) {
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	if len(data) > readmeMaxBytes {
		t.Errorf("README.md is %d bytes, over %d: move the details into docs/ and link them", len(data), readmeMaxBytes)
	}
	for _, want := range []string{"\n## Two commands\n", "make run ", "make test ", "\n## Every idempotency outcome, with curl\n", "\n## Documentation\n"} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md lacks %q", strings.TrimSpace(want))
		}
	}
	_, toc, _ := strings.Cut(readme, "\n## Documentation\n")
	toc, _, _ = strings.Cut(toc, "\n## ")
	for _, doc := range markdownFiles(t)[1:] {
		if !strings.Contains(toc, "]("+filepath.ToSlash(doc)+")") {
			t.Errorf("the README's Documentation table does not link %s", doc)
		}
	}
}
