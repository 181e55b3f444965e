package webhook_test

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/idemref/payments/internal/webhook"
)

// The Standard Webhooks scheme, checked against an implementation we did
// not write: the scheme's own Go library signs what VerifyStandard must
// accept, and verifies what SignStandard produces.
func TestStandardWebhooksAgainstTheReferenceLibrary(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	const other = "whsec_" + "c2VjcmV0LXRoYXQtaXMtbm90LXRoZS1yaWdodC1vbmU="
	payload := []byte(`{"id":"evt_1","type":"charge.succeeded","data":{"object":{"id":"ch_1"}}}`)
	ref, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	headers := func(id string, at time.Time, sig string) http.Header {
		h := http.Header{}
		h.Set(webhook.StandardIDHeader, id)
		h.Set(webhook.StandardTimestampHeader, strconv.FormatInt(at.Unix(), 10))
		h.Set(webhook.StandardSignatureHeader, sig)
		return h
	}
	signed, err := ref.Sign("msg_1", now, payload)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		payload []byte
		h       http.Header
		secrets []string
		want    error
	}{
		{"SignedByTheLibrary", payload, headers("msg_1", now, signed), []string{secret}, nil},
		{"DuringARotation", payload, headers("msg_1", now, "v1,"+base64.StdEncoding.EncodeToString(make([]byte, 32))+" "+signed), []string{other, secret}, nil},
		{"BodyAltered", append([]byte(" "), payload...), headers("msg_1", now, signed), []string{secret}, webhook.ErrMismatch},
		{"IDAltered", payload, headers("msg_2", now, signed), []string{secret}, webhook.ErrMismatch},
		{"WrongSecret", payload, headers("msg_1", now, signed), []string{other}, webhook.ErrMismatch},
		{"Stale", payload, headers("msg_1", now.Add(-6*time.Minute), mustSign(t, ref, "msg_1", now.Add(-6*time.Minute), payload)), []string{secret}, webhook.ErrStale},
		{"FromTheFuture", payload, headers("msg_1", now.Add(6*time.Minute), mustSign(t, ref, "msg_1", now.Add(6*time.Minute), payload)), []string{secret}, webhook.ErrStale},
		{"NoHeaders", payload, http.Header{}, []string{secret}, webhook.ErrMissing},
		{"OnlyAnotherVersion", payload, headers("msg_1", now, "v1a,"+base64.StdEncoding.EncodeToString(make([]byte, 64))), []string{secret}, webhook.ErrMalformed},
		{"SignatureNotBase64", payload, headers("msg_1", now, "v1,!!!"), []string{secret}, webhook.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := webhook.VerifyStandard(tt.payload, tt.h, tt.secrets, now, webhook.DefaultTolerance); !errors.Is(err, tt.want) {
				t.Errorf("VerifyStandard = %v, want %v", err, tt.want)
			}
		})
	}

	t.Run("OurSignatureVerifiesWithTheLibrary", func(t *testing.T) {
		t.Parallel()
		sig, err := webhook.SignStandard("msg_9", now, payload, secret)
		if err != nil {
			t.Fatal(err)
		}
		if err := ref.Verify(payload, headers("msg_9", now, sig)); err != nil {
			t.Errorf("the reference library refused our signature %q: %v", sig, err)
		}
		if err := ref.Verify([]byte(`{}`), headers("msg_9", now, sig)); err == nil {
			t.Error("the reference library accepted our signature over another body")
		}
	})
}

func mustSign(t *testing.T, wh *standardwebhooks.Webhook, id string, at time.Time, payload []byte) string {
	t.Helper()
	s, err := wh.Sign(id, at, payload)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
