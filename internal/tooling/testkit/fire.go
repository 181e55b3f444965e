package testkit

import (
	"sync"
	"testing"
)

// Fire runs send(0) to send(n-1) in n goroutines released together, so the
// calls race as concurrent clients' would, and returns their results in
// order of i. An error from any call fails the test.
func Fire[R any](t testing.TB, n int, send func(i int) (R, error)) []R {
	t.Helper()
	results := make([]R, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = send(i)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	return results
}
