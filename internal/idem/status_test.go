package idem

import (
	"testing"
	"time"
)

// CommitWindow is the request timeout, one lock wait of the claim and two
// seconds, rounded up to the second: a request under a key can commit no
// later than that after it was sent.
func TestCommitWindow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		request, lock, want time.Duration
	}{
		{request: 20 * time.Second, lock: 0, want: 24 * time.Second}, // the defaults: 20 s, 2 s
		{request: 10 * time.Second, lock: 300 * time.Millisecond, want: 13 * time.Second},
		{request: 1500 * time.Millisecond, lock: 500 * time.Millisecond, want: 4 * time.Second},
	} {
		store := NewStore(nil, Config{LockTimeout: tc.lock})
		if got := store.CommitWindow(tc.request); got != tc.want {
			t.Errorf("CommitWindow(%v) with lock timeout %v = %v, want %v", tc.request, tc.lock, got, tc.want)
		}
	}
}
