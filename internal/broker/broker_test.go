package broker

import (
	"errors"
	"strings"
	"testing"
)

// A server older than MinServerVersion is refused with an error that
// names the version required; a pre-release counts as its release, and a
// version that cannot be read is refused.
func TestCheckServerVersion(t *testing.T) {
	for version, ok := range map[string]bool{
		"2.9.10": false, "2.10.0": false, "2.10.4": false, "2.10.22": false, "1.4.1": false, "": false, "unknown": false,
		"2.10.23": true, "2.10.23-RC.1": true, "v2.10.29": true, "2.11.0": true, "2.15.2": true, "2.100.0": true, "3.0.0": true,
	} {
		err := CheckServerVersion(version)
		switch {
		case ok && err != nil:
			t.Errorf("CheckServerVersion(%q) = %v, want nil", version, err)
		case !ok && (!errors.Is(err, ErrServerTooOld) || !strings.Contains(err.Error(), MinServerVersion+" or later is required")):
			t.Errorf("CheckServerVersion(%q) = %v, want ErrServerTooOld naming %s", version, err, MinServerVersion)
		}
	}
}
