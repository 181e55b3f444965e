package pgwire

import (
	"encoding/binary"
	"errors"
)

// Codes of the messages a client sends before its startup message is
// accepted; they carry no type byte.
const (
	codeProtocol3  = 196608   // StartupMessage, protocol 3.0
	codeSSLRequest = 80877103 // answered by one unframed byte: 'S' or 'N'
	codeGSSRequest = 80877104 // answered by one unframed byte: 'G' or 'N'
	codeCancel     = 80877102 // answered by closing the connection
)

// maxKept bounds the bytes of one message body the framer keeps for
// inspection (statement texts); the rest is skipped, not buffered.
const maxKept = 64 << 10

// maxLength is larger than any message PostgreSQL sends or accepts (1 GB);
// a longer length means we lost track of the framing.
const maxLength = 1 << 30

var errFraming = errors.New("pgwire: lost track of the message framing")

// framer splits one direction of a connection into messages, across reads
// that may end anywhere: in a header, in a body, or between messages.
type framer struct {
	// untyped: the next message has no type byte (the client's startup
	// phase: StartupMessage, SSLRequest, GSSENCRequest, CancelRequest).
	untyped bool
	// raw is the number of unframed single bytes expected next (the
	// server's answer to an SSL or GSS encryption request).
	raw int
	// keep reports whether a message type's body is worth keeping.
	keep func(typ byte) bool

	hdr   [5]byte
	nhdr  int
	typ   byte
	left  int // body bytes still to come; valid once the header is complete
	body  []byte
	keeps bool
}

// handler receives what a framer finds. typ is 0 for an untyped message;
// body holds at most maxKept bytes, and only for types the framer keeps.
type handler interface {
	message(typ byte, body []byte)
	rawByte(b byte)
}

func (f *framer) headerLen() int {
	if f.untyped {
		return 4
	}
	return 5
}

// feed parses p, calling h for every complete message and raw byte, in
// order. After an error the framing is lost for good.
func (f *framer) feed(p []byte, h handler) error {
	for len(p) > 0 {
		if f.raw > 0 {
			f.raw--
			h.rawByte(p[0])
			p = p[1:]
			continue
		}
		if n := f.headerLen(); f.nhdr < n {
			k := copy(f.hdr[f.nhdr:n], p)
			f.nhdr += k
			p = p[k:]
			if f.nhdr < n {
				return nil
			}
			f.typ = 0
			lenBytes := f.hdr[:4]
			if !f.untyped {
				f.typ, lenBytes = f.hdr[0], f.hdr[1:5]
			}
			// The length counts itself but not the type byte.
			length := int(binary.BigEndian.Uint32(lenBytes))
			if length < 4 || length > maxLength {
				return errFraming
			}
			f.left = length - 4
			f.body = f.body[:0]
			f.keeps = f.keep(f.typ)
		}
		k := min(f.left, len(p))
		if f.keeps && len(f.body) < maxKept {
			f.body = append(f.body, p[:min(k, maxKept-len(f.body))]...)
		}
		f.left -= k
		p = p[k:]
		if f.left == 0 {
			// Reset before the handler runs: it may switch the framer
			// between typed and untyped for the next message.
			f.nhdr = 0
			h.message(f.typ, f.body)
		}
	}
	return nil
}

// cstring returns the NUL-terminated string at the start of b and what
// follows it; ok is false when b holds no NUL.
func cstring(b []byte) (s string, rest []byte, ok bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:], true
		}
	}
	return "", nil, false
}
