package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemref/payments/internal/tooling/testdb"
)

// R3: the real server bounds the header block at maxHeaderBytes, counted
// as sent: the request line, the header lines and the empty line that ends
// them. A block of exactly maxHeaderBytes is served; one byte more is
// refused with 431 before any handler runs, and the process keeps serving.
func TestServerBoundsHeaderSize(t *testing.T) {
	t.Parallel()
	_, url := testdb.NewPool(t)
	srv := startServer(t, url)
	addr := strings.TrimPrefix(srv.base, "http://")

	// send writes one GET /healthz whose header block is exactly size
	// bytes, padded by an X-Padding header, and returns the status.
	send := func(size int) int {
		t.Helper()
		head := "GET /healthz HTTP/1.1\r\nHost: api\r\nConnection: close\r\nX-Padding: "
		const tail = "\r\n\r\n"
		block := head + strings.Repeat("a", size-len(head)-len(tail)) + tail
		if len(block) != size {
			t.Fatalf("built a block of %d bytes, want %d", len(block), size)
		}
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, block); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("header block of %d bytes: %v", size, err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for _, c := range []struct {
		size int
		want int
	}{
		{maxHeaderBytes / 2, http.StatusOK},
		{maxHeaderBytes, http.StatusOK},
		{maxHeaderBytes + 1, http.StatusRequestHeaderFieldsTooLarge},
		{20 << 10, http.StatusRequestHeaderFieldsTooLarge},
		{100, http.StatusOK}, // still serving after the refusals
	} {
		if got := send(c.size); got != c.want {
			t.Errorf("header block of %d bytes: status %d, want %d", c.size, got, c.want)
		}
	}
}
