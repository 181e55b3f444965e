package clienttest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idemref/payments/client"
)

// Whatever key an operation ran under, KeyStatus and Resolve find it: the
// key is sent in the path as it was sent in the header, so its %, /, ?, #,
// quotes and dot segments must survive the URL. A miss here would read as
// ErrKeyUnknown, "nothing committed", for an order that exists.
func TestKeyStatusFindsEveryKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client(t, client.Policy{MaxAttempts: 1})
	var every strings.Builder
	for ch := byte(0x21); ch <= 0x7e; ch++ {
		every.WriteByte(ch)
	}
	keys := []string{
		"50%off-1", "a/b", "q?x#y", "%25", "%2F/%", `a"b\c`,
		`"q-1"`,   // an sf-string: the server stores q-1
		`"\"x\""`, // an sf-string whose value is "x"
		".", "..", // dot segments a URL resolver would remove
		every.String(),
		strings.Repeat("%/", 127) + "%",
	}
	for i, key := range keys {
		ref := "inv-keys-" + strconv.Itoa(i)
		res, err := c.CreateOrder(t.Context(), key, orderRequest(ref))
		if err != nil {
			t.Fatalf("create under %q: %v", key, err)
		}
		want := "/v1/orders/" + res.Value.Id.String()
		st, err := c.KeyStatus(t.Context(), key, client.EndpointCreateOrder)
		if err != nil || st.State != "completed" || st.ResponseStatus == nil || *st.ResponseStatus != 201 ||
			st.Resource == nil || *st.Resource != want {
			t.Errorf("KeyStatus(%q) = %+v, %v; want completed with 201 and %s", key, st, err, want)
		}
		unknown := &client.OutcomeUnknownError{Key: key, Endpoint: client.EndpointCreateOrder}
		st, err = c.Resolve(t.Context(), unknown)
		if err != nil || st.State != "completed" || st.Resource == nil || *st.Resource != want {
			t.Errorf("Resolve(%q) = %+v, %v; want completed with %s", key, st, err, want)
		}
	}
	e.wantRows(t, "inv-keys-0", 1, len(keys))
}
