package httpapi_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	httpapi "github.com/idemref/payments/internal/http"
)

// Every JSON body ends with a newline (a success, a replay of it, a
// problem, a read), so curl -i prints the next line on a line of its own;
// a record stored before that rule replays as stored, without one.
// Mutation: drop the append in encodeJSON and every success case fails.
func TestJSONBodiesEndWithANewline(t *testing.T) {
	t.Parallel()
	e := setup(t)
	created := e.post(t, e.a.Key, "newline-1", orderBody("nl-1"))
	wantStatus(t, created, http.StatusCreated)
	replayed := e.post(t, e.a.Key, "newline-1", orderBody("nl-1"))
	wantReplay(t, created, replayed)
	for name, res := range map[string]response{
		"created":       created,
		"replayed":      replayed,
		"problem":       e.post(t, e.a.Key, "newline-1", orderBody("nl-2")), // 422 key reused
		"unauthorized":  e.get(t, "", "/v1/orders"),
		"list":          e.get(t, e.a.Key, "/v1/orders"),
		"healthz":       e.get(t, "", "/healthz"),
		"unknown route": e.get(t, "", "/v2/nothing"),
	} {
		if !bytes.HasSuffix(res.body, []byte("}\n")) || bytes.Count(res.body, []byte("\n")) != 1 {
			t.Errorf("%s: body %q, want one JSON value and one newline after it", name, res.body)
		}
	}

	// A record written before bodies ended with a newline: its replay is
	// the stored bytes, as its first answer was.
	tag, err := e.pool.Exec(context.Background(),
		`UPDATE idempotency_keys SET response_body = substring(response_body FROM 1 FOR length(response_body) - 1)
		 WHERE tenant_id = $1 AND idem_key = 'newline-1' AND get_byte(response_body, length(response_body) - 1) = 10`, e.a.ID)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("strip the stored newline: %v, %d rows", err, tag.RowsAffected())
	}
	old := e.post(t, e.a.Key, "newline-1", orderBody("nl-1"))
	wantStatus(t, old, http.StatusCreated)
	if old.header.Get(httpapi.ReplayedHeader) != "true" || !bytes.Equal(old.body, bytes.TrimSuffix(created.body, []byte("\n"))) {
		t.Errorf("the old record replayed %q (replayed %q), want the stored bytes %q", old.body, old.header.Get(httpapi.ReplayedHeader), bytes.TrimSuffix(created.body, []byte("\n")))
	}
}
