package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The Standard Webhooks scheme (standardwebhooks.com), which many
// processors use instead of a Stripe-style header:
//
//	webhook-id:        msg_2b...              the message's id, the same on every retry
//	webhook-timestamp: 1700000000             unix seconds of this attempt
//	webhook-signature: v1,<base64> v1,<...>   HMAC-SHA256 over "<id>.<timestamp>.<raw body>"
//
// Secrets are "whsec_" followed by the base64 of the key bytes; during a
// rotation the sender signs with each, space-separated. The same rules as
// Verify hold: raw bytes, constant-time comparison, timestamp tolerance.

// Headers of the Standard Webhooks scheme.
const (
	StandardIDHeader        = "webhook-id"
	StandardTimestampHeader = "webhook-timestamp"
	StandardSignatureHeader = "webhook-signature"
)

// Scheme names a signature scheme; configuration picks one.
type Scheme string

// Schemes.
const (
	// SchemeProcessor is Processor-Signature (Stripe's form), the default.
	SchemeProcessor Scheme = "processor"
	// SchemeStandard is Standard Webhooks.
	SchemeStandard Scheme = "standard"
)

// secretPrefix starts a Standard Webhooks secret.
const secretPrefix = "whsec_"

// ErrSecret: a Standard Webhooks secret is not whsec_ followed by base64.
var ErrSecret = errors.New("webhook: a Standard Webhooks secret is whsec_ followed by the base64 of at least 16 bytes")

// StandardKey decodes a whsec_ secret into its key bytes.
func StandardKey(secret string) ([]byte, error) {
	rest, ok := strings.CutPrefix(secret, secretPrefix)
	if !ok {
		return nil, ErrSecret
	}
	key, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || len(key) < 16 {
		return nil, ErrSecret
	}
	return key, nil
}

// SignStandard returns the webhook-signature value for message id, sent at
// t, signed with each secret (whsec_...).
func SignStandard(id string, t time.Time, payload []byte, secrets ...string) (string, error) {
	ts := strconv.FormatInt(t.Unix(), 10)
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		key, err := StandardKey(s)
		if err != nil {
			return "", err
		}
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(standardMAC(key, id, ts, payload)))
	}
	return strings.Join(sigs, " "), nil
}

// VerifyStandard checks the three Standard Webhooks headers against the
// raw payload: all present, a timestamp within tolerance of now, and a v1
// signature that matches one of secrets. The errors are Verify's.
func VerifyStandard(payload []byte, h http.Header, secrets []string, now time.Time, tolerance time.Duration) error {
	id, ts, sig := h.Get(StandardIDHeader), h.Get(StandardTimestampHeader), h.Get(StandardSignatureHeader)
	if id == "" && ts == "" && sig == "" {
		return ErrMissing
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil {
		return ErrMalformed
	}
	var sigs [][]byte
	for part := range strings.FieldsSeq(sig) {
		version, value, ok := strings.Cut(part, ",")
		if !ok {
			return ErrMalformed
		}
		if version != "v1" {
			continue // only v1 (HMAC-SHA256) is trusted; v1a and later are ignored
		}
		s, err := base64.StdEncoding.DecodeString(value)
		if err != nil || len(s) != sha256.Size {
			return ErrMalformed
		}
		sigs = append(sigs, s)
	}
	if len(sigs) == 0 {
		return ErrMalformed
	}
	if d := now.Sub(time.Unix(unix, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	for _, secret := range secrets {
		key, err := StandardKey(secret)
		if err != nil {
			return err
		}
		want := standardMAC(key, id, ts, payload)
		for _, s := range sigs {
			if hmac.Equal(want, s) { // constant-time, as in Verify
				return nil
			}
		}
	}
	return ErrMismatch
}

func standardMAC(key []byte, id, ts string, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(payload)
	return m.Sum(nil)
}
