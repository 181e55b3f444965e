package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/testdb"
)

// R3: the real server bounds the header block: one byte-heavy header past
// maxHeaderBytes is refused with 431 before any handler runs, and the
// process keeps serving.
func TestServerBoundsHeaderSize(t *testing.T) {
	t.Parallel()
	_, url := testdb.NewPool(t)
	srv := startServer(t, url)

	send := func(headerBytes int) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, srv.base+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Padding", strings.Repeat("a", headerBytes))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := send(maxHeaderBytes / 2); got != http.StatusOK {
		t.Errorf("header of %d bytes: status %d, want 200", maxHeaderBytes/2, got)
	}
	// net/http allows 4 KiB of slack above MaxHeaderBytes.
	if got := send(maxHeaderBytes + 8<<10); got != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("header of %d bytes: status %d, want 431", maxHeaderBytes+8<<10, got)
	}
	if got := send(10); got != http.StatusOK {
		t.Errorf("after the refusal: status %d, want 200", got)
	}
}
