package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tooling/testdb"
)

// R3: the real server bounds the header block at maxHeaderBytes, counted
// as sent (here every line is written "Name: value"): the request line,
// the header lines and the empty line that ends them. A block of exactly
// maxHeaderBytes is served; one byte more is refused with a 431 problem a
// client of the contract can read, and the process keeps serving. Past
// twice the bound net/http stops reading and answers 431 itself, in plain
// text: docs/contract.md lists that answer.
func TestServerBoundsHeaderSize(t *testing.T) {
	t.Parallel()
	_, url := testdb.NewPool(t)
	srv := startServer(t, url)
	addr := strings.TrimPrefix(srv.base, "http://")
	documented := documentedAnswers(t)

	// block is one GET /healthz whose header block is exactly size bytes,
	// padded by an X-Padding header.
	block := func(size int) string {
		t.Helper()
		head := "GET /healthz HTTP/1.1\r\nHost: api\r\nConnection: close\r\nX-Padding: "
		const tail = "\r\n\r\n"
		b := head + strings.Repeat("a", size-len(head)-len(tail)) + tail
		if len(b) != size {
			t.Fatalf("built a block of %d bytes, want %d", len(b), size)
		}
		return b
	}
	for _, c := range []struct {
		size int
		want int
		// plain: net/http's own answer, listed in docs/contract.md.
		plain bool
	}{
		{maxHeaderBytes / 2, http.StatusOK, false},
		{maxHeaderBytes, http.StatusOK, false},
		{maxHeaderBytes + 1, http.StatusRequestHeaderFieldsTooLarge, false},
		{20 << 10, http.StatusRequestHeaderFieldsTooLarge, false},
		{2 * maxHeaderBytes, http.StatusRequestHeaderFieldsTooLarge, false},
		{2*maxHeaderBytes + 1, http.StatusRequestHeaderFieldsTooLarge, true},
		{100, http.StatusOK, false}, // still serving after the refusals
	} {
		a := sendWire(t, addr, block(c.size))
		if a.status != c.want {
			t.Errorf("header block of %d bytes: status %d, want %d", c.size, a.status, c.want)
			continue
		}
		switch {
		case c.want == http.StatusOK:
		case c.plain:
			if !documented.lists(a) {
				t.Errorf("header block of %d bytes: %d %q is not in docs/contract.md's table of answers the server writes itself", c.size, a.status, a.body)
			}
		default:
			wantWireProblem(t, fmt.Sprintf("header block of %d bytes", c.size), a, "headers_too_large")
		}
	}
}

// R3: at most maxHeaderLines header lines (the Host line included), past
// which the refusal is a 431 problem too, never net/http's plain text.
func TestServerBoundsHeaderLines(t *testing.T) {
	t.Parallel()
	_, url := testdb.NewPool(t)
	srv := startServer(t, url)
	addr := strings.TrimPrefix(srv.base, "http://")

	lines := func(n int) string {
		var b strings.Builder
		b.WriteString("GET /healthz HTTP/1.1\r\nHost: api\r\n")
		for i := 1; i < n; i++ {
			fmt.Fprintf(&b, "X-L%d: v\r\n", i)
		}
		b.WriteString("\r\n")
		return b.String()
	}
	const maxHeaderLines = 500
	for _, c := range []struct{ n, want int }{
		{maxHeaderLines, http.StatusOK},
		{maxHeaderLines + 1, http.StatusRequestHeaderFieldsTooLarge},
		{2000, http.StatusRequestHeaderFieldsTooLarge},
		{10, http.StatusOK},
	} {
		a := sendWire(t, addr, lines(c.n))
		if a.status != c.want {
			t.Errorf("%d header lines: status %d, want %d; body: %.200s", c.n, a.status, c.want, a.body)
			continue
		}
		if c.want != http.StatusOK {
			wantWireProblem(t, fmt.Sprintf("%d header lines", c.n), a, "headers_too_large")
		}
	}
}
