package httpapi_test

import (
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// L3, L4: the second request with the same key and body is answered from
// the record, byte for byte, and nothing runs twice.
func TestCreateOrderReplay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	body := `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"Invoice 1","metadata":{"plan":"pro"}}`

	first := e.post(t, e.a.Key, key, body)
	wantStatus(t, first, http.StatusCreated)
	o := decodeOrder(t, first)
	if got, want := first.header.Get("Location"), "/v1/orders/"+o.Id.String(); got != want {
		t.Errorf("Location = %q, want %q", got, want)
	}
	if got := first.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", got)
	}

	t.Run("ReplaysStoredResponseByteForByte", func(t *testing.T) {
		replay := e.post(t, e.a.Key, key, body)
		wantReplay(t, first, replay)
		if replay.header.Get(httpapi.RequestIDHeader) == first.header.Get(httpapi.RequestIDHeader) {
			t.Error("the replay carries the first request's X-Request-Id; it must have its own")
		}
	})

	t.Run("ExactlyOneOrderAndOneCompletedKey", func(t *testing.T) {
		e.wantRows(t, 1, 1)
		e.wantKeyRecord(t, e.a.ID, key, http.StatusCreated)
		// The record is scoped by the route template, not the path (K2).
		var endpoint string
		if err := e.pool.QueryRow(context.Background(), "SELECT endpoint FROM idempotency_keys").Scan(&endpoint); err != nil {
			t.Fatal(err)
		}
		if endpoint != endpointOrders {
			t.Errorf("endpoint = %q, want %q", endpoint, endpointOrders)
		}
	})

	t.Run("ReplayShowsTheOrderAsCreated", func(t *testing.T) {
		got := e.get(t, e.a.Key, "/v1/orders/"+o.Id.String())
		wantStatus(t, got, http.StatusOK)
		if diff := cmp.Diff(o, decodeOrder(t, got)); diff != "" {
			t.Errorf("GET differs from the created order (-created +get):\n%s", diff)
		}
	})
}

// T3, K2: the same key with another body is refused; the same key on
// another tenant is another key.
func TestCreateOrderKeyReuse(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "reused-key"
	first := e.post(t, e.a.Key, key, orderBody("inv-1"))
	wantStatus(t, first, http.StatusCreated)

	t.Run("DifferentBodyIsRejectedWith422", func(t *testing.T) {
		res := e.post(t, e.a.Key, key, orderBody("inv-2"))
		wantProblem(t, res, http.StatusUnprocessableEntity, httpapi.CodeKeyReused)
		if res.header.Get(httpapi.ReplayedHeader) != "" {
			t.Errorf("a 422 must not be marked as a replay")
		}
		e.wantRows(t, 1, 1)
		e.wantKeyRecord(t, e.a.ID, key, http.StatusCreated)
		if n := e.countOrdersWithReference(t, e.a.ID, "inv-2"); n != 0 {
			t.Errorf("orders with the second body's reference = %d, want 0", n)
		}
	})

	t.Run("SameKeyOnAnotherTenantExecutes", func(t *testing.T) {
		res := e.post(t, e.b.Key, key, orderBody("inv-1"))
		wantStatus(t, res, http.StatusCreated)
		if res.header.Get(httpapi.ReplayedHeader) != "" {
			t.Error("tenant b got a replay of tenant a's response")
		}
		if decodeOrder(t, res).Id == decodeOrder(t, first).Id {
			t.Error("tenant b got tenant a's order")
		}
		e.wantRows(t, 2, 2)
		if n := e.countOrdersWithReference(t, e.a.ID, "inv-1"); n != 1 {
			t.Errorf("tenant a orders = %d, want 1", n)
		}
		if n := e.countOrdersWithReference(t, e.b.ID, "inv-1"); n != 1 {
			t.Errorf("tenant b orders = %d, want 1", n)
		}
		e.wantKeyRecord(t, e.b.ID, key, http.StatusCreated)
	})
}

// K1: malformed, missing or ambiguous keys are 400 before anything is
// claimed or written.
func TestCreateOrderKeyRejected(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tests := []struct {
		name   string
		values []string // header lines; nil sends no header
		code   string
	}{
		{name: "Missing", values: nil, code: httpapi.CodeKeyMissing},
		{name: "Empty", values: []string{""}, code: httpapi.CodeKeyInvalid},
		{name: "EmptyQuoted", values: []string{`""`}, code: httpapi.CodeKeyInvalid},
		{name: "UnterminatedQuote", values: []string{`"unterminated`}, code: httpapi.CodeKeyInvalid},
		{name: "DataAfterClosingQuote", values: []string{`"abc"def`}, code: httpapi.CodeKeyInvalid},
		{name: "BadEscapeInQuotes", values: []string{`"a\bc"`}, code: httpapi.CodeKeyInvalid},
		{name: "ContainsSpace", values: []string{"abc def"}, code: httpapi.CodeKeyInvalid},
		{name: "SpaceInsideQuotes", values: []string{`"abc def"`}, code: httpapi.CodeKeyInvalid},
		{name: "ContainsControlCharacter", values: []string{"abc\tdef"}, code: httpapi.CodeKeyInvalid},
		{name: "ContainsNonASCII", values: []string{"clé"}, code: httpapi.CodeKeyInvalid},
		{name: "TooLong256", values: []string{strings.Repeat("k", 256)}, code: httpapi.CodeKeyInvalid},
		{name: "TooLongQuoted256", values: []string{`"` + strings.Repeat("k", 256) + `"`}, code: httpapi.CodeKeyInvalid},
		{name: "TwoHeaderLines", values: []string{"key-1", "key-1"}, code: httpapi.CodeKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []reqOption
			for _, v := range tt.values {
				opts = append(opts, withHeader(idem.HeaderName, v))
			}
			res := e.post(t, e.a.Key, "", orderBody("inv-"+tt.name), opts...)
			wantProblem(t, res, http.StatusBadRequest, tt.code)
			e.wantRows(t, 0, 0)
		})
	}

	t.Run("MaximumLength255Works", func(t *testing.T) {
		key := strings.Repeat("k", 255)
		res := e.post(t, e.a.Key, key, orderBody("inv-255"))
		wantStatus(t, res, http.StatusCreated)
		e.wantKeyRecord(t, e.a.ID, key, http.StatusCreated)
		e.wantRows(t, 1, 1)
	})
}

// K1: the sf-string and the bare token spell the same key.
func TestCreateOrderKeyForms(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		first, again string
		stored       string
	}{
		{name: "QuotedThenBare", first: `"abc"`, again: "abc", stored: "abc"},
		{name: "BareThenQuoted", first: "abc", again: `"abc"`, stored: "abc"},
		{name: "EscapedQuoteAndBackslash", first: `"a\"b\\c"`, again: `a"b\c`, stored: `a"b\c`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			first := e.post(t, e.a.Key, tt.first, orderBody("inv-1"))
			wantStatus(t, first, http.StatusCreated)
			again := e.post(t, e.a.Key, tt.again, orderBody("inv-1"))
			wantReplay(t, first, again)
			e.wantRows(t, 1, 1)
			e.wantKeyRecord(t, e.a.ID, tt.stored, http.StatusCreated)
		})
	}
}

// F4, O3: ambiguous bodies are rejected before the claim, so the key stays
// free for the corrected request.
func TestCreateOrderBodyRejected(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "body-key"
	valid := orderBody("inv-1")
	tests := []struct {
		name        string
		body        string
		contentType string // "" means application/json
		noCT        bool   // send no Content-Type at all
		status      int
		code        string
	}{
		{name: "Malformed", body: `{"reference":"inv-1",`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "NotJSON", body: `reference=inv-1`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "DuplicateMember", body: `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"amount":1,"currency":"EUR"}`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "UnknownField", body: `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","tip":5}`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "CaseVariantOfField", body: `{"reference":"inv-1","customer_id":"cus_1","Amount":2500,"currency":"EUR"}`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "AmountAsString", body: `{"reference":"inv-1","customer_id":"cus_1","amount":"5","currency":"EUR"}`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "AmountWithFraction", body: `{"reference":"inv-1","customer_id":"cus_1","amount":1.0,"currency":"EUR"}`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "AmountWithExponent", body: `{"reference":"inv-1","customer_id":"cus_1","amount":1e3,"currency":"EUR"}`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "MetadataValueNotString", body: `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","metadata":{"n":1}}`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "TrailingData", body: valid + `{}`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "TrailingGarbage", body: valid + ` x`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "TopLevelArray", body: `[` + valid + `]`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "TopLevelNull", body: `null`, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "Empty", body: ``, status: 400, code: httpapi.CodeInvalidJSON},
		{name: "OnlyWhitespace", body: " \n", status: 400, code: httpapi.CodeInvalidJSON},
		{name: "TooLarge", body: `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `"}`, status: 413, code: httpapi.CodeBodyTooLarge},
		{name: "TextPlain", body: valid, contentType: "text/plain", status: 415, code: httpapi.CodeUnsupportedMediaType},
		{name: "JSONLookalikeMediaType", body: valid, contentType: "application/jsonx", status: 415, code: httpapi.CodeUnsupportedMediaType},
		{name: "MissingContentType", body: valid, noCT: true, status: 415, code: httpapi.CodeUnsupportedMediaType},
	}
	// Subtests run in order on one key: if any rejection claimed it, the
	// final valid request would be a 409 or 422 instead of a 201.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []reqOption
			switch {
			case tt.noCT:
				opts = append(opts, withContentType(""))
			case tt.contentType != "":
				opts = append(opts, withContentType(tt.contentType))
			}
			res := e.post(t, e.a.Key, key, tt.body, opts...)
			wantProblem(t, res, tt.status, tt.code)
			e.wantRows(t, 0, 0)
		})
	}

	t.Run("KeyStillWorksForAValidBody", func(t *testing.T) {
		res := e.post(t, e.a.Key, key, valid, withContentType("application/json; charset=utf-8"))
		wantStatus(t, res, http.StatusCreated)
		if res.header.Get(httpapi.ReplayedHeader) != "" {
			t.Error("the first valid request was answered as a replay")
		}
		e.wantRows(t, 1, 1)
		e.wantKeyRecord(t, e.a.ID, key, http.StatusCreated)
	})
}

// F1: requests that mean the same thing have the same fingerprint, so a
// retry that is formatted differently is still a replay.
func TestCreateOrderFingerprintEquivalence(t *testing.T) {
	t.Parallel()
	groups := []struct {
		name        string
		first       string
		equivalents []struct{ name, body string }
		different   []struct{ name, body string }
	}{
		{
			name:  "Formatting",
			first: `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"café","metadata":{"a":"1","b":"2"}}`,
			equivalents: []struct{ name, body string }{
				{"FieldOrder", `{"metadata":{"b":"2","a":"1"},"currency":"EUR","description":"café","amount":2500,"customer_id":"cus_1","reference":"inv-1"}`},
				{"Whitespace", "{\n  \"reference\" : \"inv-1\",\n\t\"customer_id\":\"cus_1\", \"amount\": 2500 ,\"currency\":\"EUR\",\r\n\"description\":\"café\",\"metadata\":{ \"a\":\"1\" , \"b\":\"2\" } }\n"},
				{"UnicodeEscape", `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"caf\u00e9","metadata":{"a":"1","b":"2"}}`},
				{"EscapedASCII", `{"reference":"inv\u002d1","customer_id":"cus_1","amount":2500,"currency":"\u0045UR","description":"caf\u00E9","metadata":{"\u0061":"1","b":"2"}}`},
			},
			different: []struct{ name, body string }{
				{"DifferentAmount", `{"reference":"inv-1","customer_id":"cus_1","amount":2501,"currency":"EUR","description":"café","metadata":{"a":"1","b":"2"}}`},
				{"DifferentDescription", `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"cafe","metadata":{"a":"1","b":"2"}}`},
				{"DifferentMetadata", `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"café","metadata":{"a":"1"}}`},
			},
		},
		{
			name:  "Defaults",
			first: `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR"}`,
			equivalents: []struct{ name, body string }{
				{"DescriptionEmpty", `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":""}`},
				{"DescriptionNull", `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":null}`},
				{"MetadataEmpty", `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","metadata":{}}`},
				{"MetadataNull", `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","metadata":null}`},
				{"AllDefaultsExplicit", `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"","metadata":{}}`},
			},
			different: []struct{ name, body string }{
				{"DifferentAmount", `{"reference":"inv-1","customer_id":"cus_1","amount":2499,"currency":"EUR"}`},
				{"NonEmptyDescription", `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":" "}`},
			},
		},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			const key = "fingerprint-key"
			first := e.post(t, e.a.Key, key, g.first)
			wantStatus(t, first, http.StatusCreated)
			for _, eq := range g.equivalents {
				t.Run("ReplayFor"+eq.name, func(t *testing.T) {
					// Headers that do not change the meaning stay out of the
					// fingerprint (F2).
					res := e.post(t, e.a.Key, key, eq.body,
						withHeader("User-Agent", "retrying-client/2"),
						withHeader(httpapi.RequestIDHeader, "retry-"+eq.name))
					wantReplay(t, first, res)
					e.wantRows(t, 1, 1)
				})
			}
			for _, d := range g.different {
				t.Run("MismatchFor"+d.name, func(t *testing.T) {
					res := e.post(t, e.a.Key, key, d.body)
					wantProblem(t, res, http.StatusUnprocessableEntity, httpapi.CodeKeyReused)
					e.wantRows(t, 1, 1)
				})
			}
			e.wantKeyRecord(t, e.a.ID, key, http.StatusCreated)
		})
	}

	// 1 and 1.0 are the same JSON number, but amount is an integer field:
	// 1.0 is refused as ambiguous before any claim (F4), not replayed and not
	// compared as a mismatch.
	t.Run("OnePointZeroIsInvalidJSONNotAReplay", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		const key = "number-key"
		first := e.post(t, e.a.Key, key, `{"reference":"inv-1","customer_id":"cus_1","amount":1,"currency":"EUR"}`)
		wantStatus(t, first, http.StatusCreated)
		res := e.post(t, e.a.Key, key, `{"reference":"inv-1","customer_id":"cus_1","amount":1.0,"currency":"EUR"}`)
		wantProblem(t, res, http.StatusBadRequest, httpapi.CodeInvalidJSON)
		e.wantRows(t, 1, 1)
		e.wantKeyRecord(t, e.a.ID, key, http.StatusCreated)
	})
}

// O1: a semantic validation failure is deterministic, so it is recorded
// and replayed; it creates nothing.
func TestCreateOrderValidationFailureIsRecorded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tests := []struct {
		name   string
		body   string
		fields []string
	}{
		{name: "AmountZero", body: `{"reference":"inv-1","customer_id":"cus_1","amount":0,"currency":"EUR"}`, fields: []string{"amount"}},
		{name: "AmountNegative", body: `{"reference":"inv-1","customer_id":"cus_1","amount":-5,"currency":"EUR"}`, fields: []string{"amount"}},
		{name: "LowercaseCurrency", body: `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"eur"}`, fields: []string{"currency"}},
		{name: "UnknownCurrency", body: `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"XXZ"}`, fields: []string{"currency"}},
		{name: "EmptyReference", body: `{"reference":"","customer_id":"cus_1","amount":2500,"currency":"EUR"}`, fields: []string{"reference"}},
		{name: "MissingRequiredFields", body: `{"amount":2500,"currency":"EUR"}`, fields: []string{"reference", "customer_id"}},
		{name: "SeveralFields", body: `{"reference":"inv-1","customer_id":"","amount":0,"currency":"euro"}`, fields: []string{"customer_id", "amount", "currency"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "validation-" + tt.name
			first := e.post(t, e.a.Key, key, tt.body)
			p := wantProblem(t, first, http.StatusBadRequest, httpapi.CodeValidationFailed)
			var got []string
			for _, f := range deref(p.Errors) {
				got = append(got, f.Field)
				if f.Message == "" {
					t.Errorf("field %s has no message", f.Field)
				}
			}
			if diff := cmp.Diff(tt.fields, got); diff != "" {
				t.Errorf("errors[].field (-want +got):\n%s", diff)
			}
			e.wantKeyRecord(t, e.a.ID, key, http.StatusBadRequest)

			replay := e.post(t, e.a.Key, key, tt.body)
			wantReplay(t, first, replay)
			e.wantRows(t, 0, i+1)
		})
	}
}

// N1: a client that minted a new key for the same order still gets no
// second order; the 409 names the first and is itself recorded.
func TestCreateOrderNaturalKeyBackstop(t *testing.T) {
	t.Parallel()
	e := setup(t)
	first := e.post(t, e.a.Key, "key-a", orderBody("inv-1"))
	wantStatus(t, first, http.StatusCreated)
	created := decodeOrder(t, first)

	conflict := e.post(t, e.a.Key, "key-b", orderBody("inv-1"))
	p := wantProblem(t, conflict, http.StatusConflict, httpapi.CodeReferenceExists)
	if idString(p.OrderId) != created.Id.String() {
		t.Errorf("order_id = %q, want the first order %q", idString(p.OrderId), created.Id.String())
	}
	e.wantRows(t, 1, 2)
	e.wantKeyRecord(t, e.a.ID, "key-a", http.StatusCreated)
	e.wantKeyRecord(t, e.a.ID, "key-b", http.StatusConflict)

	t.Run("ConflictIsReplayed", func(t *testing.T) {
		replay := e.post(t, e.a.Key, "key-b", orderBody("inv-1"))
		wantReplay(t, conflict, replay)
		e.wantRows(t, 1, 2)
	})

	t.Run("ReferenceIsPerTenant", func(t *testing.T) {
		res := e.post(t, e.b.Key, "key-b", orderBody("inv-1"))
		wantStatus(t, res, http.StatusCreated)
		e.wantRows(t, 2, 3)
	})
}

// L5: a duplicate that meets an uncommitted claim waits at most the lock
// timeout, then gets 409 with Retry-After; nothing runs.
func TestCreateOrderBlockedByUncommittedClaim(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "held-key"
	ctx := context.Background()

	blocker, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = blocker.Rollback(context.Background()) })
	fingerprint := sha256.Sum256([]byte("another attempt's request"))
	if _, err := blocker.Exec(ctx,
		`INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until)
		 VALUES ($1, $2, $3, $4, $5, now() + interval '1 day', now() + interval '3 days')`,
		e.a.ID, endpointOrders, key, fingerprint[:], idem.FingerprintVersion); err != nil {
		t.Fatal(err)
	}

	res := e.post(t, e.a.Key, key, orderBody("inv-1"))
	wantProblem(t, res, http.StatusConflict, httpapi.CodeKeyInUse)
	wantRetryAfter(t, res)
	// The blocker's row is not committed, so it is invisible here.
	e.wantRows(t, 0, 0)

	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	t.Run("RetryAfterTheBlockerRollsBackSucceeds", func(t *testing.T) {
		res := e.post(t, e.a.Key, key, orderBody("inv-1"))
		wantStatus(t, res, http.StatusCreated)
		e.wantRows(t, 1, 1)
		e.wantKeyRecord(t, e.a.ID, key, http.StatusCreated)
	})
}

// O2, L2: a transient failure inside the transaction rolls back the claim
// with the order, so the retry with the same key runs for real.
func TestCreateOrderTransientFailureReleasesKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE SEQUENCE fail_once`,
		`CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		     -- nextval is not rolled back, so only the first insert fails.
		     IF nextval('fail_once') = 1 THEN
		         RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
		     END IF;
		     RETURN NEW;
		 END $$`,
		`CREATE TRIGGER orders_fail_once BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION fail_once()`,
	} {
		if _, err := e.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	const key = "transient-key"

	res := e.post(t, e.a.Key, key, orderBody("inv-1"))
	wantProblem(t, res, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	wantRetryAfter(t, res)
	e.wantRows(t, 0, 0)

	t.Run("RetryWithSameKeyCreatesExactlyOneOrder", func(t *testing.T) {
		res := e.post(t, e.a.Key, key, orderBody("inv-1"))
		wantStatus(t, res, http.StatusCreated)
		if res.header.Get(httpapi.ReplayedHeader) != "" {
			t.Error("the retry after a transient failure was answered as a replay")
		}
		e.wantRows(t, 1, 1)
		e.wantKeyRecord(t, e.a.ID, key, http.StatusCreated)
		// Both attempts reached the insert: the failure was really injected.
		if n := e.count(t, "SELECT last_value FROM fail_once"); n != 2 {
			t.Errorf("trigger ran %d times, want 2", n)
		}
	})
}

// L6: with the database gone the request fails closed with 503, nothing is
// executed, and the retry after recovery runs it once.
func TestCreateOrderDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	e := setup(t, withProxy())
	wantStatus(t, e.post(t, e.a.Key, "before", orderBody("inv-0")), http.StatusCreated)

	e.proxy.Cut()
	const key = "during-outage"
	res := e.post(t, e.a.Key, key, orderBody("inv-1"))
	wantProblem(t, res, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	wantRetryAfter(t, res)

	t.Run("ReadinessReportsTheOutage", func(t *testing.T) {
		res := e.get(t, "", "/readyz")
		wantProblem(t, res, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
		wantRetryAfter(t, res)
	})

	t.Run("NothingWasExecuted", func(t *testing.T) {
		// e.pool does not go through the proxy.
		if n := e.countOrdersWithReference(t, e.a.ID, "inv-1"); n != 0 {
			t.Errorf("orders for the outage request = %d, want 0", n)
		}
		if _, ok := e.keyRecord(t, e.a.ID, key); ok {
			t.Error("the outage request left an idempotency key row")
		}
		e.wantRows(t, 1, 1)
	})

	e.proxy.Restore()
	t.Run("RetryAfterRecoveryCreatesExactlyOneOrder", func(t *testing.T) {
		// The pool may still hold connections that died in the outage; each
		// costs one more 503 before it is discarded. Their number is bounded
		// by the pool size (2, see withProxy).
		res := e.post(t, e.a.Key, key, orderBody("inv-1"))
		for attempt := 1; res.status == http.StatusServiceUnavailable && attempt <= 2; attempt++ {
			res = e.post(t, e.a.Key, key, orderBody("inv-1"))
		}
		wantStatus(t, res, http.StatusCreated)
		if n := e.countOrdersWithReference(t, e.a.ID, "inv-1"); n != 1 {
			t.Errorf("orders for the retried request = %d, want 1", n)
		}
		e.wantKeyRecord(t, e.a.ID, key, http.StatusCreated)
		e.wantRows(t, 2, 2)

		wantStatus(t, e.get(t, "", "/readyz"), http.StatusOK)
	})
}
