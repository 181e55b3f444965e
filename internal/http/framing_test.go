package httpapi_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/client/api"
)

// Requests whose framing a proxy in front of the API could read otherwise
// than the API does (request smuggling), sent as exact bytes over TCP: a
// Go client would never write them. Each row states the one answer the
// connection may carry, whether the server must close the connection after
// it, and what may be written.

// rawAnswer is one answer read off a connection.
type rawAnswer struct {
	status int
	header http.Header
	body   []byte
}

// rawExchange opens a connection to addr, writes req byte for byte, and
// reads the answers the server sends: until it closes the connection
// (closed), or sends nothing more for quiet.
func rawExchange(t *testing.T, addr, req string, quiet time.Duration) (answers []rawAnswer, closed bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("write the request: %v", err)
	}
	br := bufio.NewReader(conn)
	for {
		wait := quiet
		if len(answers) == 0 {
			wait = 10 * time.Second
		}
		if err := conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			var nerr net.Error
			switch {
			case errors.As(err, &nerr) && nerr.Timeout():
				if len(answers) == 0 {
					t.Fatal("no answer within 10s")
				}
				return answers, false
			case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, os.ErrDeadlineExceeded):
				return answers, true
			}
			t.Fatalf("read answer %d: %v", len(answers)+1, err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatalf("read the body of answer %d: %v", len(answers)+1, err)
		}
		answers = append(answers, rawAnswer{status: res.StatusCode, header: res.Header, body: body})
	}
}

// wantRawProblem checks that a is the problem code with status, with the
// headers every problem carries.
func wantRawProblem(t *testing.T, a rawAnswer, status int, code string) {
	t.Helper()
	if a.status != status {
		t.Errorf("status = %d, want %d; body: %.300s", a.status, status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json; body: %.300s", ct, a.body)
		return
	}
	var p api.Problem
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Errorf("the problem does not decode: %v; body: %.300s", err, a.body)
		return
	}
	if p.Code != code || p.Status != status {
		t.Errorf("problem code/status = %s/%d, want %s/%d; detail: %s", p.Code, p.Status, code, status, deref(p.Detail))
	}
	if want := "/docs/problems#" + strings.ReplaceAll(code, "_", "-"); p.Type != want {
		t.Errorf("problem type = %q, want %q", p.Type, want)
	}
	if got := a.header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", got)
	}
	if got := a.header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q, want nosniff", got)
	}
}

// rawRequest is a request as sent: the request line, the header lines as
// given (in order, duplicates kept), the empty line, then body verbatim.
func rawRequest(requestLine string, lines []string, body string) string {
	var b strings.Builder
	b.WriteString(requestLine + "\r\n")
	for _, l := range lines {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return b.String()
}

// chunked is body in the chunked transfer coding: one chunk, then the last.
func chunked(body string) string {
	return fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
}

func TestFramingRefusesAmbiguousRequests(t *testing.T) {
	t.Parallel()
	e := setup(t)
	addr := e.srv.Listener.Addr().String()
	tables := e.publicTables(t)

	auth := "Authorization: Bearer " + e.a.Key
	const ctJSON = "Content-Type: application/json"
	var refs int
	// order is a valid create-order body no other row uses.
	order := func() string { refs++; return orderBody(fmt.Sprintf("framing-%d", refs)) }
	key := func() string { return fmt.Sprintf("Idempotency-Key: framing-key-%d", refs) }
	cl := func(body string) string { return "Content-Length: " + strconv.Itoa(len(body)) }
	post := "POST /v1/orders HTTP/1.1"
	// smuggled is a complete second request creating an order: if it is
	// ever served, a row shows it.
	smuggled := func() string {
		body := order()
		return rawRequest(post, []string{"Host: api", auth, key(), ctJSON, cl(body)}, body)
	}

	const (
		ambiguous  = "ambiguous_framing"
		keyInvalid = "idempotency_key_invalid"
		unauth     = "unauthorized"
	)
	type framingCase struct {
		name    string
		request string
		status  int
		code    string // for problem answers
		// closes: the server must close the connection after its answer, so
		// bytes after the request are never read as another request.
		closes bool
		writes map[string]int // rows each table gains; nil: none
	}
	var cases []framingCase
	add := func(c framingCase) { cases = append(cases, c) }

	// A body framed by the chunked coding is served by the coding, and the
	// connection closed after the answer: net/http drops a Content-Length
	// sent beside it before any handler runs, so chunked alone cannot be
	// told from chunked with a Content-Length that a proxy in front may
	// have framed the request by, and nothing after the chunked body is
	// ever read as a request.
	//
	// CL.TE: a proxy that reads Content-Length forwards one request; a
	// server that reads the chunked coding ends the body early and would
	// serve the rest as a request of its own: one order, not two.
	{
		body := order()
		head := []string{"Host: api", auth, key(), ctJSON}
		tail := smuggled()
		add(framingCase{name: "ContentLengthAndChunked", request: rawRequest(post,
			append(head, "Content-Length: "+strconv.Itoa(len(chunked(body))+len(tail)), "Transfer-Encoding: chunked"), chunked(body)+tail),
			status: 201, closes: true, writes: writesOrder})
	}
	// TE.CL: the other way round; a short Content-Length before the
	// chunked coding. The chunk is a whole request, which is no JSON.
	{
		tail := smuggled()
		head := []string{"Host: api", auth, key(), ctJSON}
		add(framingCase{name: "ChunkedAndShortContentLength", request: rawRequest(post,
			append(head, "Transfer-Encoding: chunked", "Content-Length: 4"), chunked(tail)),
			status: 400, code: "invalid_json", closes: true})
	}
	// The coding's name in another case, as some proxies do not match it.
	{
		body := order()
		add(framingCase{name: "ContentLengthAndChunkedUpperCase", request: rawRequest(post,
			[]string{"Host: api", auth, key(), ctJSON, cl(chunked(body)), "Transfer-Encoding: CHUNKED"}, chunked(body)),
			status: 201, closes: true, writes: writesOrder})
	}
	// Chunked alone, as clients stream a body whose length they do not
	// know, followed by a request on the same connection.
	{
		body := order()
		add(framingCase{name: "ChunkedWithoutContentLength", request: rawRequest(post,
			[]string{"Host: api", auth, key(), ctJSON, "Transfer-Encoding: chunked"}, chunked(body)+smuggled()),
			status: 201, closes: true, writes: writesOrder})
	}
	add(framingCase{name: "ChunkedOnGet", request: rawRequest("GET /v1/orders HTTP/1.1",
		[]string{"Host: api", auth, "Transfer-Encoding: chunked"}, "0\r\n\r\n"),
		status: 200, closes: true})

	// Two Content-Type lines: which one counts is a choice, and a proxy
	// (or a WAF inspecting the body) may make the other one.
	for _, c := range []struct {
		name  string
		types []string
	}{
		{"TwoContentTypesJSONFirst", []string{ctJSON, "Content-Type: text/plain"}},
		{"TwoContentTypesJSONSecond", []string{"Content-Type: text/plain", ctJSON}},
		{"TwoContentTypesSame", []string{ctJSON, ctJSON}},
		{"TwoContentTypesNameInOtherCase", []string{ctJSON, "content-type: application/x-www-form-urlencoded"}},
	} {
		body := order()
		lines := append([]string{"Host: api", auth, key(), cl(body)}, c.types...)
		add(framingCase{name: c.name, request: rawRequest(post, lines, body), status: 400, code: ambiguous, closes: true})
	}

	// Duplicates the API already refuses: the key and the credentials.
	{
		body := order()
		add(framingCase{name: "TwoIdempotencyKeys", request: rawRequest(post,
			[]string{"Host: api", auth, key(), "Idempotency-Key: framing-other", ctJSON, cl(body)}, body),
			status: 400, code: keyInvalid})
	}
	{
		body := order()
		add(framingCase{name: "TwoAuthorizations", request: rawRequest(post,
			[]string{"Host: api", auth, auth, key(), ctJSON, cl(body)}, body),
			status: 401, code: unauth})
	}
	// Two equal Content-Length lines are one length (RFC 9110 section
	// 8.6): net/http folds them into one and the request is served.
	{
		body := order()
		add(framingCase{name: "TwoEqualContentLengthsAccepted", request: rawRequest(post,
			[]string{"Host: api", auth, key(), ctJSON, cl(body), cl(body)}, body),
			status: 201, writes: writesOrder})
	}
	// HTTP/1.0 with Transfer-Encoding: net/http ignores the coding, as
	// RFC 9112 section 6.1 has it, and reads the Content-Length; the coding
	// is gone before any handler runs. A proxy that honoured it would see
	// other requests on the connection, so the server closes the connection
	// after any HTTP/1.0 request with a body, as that section requires: the
	// bytes after the body are never read as a request.
	{
		body := order()
		add(framingCase{name: "HTTP10KeepAliveChunkedAndContentLength", request: rawRequest("POST /v1/orders HTTP/1.0",
			[]string{"Host: api", "Connection: keep-alive", auth, key(), ctJSON, "Transfer-Encoding: chunked", cl(body)}, body+smuggled()),
			status: 201, closes: true, writes: writesOrder})
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := e.rowCounts(t, tables)
			answers, closed := rawExchange(t, addr, c.request, 500*time.Millisecond)
			if len(answers) != 1 {
				statuses := make([]int, len(answers))
				for i, a := range answers {
					statuses[i] = a.status
				}
				t.Errorf("the connection carried %d answers (statuses %v), want 1: the bytes after the request were served as a request", len(answers), statuses)
			}
			a := answers[0]
			if c.code != "" {
				wantRawProblem(t, a, c.status, c.code)
			} else if a.status != c.status {
				t.Errorf("status = %d, want %d; body: %.300s", a.status, c.status, a.body)
			}
			if c.closes && !closed {
				t.Error("the server kept the connection open after the answer; it must close it")
			}

			got := e.rowDelta(t, tables, before)
			want := maps.Clone(c.writes)
			if want == nil {
				want = map[string]int{}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rows written per table (-want +got):\n%s", diff)
			}
		})
	}
}

// The header block is bounded (R3) by the API itself, so that the refusal
// is a problem a client of the contract can read: counted as the request
// line, one "Name: value" line per field and the empty line, 16,384 bytes
// are served and 16,385 are not.
func TestFramingBoundsTheHeaderBlock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	addr := e.srv.Listener.Addr().String()

	// block is a GET /healthz whose header block is exactly size bytes.
	block := func(size int) string {
		head := "GET /healthz HTTP/1.1\r\nHost: api\r\nX-Padding: "
		const tail = "\r\n\r\n"
		return head + strings.Repeat("a", size-len(head)-len(tail)) + tail
	}
	// lines is a GET /healthz with n header lines, Host included.
	lines := func(n int) string {
		var b strings.Builder
		b.WriteString("GET /healthz HTTP/1.1\r\nHost: api\r\n")
		for i := 1; i < n; i++ {
			fmt.Fprintf(&b, "X-L%d: v\r\n", i)
		}
		b.WriteString("\r\n")
		return b.String()
	}
	const maxBytes = 16 << 10
	for _, c := range []struct {
		name    string
		request string
		status  int
	}{
		{"HalfTheLimit", block(maxBytes / 2), 200},
		{"AtTheLimit", block(maxBytes), 200},
		{"OneByteOver", block(maxBytes + 1), 431},
		{"TwiceTheLimit", block(2 * maxBytes), 431},
		{"FiftyLines", lines(50), 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			answers, closed := rawExchange(t, addr, c.request, 200*time.Millisecond)
			a := answers[0]
			if c.status == 200 {
				if a.status != 200 {
					t.Errorf("status = %d, want 200; body: %.300s", a.status, a.body)
				}
				return
			}
			wantRawProblem(t, a, c.status, "headers_too_large")
			if !closed {
				t.Error("the server kept the connection open after refusing the header block")
			}
		})
	}
}
