// Package webhook signs and verifies processor webhooks the way Stripe
// does (M4): the header
//
//	Processor-Signature: t=1700000000,v1=5257a869...,v1=...
//
// carries the signing time and one HMAC-SHA256 per secret over
// "<t>.<raw body>", hex-encoded. During a secret rotation the processor
// signs with the old and the new secret; a receiver accepts the message
// when any v1 matches any of its secrets.
//
// Verification works on the raw bytes as received, before any parsing: a
// re-encoded body (whitespace, key order, escapes) would no longer match,
// and parsing an unauthenticated body is work an attacker could make us
// do. Comparisons are constant-time (hmac.Equal), and the timestamp must
// be within the tolerance of now, so a captured delivery cannot be
// replayed later.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Header is the signature header.
const Header = "Processor-Signature"

// DefaultTolerance is how far a signature's timestamp may be from now.
const DefaultTolerance = 5 * time.Minute

// Errors of Verify. Each is a 400 for the sender; none says which secret
// or which part failed beyond what the sender already knows.
var (
	ErrMissing   = errors.New("webhook: no signature header")
	ErrMalformed = errors.New("webhook: the signature header is not t=<unix seconds>,v1=<hex>[,v1=<hex>...]")
	ErrStale     = errors.New("webhook: the signature timestamp is outside the tolerance")
	ErrMismatch  = errors.New("webhook: no signature matches the body")
)

// Sign returns the header value for payload signed at t with each secret.
func Sign(payload []byte, t time.Time, secrets ...string) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	var b strings.Builder
	b.WriteString("t=" + ts)
	for _, s := range secrets {
		b.WriteString(",v1=" + hex.EncodeToString(mac(s, ts, payload)))
	}
	return b.String()
}

// Verify checks header against the raw payload: a well-formed header, a
// timestamp within tolerance of now, and a v1 signature that matches one
// of secrets.
func Verify(payload []byte, header string, secrets []string, now time.Time, tolerance time.Duration) error {
	if header == "" {
		return ErrMissing
	}
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrMalformed
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				return ErrMalformed
			}
			sigs = append(sigs, sig)
		}
		// Other schemes (v0, a future v2) are ignored, as Stripe's
		// libraries do: only v1 is trusted.
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrMalformed
	}
	if d := now.Sub(time.Unix(unix, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	for _, s := range secrets {
		want := mac(s, ts, payload)
		for _, sig := range sigs {
			// hmac.Equal is constant-time: the time taken does not tell an
			// attacker how many leading bytes of a forgery were right.
			if hmac.Equal(want, sig) {
				return nil
			}
		}
	}
	return ErrMismatch
}

func mac(secret, ts string, payload []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(payload)
	return m.Sum(nil)
}
