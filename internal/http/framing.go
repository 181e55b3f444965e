package httpapi

import (
	"errors"
	"fmt"
	"net/http"
)

// The header block and the framing of a request (R3, H): what net/http
// hands to a handler is already parsed, so this layer refuses what it can
// still see of a request that a proxy in front could read otherwise than
// net/http did, and bounds the header block itself, so that both refusals
// are problems. What net/http refuses before any handler runs is listed in
// docs/contract.md ("Answers the HTTP server writes itself").

// Problem codes of this layer.
const (
	// CodeAmbiguousFraming: a request whose body or media type a proxy in
	// front could read otherwise than this server (request smuggling).
	CodeAmbiguousFraming = "ambiguous_framing"
	// CodeHeadersTooLarge: a header block past MaxHeaderBytes or
	// MaxHeaderLines.
	CodeHeadersTooLarge = "headers_too_large"
)

// Bounds of the header block (R3, docs/bounds.md).
const (
	// MaxHeaderBytes bounds a request's header block, counted as the
	// request line, one "Name: value" line per field value (one space
	// after the colon, as clients write them) and the empty line that
	// ends the block, each line with its CRLF.
	MaxHeaderBytes = 16 << 10
	// MaxHeaderLines bounds its header lines, Host included: net/http's
	// own default.
	MaxHeaderLines = 500
	// ServerHeaderBytes is where the HTTP server itself stops reading a
	// header block (http.Server.MaxHeaderBytes is this less the 4,096
	// bytes net/http reads beyond it) and answers 431 in plain text: far
	// enough past MaxHeaderBytes that every block this layer can measure
	// is refused here, as a problem.
	ServerHeaderBytes = 2 * MaxHeaderBytes
	// ServerHeaderLines is the HTTP server's own bound on header lines
	// (http.Server.MaxHeaderValueCount), set past the most lines a block
	// of ServerHeaderBytes can hold (a line takes 3 bytes at least,
	// "a:\n"), so that it never answers before this layer does.
	ServerHeaderLines = ServerHeaderBytes / 3
)

var (
	errHeadersTooLarge = &bodyError{http.StatusRequestHeaderFieldsTooLarge, CodeHeadersTooLarge, "Request header fields too large",
		fmt.Errorf("the header block is limited to %d bytes and %d lines", MaxHeaderBytes, MaxHeaderLines)}
	errContentTypes = &bodyError{http.StatusBadRequest, CodeAmbiguousFraming, "Ambiguous message framing",
		errors.New("send one Content-Type header, not several")}
)

// requestFraming refuses, before anything reads the request:
//
//   - a header block past MaxHeaderBytes or MaxHeaderLines: 431;
//   - several Content-Type lines: 400 ambiguous_framing, never a choice
//     between them.
//
// Each refusal closes the connection, so that bytes after the request
// (which a proxy may have meant as part of it) are never read as another
// request.
//
// A body framed by Transfer-Encoding: chunked is served, under the same
// MaxBodyBytes, since ordinary clients stream a body of unknown length
// that way (Python's requests with a generator, Node's fetch with a
// stream, Go with an io.Pipe, curl -T -), and closes the connection after
// its answer. net/http deletes a Content-Length sent beside the coding
// before any handler runs (the chunked coding wins, RFC 9112 section 6.3),
// so a request with both, which a proxy in front may have framed by its
// Content-Length (request smuggling), cannot be told from one with the
// coding alone: whatever such a proxy meant to follow the chunked body is
// never read as a request, since nothing after it is read at all. So does
// the answer to any HTTP/1.0 request with a body: net/http ignores
// Transfer-Encoding on HTTP/1.0 and frames the body by its
// Content-Length, and RFC 9112 section 6.1 asks a server to close such a
// connection, since a proxy may have framed it by the coding.
func requestFraming(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var err error
		switch size, lines := headerBlock(r); {
		case size > MaxHeaderBytes || lines > MaxHeaderLines:
			err = errHeadersTooLarge
		case len(r.Header.Values("Content-Type")) > 1:
			err = errContentTypes
		}
		if err != nil {
			w.Header().Set("Connection", "close")
			writeError(w, r, err)
			return
		}
		if len(r.TransferEncoding) > 0 || (r.ProtoMajor == 1 && r.ProtoMinor == 0 && r.ContentLength != 0) {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// headerBlock measures r's header block as MaxHeaderBytes counts it, and
// its lines. net/http moves the Host line to r.Host and a chunked
// Transfer-Encoding to r.TransferEncoding; both are counted back. (It
// also drops a Content-Length sent beside the chunked coding, which is
// refused anyway, and folds equal Content-Length lines into one.)
func headerBlock(r *http.Request) (size, lines int) {
	size = len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2
	line := func(name, value string) {
		size += len(name) + 2 + len(value) + 2
		lines++
	}
	if r.Host != "" {
		line("Host", r.Host)
	}
	for _, te := range r.TransferEncoding {
		line("Transfer-Encoding", te)
	}
	for name, values := range r.Header {
		for _, v := range values {
			line(name, v)
		}
	}
	return size + 2, lines
}
