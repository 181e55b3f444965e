package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemref/payments/internal/tooling/testdb"
)

// wireAnswer is the first answer to bytes written on a new connection.
type wireAnswer struct {
	status int
	header http.Header
	body   string
}

// sendWire opens a connection to addr, writes req byte for byte and reads
// the first answer.
func sendWire(t *testing.T, addr, req string) wireAnswer {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("write %.60q: %v", req, err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("answer to %.60q: %v", req, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	// A server that closes with bytes of the request unread resets the
	// connection; what came before the reset is the answer.
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("answer to %.60q: read the body: %v", req, err)
	}
	return wireAnswer{status: res.StatusCode, header: res.Header, body: string(body)}
}

// wantWireProblem checks that a is the problem code, with its status.
func wantWireProblem(t *testing.T, what string, a wireAnswer, code string) {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("%s: Content-Type = %q, want application/problem+json; body: %.200s", what, ct, a.body)
		return
	}
	var p struct {
		Type, Code string
		Status     int
	}
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		t.Errorf("%s: the problem does not decode: %v", what, err)
		return
	}
	if p.Status != a.status || (code != "" && p.Code != code) || p.Type != "/docs/problems#"+strings.ReplaceAll(p.Code, "_", "-") {
		t.Errorf("%s: problem %+v for status %d, want code %q", what, p, a.status, code)
	}
}

// documented is docs/contract.md's table of the answers net/http writes
// itself: status and exact body of each.
type documented []wireAnswer

const contractDoc = "../../docs/contract.md"

// documentedAnswers reads the table under "## Answers the HTTP server
// writes itself": its first cell is the status in backticks, its second
// the body in backticks, or "none".
func documentedAnswers(t *testing.T) documented {
	t.Helper()
	data, err := os.ReadFile(contractDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Answers the HTTP server writes itself\n")
	if !ok {
		t.Errorf("%s has no section \"## Answers the HTTP server writes itself\"", contractDoc)
		return nil
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("^\\| `([0-9]{3})` \\| (?:`([^`]*)`|none) \\|")
	var rows documented
	for line := range strings.SplitSeq(section, "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			status, err := strconv.Atoi(m[1])
			if err != nil {
				t.Fatalf("%s: status %q: %v", contractDoc, m[1], err)
			}
			rows = append(rows, wireAnswer{status: status, body: m[2]})
		}
	}
	if len(rows) == 0 {
		t.Errorf("%s: the section lists no answer", contractDoc)
	}
	return rows
}

// lists reports whether the table has a's status and exact body.
func (d documented) lists(a wireAnswer) bool {
	for _, r := range d {
		if r.status == a.status && r.body == a.body {
			return true
		}
	}
	return false
}

// Every answer the server writes is one a client of the contract can read:
// a problem (application/problem+json, its type and code), or, where
// net/http answers before any handler of the API runs, one of the answers
// docs/contract.md lists, body for body. Each malformed request is sent
// as exact bytes, as no HTTP client library would write it; the table's
// rows are all reached, so it cannot keep an answer the server no longer
// writes.
func TestServerAnswersOutsideTheHandlers(t *testing.T) {
	t.Parallel()
	_, url := testdb.NewPool(t)
	srv := startServer(t, url)
	addr := strings.TrimPrefix(srv.base, "http://")
	docs := documentedAnswers(t)

	get := func(lines ...string) string {
		return "GET /healthz HTTP/1.1\r\n" + strings.Join(lines, "\r\n") + "\r\n\r\n"
	}
	post := func(lines ...string) string {
		return "POST /v1/orders HTTP/1.1\r\n" + strings.Join(lines, "\r\n") + "\r\n\r\n{}"
	}
	for _, c := range []struct {
		name    string
		request string
		status  int
	}{
		{"HeaderLineWithoutColon", get("Host: api", "NoColonHere"), 400},
		{"SpaceBeforeColon", get("Host: api", "X-A : 1"), 400},
		{"FirstHeaderLineFolded", get(" X-A: 1", "Host: api"), 400},
		{"ControlCharacterInValue", get("Host: api", "X-A: a\x01b"), 400},
		{"NULInValue", get("Host: api", "X-A: a\x00b"), 400},
		{"HeaderNameNotAToken", get("Host: api", "X(A): 1"), 400},
		{"ContentLengthNotANumber", post("Host: api", "Content-Length: abc"), 400},
		{"ContentLengthNegative", post("Host: api", "Content-Length: -1"), 400},
		{"ContentLengthWithPlus", post("Host: api", "Content-Length: +2"), 400},
		{"ContentLengthList", post("Host: api", "Content-Length: 2, 2"), 400},
		{"TwoDifferentContentLengths", post("Host: api", "Content-Length: 2", "Content-Length: 3"), 400},
		{"ExpectationUnknown", post("Host: api", "Content-Length: 2", "Expect: bogus"), 417},
		{"HostMissing", get("X-A: 1"), 400},
		{"TwoHosts", get("Host: api", "Host: other"), 400},
		{"HostMalformed", get("Host: a b"), 400},
		{"TransferEncodingGzip", post("Host: api", "Transfer-Encoding: gzip"), 501},
		{"TransferEncodingGzipChunked", post("Host: api", "Transfer-Encoding: gzip, chunked"), 501},
		{"TwoTransferEncodings", post("Host: api", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), 501},
		{"HTTP2RequestLine", "GET /healthz HTTP/2.0\r\nHost: api\r\n\r\n", 505},
		{"HTTP3RequestLine", "GET /healthz HTTP/3.0\r\nHost: api\r\n\r\n", 505},
		{"NoVersion", "GET /healthz\r\nHost: api\r\n\r\n", 400},
		{"MalformedVersion", "GET /healthz HTTP/1.x\r\nHost: api\r\n\r\n", 400},
		{"MethodNotAToken", "G@T /healthz HTTP/1.1\r\nHost: api\r\n\r\n", 400},
		{"BrokenEscapeInPath", "GET /%zz HTTP/1.1\r\nHost: api\r\n\r\n", 400},
		{"RequestLinePastTheReadLimit", "GET /" + strings.Repeat("a", 2*maxHeaderBytes) + " HTTP/1.1\r\nHost: api\r\n\r\n", 431},
		// Handed to the API's handlers (the general OPTIONS handler of
		// net/http is off): problems.
		{"OptionsAsterisk", "OPTIONS * HTTP/1.1\r\nHost: api\r\n\r\n", 404},
		{"Connect", "CONNECT api:443 HTTP/1.1\r\nHost: api:443\r\n\r\n", 404},
		{"HTTP2Preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 405},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := sendWire(t, addr, c.request)
			if a.status != c.status {
				t.Errorf("status %d, want %d; body: %.200q", a.status, c.status, a.body)
			}
			if a.header.Get("Content-Type") == "application/problem+json" {
				wantWireProblem(t, c.name, a, "")
				return
			}
			if !docs.lists(a) {
				t.Errorf("%d %q (Content-Type %q) is neither a problem nor listed in %s's table of answers the server writes itself",
					a.status, a.body, a.header.Get("Content-Type"), contractDoc)
			}
			for i := range docs {
				if docs[i].status == a.status && docs[i].body == a.body {
					docs[i].header = http.Header{} // reached
				}
			}
		})
	}
	// The 431 past the read limit is reached by TestServerBoundsHeaderSize
	// as well; every row must be reached here.
	for _, d := range docs {
		if d.header == nil {
			t.Errorf("%s lists %d %q, which no request here is answered with: remove the row or add the request", contractDoc, d.status, d.body)
		}
	}
}
