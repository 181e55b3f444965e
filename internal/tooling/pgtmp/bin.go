package pgtmp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
)

// errNoServer tells a developer the three ways forward, because the usual
// reader is someone running `make run` or `go test` on a fresh machine.
var errNoServer = errors.New("pgtmp: PostgreSQL server binaries (initdb, postgres) not found. " +
	"Install the server (Debian/Ubuntu: `apt-get install postgresql`; macOS: `brew install postgresql@15`), " +
	"or set PG_BIN to the directory holding initdb and postgres, " +
	"or set DATABASE_URL to an existing database")

// FindBinDir locates the directory holding initdb and postgres: $PG_BIN if
// set, else the directory of postgres or initdb on PATH, else the
// highest-version /usr/lib/postgresql/*/bin (Debian and Ubuntu keep the
// server off PATH), else /usr/local/pgsql/bin (a source build).
func FindBinDir() (string, error) {
	if dir := os.Getenv("PG_BIN"); dir != "" {
		if err := hasServerBinaries(dir); err != nil {
			return "", fmt.Errorf("pgtmp: PG_BIN=%s: %w", dir, err)
		}
		return dir, nil
	}
	for _, name := range []string{"postgres", "initdb"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		// PATH may hold symlinks (say /usr/local/bin/postgres) into the
		// real installation; its directory is the one to report, and it
		// has both binaries even when PATH has only one link.
		var candidates []string
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
		for _, dir := range candidates {
			if hasServerBinaries(dir) == nil {
				return dir, nil
			}
		}
	}
	if dir := newestDebianBinDir(); dir != "" {
		return dir, nil
	}
	if hasServerBinaries("/usr/local/pgsql/bin") == nil {
		return "/usr/local/pgsql/bin", nil
	}
	return "", errNoServer
}

// newestDebianBinDir returns the /usr/lib/postgresql/VERSION/bin with the
// highest VERSION that holds the server binaries, or "".
func newestDebianBinDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	type candidate struct {
		dir     string
		version float64
	}
	var found []candidate
	for _, dir := range dirs {
		// Versions are "9.6" or "15": a float orders both correctly.
		v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		if err != nil || hasServerBinaries(dir) != nil {
			continue
		}
		found = append(found, candidate{dir, v})
	}
	if len(found) == 0 {
		return ""
	}
	sort.Slice(found, func(i, j int) bool { return found[i].version > found[j].version })
	return found[0].dir
}

func hasServerBinaries(dir string) error {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("no %s in %s", name, dir)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file", filepath.Join(dir, name))
		}
	}
	return nil
}
