// Package buildinfo is what the running binary knows of the build that
// made it (G3): api version prints it, and payments_build_info, registered
// when the package is imported, carries it as labels.
package buildinfo

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Version is what the binary knows of the build that made it, read
// from the build information the go command stamps into every binary.
// With VCS stamping (go build does it by default in a git
// checkout; make image asks for it with -buildvcs=auto, whatever GOFLAGS
// says), Version is the module
// version Go derives from the commit: a tag, or a pseudo-version
// v0.0.0-<commit time>-<revision prefix>, with +dirty when the tree had
// uncommitted changes. Without it, Version is "(devel)" and the VCS fields
// are "unknown".
type Version struct {
	Version   string
	Revision  string // vcs.revision: the full commit hash
	Time      string // vcs.time: the commit's time, RFC 3339
	Modified  string // vcs.modified: "true" when the tree had uncommitted changes, "false", or "unknown"
	GoVersion string
}

const unknown = "unknown"

// Read reads the build information of the running binary.
func Read() Version {
	v := Version{Version: unknown, Revision: unknown, Time: unknown, Modified: unknown, GoVersion: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if info.Main.Version != "" {
		v.Version = info.Main.Version
	}
	if info.GoVersion != "" {
		v.GoVersion = info.GoVersion
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value
		}
	}
	return v
}

// Print is `api version`: one "name  value" line per field, in a
// fixed order, for people and for scripts (awk '$1 == "revision"').
func Print(w io.Writer, v Version) {
	fmt.Fprintf(w, "version   %s\n", v.Version)
	fmt.Fprintf(w, "revision  %s\n", v.Revision)
	fmt.Fprintf(w, "time      %s\n", v.Time)
	fmt.Fprintf(w, "modified  %s\n", v.Modified)
	fmt.Fprintf(w, "go        %s\n", v.GoVersion)
	if v.Revision == unknown {
		fmt.Fprintln(w, "(built without VCS information: build it in a git checkout with make image or go build -buildvcs=true)")
	}
}

// Metric is payments_build_info: always 1, its labels say what
// is running, as `api version` prints it. A query joins on it to tell one
// release's processes from another's during a rolling upgrade.
const Metric = "payments_build_info"

func init() {
	v := Read()
	prometheus.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        Metric,
		Help:        "Always 1; the labels are the running binary's module version, VCS revision and Go version (api version prints the same).",
		ConstLabels: prometheus.Labels{"version": v.Version, "revision": v.Revision, "goversion": v.GoVersion},
	}, func() float64 { return 1 }))
}
