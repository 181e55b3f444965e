//go:build failpoints

package failpoint

import (
	"os"
	"strings"
	"syscall"
	"time"
)

// Enabled reports whether failpoints are compiled in.
const Enabled = true

// actions is read once from FAILPOINTS, a comma-separated list of
// name=action where action is:
//
//	kill       SIGKILL this process (a crash: no deferred code, no flush)
//	sleep:DUR  pause for a time.ParseDuration duration, then go on
var actions = parse(os.Getenv("FAILPOINTS"))

func parse(spec string) map[string]string {
	m := map[string]string{}
	for item := range strings.SplitSeq(spec, ",") {
		if name, action, ok := strings.Cut(strings.TrimSpace(item), "="); ok {
			m[name] = action
		}
	}
	return m
}

// Inject runs the action armed for name, if any.
func Inject(name string) {
	action, ok := actions[name]
	if !ok {
		return
	}
	switch {
	case action == "kill":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is asynchronous: make sure nothing else runs
	case strings.HasPrefix(action, "sleep:"):
		if d, err := time.ParseDuration(strings.TrimPrefix(action, "sleep:")); err == nil {
			time.Sleep(d)
		}
	}
}
