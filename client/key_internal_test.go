package client

import (
	"encoding/hex"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// Keys are 32 hex digits that sort in the order they were minted (the
// millisecond first), and never repeat.
func TestNewKeySortsByTimeAndIsUnique(t *testing.T) {
	t.Parallel()
	before := time.Now().UnixMilli()
	first := NewKey()
	ms, err := strconv.ParseInt(first[:12], 16, 64)
	if err != nil || ms < before || ms > time.Now().UnixMilli() {
		t.Fatalf("key %q: its first 12 digits (%d) are not the time it was minted (from %d)", first, ms, before)
	}
	// The next keys are minted in a later millisecond than the first.
	for time.Now().UnixMilli() <= ms {
		runtime.Gosched()
	}
	seen := map[string]bool{}
	previous := first
	for range 1000 {
		k := NewKey()
		if len(k) != 32 {
			t.Fatalf("key %q: %d characters, want 32", k, len(k))
		}
		if _, err := hex.DecodeString(k); err != nil {
			t.Fatalf("key %q is not hexadecimal: %v", k, err)
		}
		if seen[k] {
			t.Fatalf("key %q minted twice", k)
		}
		seen[k] = true
		if k[:12] < previous[:12] {
			t.Fatalf("key %q sorts before the earlier %q", k, previous)
		}
		previous = k
	}
	if first >= previous {
		t.Errorf("a key minted in a later millisecond (%q) does not sort after %q", previous, first)
	}
}
