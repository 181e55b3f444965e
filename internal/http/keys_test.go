package httpapi_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
)

// printableKey is every visible ASCII character once: the longest run of
// characters a path segment must carry (%, /, ?, #, ", \ and the rest).
func printableKey() string {
	var b strings.Builder
	for c := byte(0x21); c <= 0x7e; c++ {
		b.WriteByte(c)
	}
	return b.String()
}

// E4 with K1: the {key} segment of GET /v1/idempotency-keys/{key} is read
// like the Idempotency-Key header (bare, or an sf-string in quotes) after
// it is percent-decoded exactly once, and names the key the claim stored.
// Every key that ran must be found, whatever characters it has and
// whichever form the POST sent it in: a 404 here tells the client nothing
// was committed, and it would send the request again under a new key.
func TestKeyStatusFindsEveryKeyForm(t *testing.T) {
	t.Parallel()
	e := setup(t)

	tests := []struct {
		name   string
		header string // the Idempotency-Key the POST sends
		stored string // the key the claim stores (ParseKey of header)
		// segments are extra ways to name the key in the path, already
		// percent-encoded. The stored key, path-escaped, is always tried
		// too, unless it starts with a quote: like the header, the path
		// reads such a value as an sf-string.
		segments []string
	}{
		// Decoded, the path has no escape left: routed on the decoded path.
		{name: "PercentSign", header: "50%off-1", stored: "50%off-1"},
		// %2F cannot be decoded without changing the route: routed on the raw path.
		{name: "Slash", header: "a/b", stored: "a/b"},
		{name: "QueryAndFragment", header: "q?x#y", stored: "q?x#y"},
		{name: "EscapeLookalike", header: "%25", stored: "%25"},
		{name: "EscapeLookalikeAndSlash", header: "%2F/%", stored: "%2F/%"},
		{
			name: "SFString", header: `"q-1"`, stored: "q-1",
			segments: []string{url.PathEscape(`"q-1"`)},
		},
		{
			name: "SFStringWithEscapes", header: `"a\"b\\c%"`, stored: `a"b\c%`,
			segments: []string{url.PathEscape(`"a\"b\\c%"`)},
		},
		// A key whose value starts with a quote can only be sent as an
		// sf-string, in the header and in the path alike; "x" there names
		// the key x.
		{
			name: "ValueInQuotes", header: `"\"x\""`, stored: `"x"`,
			segments: []string{url.PathEscape(`"\"x\""`)},
		},
		{
			name: "QuotedFormNamesTheBareKey", header: "x", stored: "x",
			segments: []string{url.PathEscape(`"x"`)},
		},
		{
			name: "DotDot", header: "..", stored: "..",
			segments: []string{"%2E%2E", url.PathEscape(`".."`)},
		},
		{name: "EveryVisibleCharacter", header: printableKey(), stored: printableKey()},
		{name: "Longest", header: strings.Repeat("%/", 127) + "%", stored: strings.Repeat("%/", 127) + "%"},
	}
	for i, tc := range tests {
		ref := "inv-keyform-" + strconv.Itoa(i)
		created := e.post(t, e.a.Key, tc.header, orderBody(ref))
		wantStatus(t, created, http.StatusCreated)
		o := decodeOrder(t, created)
		var stored int
		if err := e.pool.QueryRow(t.Context(),
			"SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3",
			e.a.ID, endpointOrders, tc.stored).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != 1 {
			t.Fatalf("%s: %d idempotency_keys rows for %q, want 1", tc.name, stored, tc.stored)
		}
		segments := tc.segments
		if !strings.HasPrefix(tc.stored, `"`) {
			segments = append([]string{url.PathEscape(tc.stored)}, segments...)
		}
		for _, seg := range segments {
			path := "/v1/idempotency-keys/" + seg + "?endpoint=" + url.QueryEscape(endpointOrders)
			res := e.get(t, e.a.Key, path)
			if res.status != http.StatusOK {
				t.Errorf("%s: GET %s = %d %s, want 200", tc.name, path, res.status, res.body)
				continue
			}
			var st api.IdempotencyKeyStatus
			decodeJSON(t, res, &st)
			if st.Key != tc.stored || st.State != "completed" || st.ResponseStatus == nil || *st.ResponseStatus != http.StatusCreated ||
				st.Resource == nil || *st.Resource != "/v1/orders/"+o.Id.String() {
				t.Errorf("%s: GET %s = %+v, want key %q completed with 201 and /v1/orders/%s", tc.name, path, st, tc.stored, o.Id.String())
			}
		}
	}

	// The segment is validated as a key after decoding.
	for _, seg := range []string{"%22q-1", "%22q-1%22x", "a%20b", "a%00b", "%C3%A9", url.PathEscape(strings.Repeat("k", 256))} {
		res := e.get(t, e.a.Key, "/v1/idempotency-keys/"+seg+"?endpoint="+url.QueryEscape(endpointOrders))
		wantProblem(t, res, http.StatusBadRequest, httpapi.CodeKeyInvalid)
	}
}
