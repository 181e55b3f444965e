package testkit

import (
	"fmt"
	"os"
	"strings"
)

// ShellBlocks returns the ```sh blocks of a Markdown file's section, in
// order: from the heading that reads exactly heading (with its #s, such as
// "## The recipe") to the next heading of the same level or higher. The
// tests that run a document's examples word for word (the README's curl
// examples, docs/deployment.md's Podman recipe) read them with it, so
// that an example that drifts from the code fails a test instead of a
// reader.
func ShellBlocks(file, heading string) ([]string, error) {
	doc, err := os.ReadFile(file) //nolint:gosec // a document of this repository a test names
	if err != nil {
		return nil, err
	}
	level, _, _ := strings.Cut(heading, " ")
	if level == "" || strings.Trim(level, "#") != "" {
		return nil, fmt.Errorf("heading %q does not start with #s and a space", heading)
	}
	_, section, ok := strings.Cut(string(doc), "\n"+heading+"\n")
	if !ok {
		return nil, fmt.Errorf("%s has no heading %q", file, heading)
	}
	var blocks []string
	var block strings.Builder
	fence := "" // the open fence's info string; "" outside one
	for line := range strings.Lines(section) {
		trimmed := strings.TrimSpace(line)
		switch {
		case fence == "" && strings.HasPrefix(trimmed, "```"):
			fence = "`" + strings.TrimPrefix(trimmed, "```")
		case fence != "" && trimmed == "```":
			if fence == "`sh" {
				blocks = append(blocks, block.String())
			}
			fence = ""
			block.Reset()
		case fence == "`sh":
			block.WriteString(line)
		case fence == "":
			// A heading of this level or higher ends the section; inside
			// a fence, a line that starts with # is a comment.
			if hashes, _, ok := strings.Cut(line, " "); ok && hashes != "" && strings.Trim(hashes, "#") == "" && len(hashes) <= len(level) {
				return done(file, heading, blocks)
			}
		}
	}
	return done(file, heading, blocks)
}

func done(file, heading string, blocks []string) ([]string, error) {
	if len(blocks) == 0 {
		return nil, fmt.Errorf("%s: section %q has no ```sh block", file, heading)
	}
	return blocks, nil
}
