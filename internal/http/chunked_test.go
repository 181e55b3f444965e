package httpapi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	httpapi "github.com/idemref/payments/internal/http"
)

// Ordinary clients send a body whose length they do not know with
// Transfer-Encoding: chunked: Python's requests and http.client with a
// generator, Node's fetch with a stream and http.request without a length,
// Go with an io.Pipe, curl -T -. Each is served (under the same size
// limit), its order written once, and its connection closed after the
// answer, so no byte after the chunked body is read as a request (the
// smuggling cases are in TestFramingRefusesAmbiguousRequests).
func TestChunkedBodiesFromOrdinaryClientsAreServed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tables := e.publicTables(t)
	url := e.srv.URL + "/v1/orders"
	addr := e.srv.Listener.Addr().String()
	auth := "Authorization: Bearer " + e.a.Key
	head := func(key string, extra ...string) []string {
		return append([]string{"Host: api", auth, "Idempotency-Key: " + key, "Content-Type: application/json", "Transfer-Encoding: chunked"}, extra...)
	}

	type framing struct {
		name string
		// send sends one create of ref under key and returns its answer and
		// whether the server closed the connection after it.
		send func(t *testing.T, key, ref string) (status int, replayed, closed bool)
	}
	framings := []framing{
		{"GoIOPipe", func(t *testing.T, key, ref string) (int, bool, bool) {
			// Go's client sends a body of unknown length chunked, a write
			// at a time.
			body, w := io.Pipe()
			go func() {
				b := orderBody(ref)
				_, _ = io.WriteString(w, b[:10])
				time.Sleep(50 * time.Millisecond)
				_, _ = io.WriteString(w, b[10:])
				_ = w.Close()
			}()
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+e.a.Key)
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			_, _ = io.Copy(io.Discard, res.Body)
			return res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true", res.Close
		}},
		{"HeadersFirstThenSmallChunksAndATrailer", func(t *testing.T, key, ref string) (int, bool, bool) {
			// A generator or a stream: the headers go out alone, the body
			// later in small chunks (one with an extension), then a trailer.
			b := orderBody(ref)
			var chunks strings.Builder
			for i := 0; i < len(b); i += 7 {
				piece := b[i:min(i+7, len(b))]
				fmt.Fprintf(&chunks, "%x;ext=1\r\n%s\r\n", len(piece), piece)
			}
			chunks.WriteString("0\r\nX-Checksum: none\r\n\r\n")
			return rawSlow(t, addr, rawRequest("POST /v1/orders HTTP/1.1", head(key), ""), chunks.String())
		}},
		{"Expect100Continue", func(t *testing.T, key, ref string) (int, bool, bool) {
			// curl's and Node's upload: Expect: 100-continue, the body after
			// the interim answer.
			return rawSlow(t, addr, rawRequest("POST /v1/orders HTTP/1.1", head(key, "Expect: 100-continue"), ""), chunked(orderBody(ref)))
		}},
		{"CurlFromStandardInput", func(t *testing.T, key, ref string) (int, bool, bool) {
			if _, err := exec.LookPath("curl"); err != nil {
				t.Fatal("this case runs curl: install it (.ci/run does)")
			}
			cmd := exec.CommandContext(t.Context(), "curl", "-sS", "-i", "-X", "POST", "-T", "-", url,
				"-H", auth, "-H", "Idempotency-Key: "+key, "-H", "Content-Type: application/json")
			cmd.Stdin = strings.NewReader(orderBody(ref))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("curl: %v: %s", err, out)
			}
			// curl -i prints the interim 100 too; the last answer counts.
			a, closes, err := lastAnswer(out)
			if err != nil {
				t.Fatalf("curl's output: %v: %s", err, out)
			}
			return a.status, a.header.Get("Idempotent-Replayed") == "true", closes
		}},
	}
	for _, f := range framings {
		t.Run(f.name, func(t *testing.T) {
			before := e.rowCounts(t, tables)
			key, ref := "chunked-"+f.name, "chunked-"+f.name
			for i, want := range []struct {
				status   int
				replayed bool
			}{{201, false}, {201, true}} {
				status, replayed, closed := f.send(t, key, ref)
				if status != want.status || replayed != want.replayed {
					t.Errorf("send %d: status %d, replayed %v; want %d, replayed %v", i+1, status, replayed, want.status, want.replayed)
				}
				if !closed {
					t.Errorf("send %d: the server kept the connection open after a chunked body", i+1)
				}
			}
			if diff := cmp.Diff(writesOrder, e.rowDelta(t, tables, before)); diff != "" {
				t.Errorf("rows written per table by a create and its replay (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("PastTheSizeLimit", func(t *testing.T) {
		before := e.rowCounts(t, tables)
		huge := `{"reference":"` + strings.Repeat("a", httpapi.MaxBodyBytes) + `"}`
		answers, closed := rawExchange(t, addr, rawRequest("POST /v1/orders HTTP/1.1", head("chunked-huge"), chunked(huge)), 500*time.Millisecond)
		wantRawProblem(t, answers[0], http.StatusRequestEntityTooLarge, httpapi.CodeBodyTooLarge)
		if !closed {
			t.Error("the server kept the connection open after a chunked body")
		}
		if diff := cmp.Diff(map[string]int{}, e.rowDelta(t, tables, before)); diff != "" {
			t.Errorf("rows written per table (-want +got):\n%s", diff)
		}
	})
}

// rawSlow writes head, waits, writes body, and reads the one answer
// (skipping an interim 100 Continue): status, replayed, and whether the
// server closed the connection after it.
func rawSlow(t *testing.T, addr, head, body string) (status int, replayed, closed bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	for piece := range strings.SplitAfterSeq(body, "\r\n") {
		if _, err := io.WriteString(conn, piece); err != nil {
			t.Fatal(err)
		}
	}
	out, err := io.ReadAll(conn) // until the server closes, or the deadline
	a, _, perr := lastAnswer(out)
	if perr != nil {
		t.Fatalf("the answer: %v (read: %v): %s", perr, err, out)
	}
	return a.status, a.header.Get("Idempotent-Replayed") == "true", err == nil
}

// lastAnswer parses the last final answer in out (after interim 1xx
// answers); closes: it said Connection: close.
func lastAnswer(out []byte) (a rawAnswer, closes bool, err error) {
	i := bytes.LastIndex(out, []byte("HTTP/1.1 "))
	if i < 0 {
		return rawAnswer{}, false, fmt.Errorf("no answer")
	}
	res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out[i:])), nil)
	if err != nil {
		return rawAnswer{}, false, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return rawAnswer{status: res.StatusCode, header: res.Header, body: body}, res.Close, err
}

// rowDelta is what each table gained since before (rowCounts); tables
// that did not change are left out.
func (e *bundle) rowDelta(t *testing.T, tables []string, before map[string]int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for name, n := range e.rowCounts(t, tables) {
		if d := n - before[name]; d != 0 {
			got[name] = d
		}
	}
	return got
}
