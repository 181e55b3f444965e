// Command rename makes a fork its own: it rewrites the Go module path and the
// names a deployment shares with other services (NATS streams, subjects and
// connection names, the events' source, the API key prefix, the Grafana
// dashboard's uid and title, the TypeScript client's npm name) in every
// file git tracks,
// and prints what it changed. The Go module path rule also rewrites the
// repository's path in the alerts' default runbook links.
//
//	make rename MODULE=example.com/acme/orders [NAME=orders] [KEY_PREFIX=ok_]
//
// docs/forking.md lists what it rewrites and what it
// leaves on purpose.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/format"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// The names as this copy spells them. This file is tracked, so a rename
// rewrites these literals with everything else: they always hold the current
// names, a second run with the same values changes nothing, and a later run
// can rename again.
const (
	moduleNow    = "github.com/idemref/payments"
	keyPrefixNow = "sk_"
)

// names are what the fork is to be called.
type names struct {
	module    string // Go module path: example.com/acme/orders
	name      string // service name in NATS streams, subjects and connections: orders
	keyPrefix string // starts every API key: ok_
}

// A rule rewrites one name wherever it stands as a whole word: the byte
// before it, and unless it is a prefix the byte after it, is no letter, digit
// or underscore (so the sk_ in task_ stays).
type rule struct {
	what   string
	old    string
	new    func(names) string
	prefix bool // the name starts a longer token: sk_<tenant>_<secret>
}

var rules = []rule{
	{what: "Go module path", old: moduleNow, new: func(n names) string { return n.module }},
	{what: "NATS events stream", old: "PAYMENTS_EVENTS", new: func(n names) string { return strings.ToUpper(n.name) + "_EVENTS" }},
	{what: "NATS dead-letter stream", old: "PAYMENTS_DEAD_LETTERS", new: func(n names) string { return strings.ToUpper(n.name) + "_DEAD_LETTERS" }},
	{what: "event subjects", old: "payments.events", new: func(n names) string { return n.name + ".events" }},
	{what: "dead-letter subjects", old: "payments.dead", new: func(n names) string { return n.name + ".dead" }},
	{what: "events' source in the inbox", old: "payments.outbox", new: func(n names) string { return n.name + ".outbox" }},
	{what: "NATS connection names", old: "payments-api", new: func(n names) string { return n.name + "-api" }},
	{what: "API key prefix", old: keyPrefixNow, new: func(n names) string { return n.keyPrefix }, prefix: true},
	// Grafana keys a dashboard by its uid: a fork's must not replace this
	// one's in a Grafana that shows both. The module's path names it.
	{what: "Grafana dashboard uid", old: "idemref-payments", new: dashboardUID},
	{what: "Grafana dashboard title", old: "Payments API: idempotency, payments, messages", new: func(n names) string {
		return strings.ToUpper(n.name[:1]) + n.name[1:] + " API: idempotency, payments, messages"
	}},
	// The TypeScript client's npm name (clients/typescript/package.json,
	// its tests' imports, the docs): a fork publishes its own.
	{what: "TypeScript client's npm name", old: "@idemref/payments", new: npmName},
	// The image's label keys (the Makefile's SBOM_LABEL), reverse-DNS as
	// label keys are: a fork's images carry its own.
	{what: "image label prefix", old: "io.github.idemref.payments", new: labelPrefix},
}

// labelPrefix is the module path as a reverse-DNS label key prefix: the
// host's labels reversed, then the path's elements (example.com/acme/orders:
// com.example.acme.orders), lower case, any other character than a letter,
// a digit, . or - made a -.
func labelPrefix(n names) string {
	elems := strings.Split(n.module, "/")
	host := strings.Split(elems[0], ".")
	slices.Reverse(host)
	key := []byte(strings.ToLower(strings.Join(append(host, elems[1:]...), ".")))
	for i, c := range key {
		allowed := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-'
		if !allowed {
			key[i] = '-'
		}
	}
	return string(key)
}

// npmName is the TypeScript client's npm package name: NAME, scoped by the
// module path's element after its host (example.com/acme/orders:
// @acme/orders), in the characters npm allows (lower case letters, digits,
// - . _, not first); a module with no such element gives NAME unscoped.
func npmName(n names) string {
	elems := strings.Split(n.module, "/")
	if len(elems) < 3 {
		return n.name
	}
	scope := []byte(strings.ToLower(elems[1]))
	for i, c := range scope {
		allowed := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || i > 0 && (c == '.' || c == '_')
		if !allowed {
			scope[i] = '-'
		}
	}
	return "@" + string(scope) + "/" + n.name
}

// dashboardUID is the module's path after its host, its elements joined
// by - (example.com/acme/orders: acme-orders), or the name for a module
// that is a host alone; a Grafana uid holds letters, digits, - and _, at
// most 40 of them.
func dashboardUID(n names) string {
	_, rest, _ := strings.Cut(n.module, "/")
	if rest == "" {
		rest = n.name
	}
	uid := []byte(rest)
	for i, c := range uid {
		if !isWord(c) && c != '-' {
			uid[i] = '-'
		}
	}
	if len(uid) > 40 {
		uid = uid[len(uid)-40:]
	}
	return string(uid)
}

const usage = `usage: make rename MODULE=example.com/acme/orders [NAME=orders] [KEY_PREFIX=ok_]
   or: go run ./tools/rename -module example.com/acme/orders [-name orders] [-key-prefix ok_]

Run it at the root of the fork's git checkout, after a commit, so that git diff
shows what it did. NAME defaults to MODULE's last element, KEY_PREFIX to
the current one (` + keyPrefixNow + `).`

func main() {
	var n names
	fs := flag.NewFlagSet("rename", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&n.module, "module", "", "Go module path (MODULE)")
	fs.StringVar(&n.name, "name", "", "service name (NAME)")
	fs.StringVar(&n.keyPrefix, "key-prefix", "", "API key prefix (KEY_PREFIX)")
	err := fs.Parse(os.Args[1:])
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err == nil {
		n, err = n.withDefaults()
	}
	if err == nil {
		_, err = run(".", n, os.Stdout)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rename: %v\n\n%s\n", err, usage)
		os.Exit(2)
	}
}

var (
	// A NATS stream name may not hold whitespace, '.', '*', '>' or a path
	// separator, nor a subject token the first three; this stays well inside.
	nameRE = regexp.MustCompile(`^[a-z][a-z0-9]*([_-][a-z0-9]+)*$`)
	// The key is <prefix><tenant hex>_<secret>: the trailing _ keeps it readable.
	keyPrefixRE = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*_$`)
	labelRE     = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	// A module path element after the first (golang.org/x/mod/module.CheckPath).
	elementRE = regexp.MustCompile(`^[A-Za-z0-9_~-]+(\.[A-Za-z0-9_~-]+)*$`)
	majorRE   = regexp.MustCompile(`^v[0-9]+$`)
)

// withDefaults fills what was not given and checks every value.
func (n names) withDefaults() (names, error) {
	if n.module == "" {
		return n, errors.New("MODULE (-module) is required: the fork's Go module path, such as example.com/acme/orders")
	}
	if err := checkModule(n.module); err != nil {
		return n, fmt.Errorf("MODULE %q: %w", n.module, err)
	}
	if n.name == "" {
		elems := strings.Split(n.module, "/")
		n.name = elems[len(elems)-1]
		if majorRE.MatchString(n.name) && len(elems) > 1 {
			n.name = elems[len(elems)-2]
		}
		if !nameRE.MatchString(n.name) || len(n.name) > 32 {
			return n, fmt.Errorf("NAME is MODULE's last element %q by default, which is no service name: set NAME (lower case letters and digits, words joined by _ or -, at most 32 characters)", n.name)
		}
	}
	if !nameRE.MatchString(n.name) || len(n.name) > 32 {
		return n, fmt.Errorf("NAME %q: a service name is lower case letters and digits, words joined by _ or -, at most 32 characters (it names NATS streams and subjects)", n.name)
	}
	if n.keyPrefix == "" {
		n.keyPrefix = keyPrefixNow
	}
	if !keyPrefixRE.MatchString(n.keyPrefix) || len(n.keyPrefix) > 16 {
		return n, fmt.Errorf("KEY_PREFIX %q: a key prefix is lower case letters and digits ending in _, such as ok_ or ok_live_, at most 16 characters", n.keyPrefix)
	}
	return n, nil
}

// checkModule accepts what the go command accepts as a module path, less
// the rare forms: the first element is a domain, the others are plain.
func checkModule(path string) error {
	first, rest, _ := strings.Cut(path, "/")
	if err := checkDomain(first); err != nil {
		return fmt.Errorf("its first element must be a domain you control, as in example.com/acme/orders: %w", err)
	}
	if rest == "" {
		return nil
	}
	for e := range strings.SplitSeq(rest, "/") {
		if !elementRE.MatchString(e) {
			return fmt.Errorf("element %q: use letters, digits, -, _, ~ and inner dots", e)
		}
	}
	return nil
}

func checkDomain(host string) error {
	labels := strings.Split(host, ".")
	if len(host) > 253 || len(labels) < 2 {
		return errors.New("not a domain name such as acme.example")
	}
	for _, l := range labels {
		if len(l) > 63 || !labelRE.MatchString(l) {
			return fmt.Errorf("label %q: use lower case letters, digits and inner -", l)
		}
	}
	return nil
}

// change is one rule's effect on one file.
type change struct {
	file  string
	rule  int
	count int
}

// run renames in the git checkout at dir and reports to out. It rewrites
// only the files git tracks, and its own directory last: if it stops
// half-way, its table still holds the old names and a second run finishes.
func run(dir string, n names, out io.Writer) ([]change, error) {
	// Every read and write goes through root, so no tracked symbolic link
	// or odd name can lead it outside the checkout.
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if err := checkGoMod(root); err != nil {
		return nil, err
	}
	files, err := trackedFiles(dir)
	if err != nil {
		return nil, err
	}
	var changes []change
	for _, f := range files {
		info, err := root.Lstat(filepath.FromSlash(f))
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or a symbolic link
		}
		fileChanges, err := renameFile(root, f, info.Mode().Perm(), n, out)
		changes = append(changes, fileChanges...)
		if err != nil {
			return changes, err
		}
	}
	summarize(changes, n, out)
	return changes, nil
}

// trackedFiles lists the files git tracks in dir, this command's own last.
func trackedFiles(dir string) ([]string, error) {
	ls := exec.Command("git", "ls-files", "-z")
	ls.Dir = dir
	listed, err := ls.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w: run it at the root of the fork's git checkout (it rewrites only the files git tracks)", dir, err)
	}
	files := strings.Split(strings.TrimRight(string(listed), "\x00"), "\x00")
	self := func(f string) bool { return strings.HasPrefix(f, "tools/rename/") }
	slices.SortStableFunc(files, func(a, b string) int {
		switch {
		case self(a) && !self(b):
			return 1
		case self(b) && !self(a):
			return -1
		}
		return 0
	})
	return files, nil
}

// renameFile rewrites the regular file f under root, whose permissions
// are perm, with the names n, and reports to out what it changed. A binary
// file is left alone.
func renameFile(root *os.Root, f string, perm fs.FileMode, n names, out io.Writer) ([]change, error) {
	path := filepath.FromSlash(f)
	src, err := root.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if bytes.IndexByte(src, 0) >= 0 {
		return nil, nil // binary
	}
	dst, counts := rewrite(src, n)
	if bytes.Equal(src, dst) {
		return nil, nil
	}
	if strings.HasSuffix(f, ".go") {
		// A longer or shorter import path can reorder an import block
		// or realign comments; the result must pass gofmt -l.
		if dst, err = format.Source(dst); err != nil {
			return nil, fmt.Errorf("%s: gofmt after the rename: %w", f, err)
		}
	}
	if err := root.WriteFile(path, dst, perm); err != nil {
		return nil, err
	}
	var changes []change
	var said []string
	for i, c := range counts {
		if c > 0 {
			changes = append(changes, change{file: f, rule: i, count: c})
			said = append(said, fmt.Sprintf("%s ×%d", rules[i].what, c))
		}
	}
	fmt.Fprintf(out, "%s: %s\n", f, strings.Join(said, ", "))
	return changes, nil
}

// summarize tells out each rule's old and new name and how often it
// applied, and what to do next.
func summarize(changes []change, n names, out io.Writer) {
	if len(changes) == 0 {
		fmt.Fprintln(out, "rename: nothing to change; the names are already:")
	} else {
		fmt.Fprintf(out, "rename: %d files changed:\n", countFiles(changes))
	}
	for i, r := range rules {
		files, total := map[string]bool{}, 0
		for _, c := range changes {
			if c.rule == i {
				files[c.file], total = true, total+c.count
			}
		}
		if total == 0 {
			fmt.Fprintf(out, "  %-28s %s\n", r.what, r.new(n))
		} else {
			fmt.Fprintf(out, "  %-28s %s → %s (%d in %d files)\n", r.what, r.old, r.new(n), total, len(files))
		}
	}
	if len(changes) > 0 {
		fmt.Fprintln(out, "rename: next, go build ./... && make test, then review git diff and commit")
	}
}

// checkGoMod refuses a checkout whose go.mod does not hold the module path
// this table knows: the rename would then leave every import unchanged.
func checkGoMod(root *os.Root) error {
	gomod, err := root.ReadFile("go.mod")
	if err != nil {
		return fmt.Errorf("%w: run it at the root of the fork's checkout", err)
	}
	for line := range strings.Lines(string(gomod)) {
		if got, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			if got = strings.Trim(strings.TrimSpace(got), `"`); got != moduleNow {
				return fmt.Errorf("go.mod names module %q, but tools/rename/main.go knows it as %q: was it renamed by hand? Set moduleNow to %q first", got, moduleNow, got)
			}
			return nil
		}
	}
	return errors.New("go.mod has no module line")
}

// rewrite applies every rule in one pass over src, so a new name is never
// taken for an old one by a later rule, and counts the rewrites per rule.
func rewrite(src []byte, n names) ([]byte, []int) {
	news := make([]string, len(rules))
	for i, r := range rules {
		news[i] = r.new(n)
	}
	counts := make([]int, len(rules))
	var out bytes.Buffer
	last := 0
	for i := 0; i < len(src); i++ {
		if i > 0 && isWord(src[i-1]) {
			continue
		}
		for k, r := range rules {
			end := i + len(r.old)
			if r.old == news[k] || !bytes.HasPrefix(src[i:], []byte(r.old)) ||
				(!r.prefix && end < len(src) && isWord(src[end])) {
				continue
			}
			out.Write(src[last:i])
			out.WriteString(news[k])
			counts[k]++
			last = end
			i = end - 1
			break
		}
	}
	if last == 0 {
		return src, counts
	}
	out.Write(src[last:])
	return out.Bytes(), counts
}

func isWord(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

func countFiles(changes []change) int {
	files := map[string]bool{}
	for _, c := range changes {
		files[c.file] = true
	}
	return len(files)
}
