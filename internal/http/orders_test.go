package httpapi_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tenants"
)

// H: authentication comes first. A request without a valid key gets 401
// whatever else is wrong with it, and touches nothing.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	e := setup(t)

	revokedID, revokedKey, err := tenants.Create(t.Context(), e.pool, "revoked")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), "UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1", revokedID); err != nil {
		t.Fatal(err)
	}
	// Well-formed keys that were never issued.
	wrongSecret := "sk_" + hex.EncodeToString(e.a.ID[:]) + "_" + strings.Repeat("A", 43)
	otherID := uuid.New()
	unknownTenant := "sk_" + hex.EncodeToString(otherID[:]) + "_" + strings.Repeat("A", 43)

	tests := []struct {
		name          string
		authorization string // "" sends no header
	}{
		{name: "NoHeader", authorization: ""},
		{name: "WrongScheme", authorization: "Basic " + e.a.Key},
		{name: "NoScheme", authorization: e.a.Key},
		{name: "EmptyBearer", authorization: "Bearer "},
		{name: "UnknownSecret", authorization: "Bearer " + wrongSecret},
		{name: "UnknownTenant", authorization: "Bearer " + unknownTenant},
		{name: "MalformedKey", authorization: "Bearer not-a-key"},
		{name: "TruncatedKey", authorization: "Bearer " + e.a.Key[:len(e.a.Key)-1]},
		{name: "RevokedKey", authorization: "Bearer " + revokedKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Run("CreateIsRejectedBeforeTheKeyIsParsed", func(t *testing.T) {
				res := e.post(t, "", `"unterminated`, `not json`, withAuthorization(tt.authorization))
				wantProblem(t, res, http.StatusUnauthorized, httpapi.CodeUnauthorized)
			})
			t.Run("ValidCreateIsRejected", func(t *testing.T) {
				res := e.post(t, "", "auth-key", orderBody("inv-1"), withAuthorization(tt.authorization))
				wantProblem(t, res, http.StatusUnauthorized, httpapi.CodeUnauthorized)
			})
			t.Run("ReadsAreRejected", func(t *testing.T) {
				res := e.do(t, http.MethodGet, "/v1/orders", "", nil, withAuthorization(tt.authorization))
				wantProblem(t, res, http.StatusUnauthorized, httpapi.CodeUnauthorized)
			})
			e.wantRows(t, 0, 0)
		})
	}

	t.Run("SchemeIsCaseInsensitive", func(t *testing.T) {
		// RFC 9110 section 11.1: the authentication scheme is case-insensitive.
		res := e.post(t, "", "auth-key", orderBody("inv-1"), withAuthorization("bearer "+e.a.Key))
		wantStatus(t, res, http.StatusCreated)
		e.wantRows(t, 1, 1)
		e.wantKeyRecord(t, e.a.ID, "auth-key", http.StatusCreated)
	})
}

// H: one tenant's orders are invisible to another; unknown and malformed
// ids are indistinguishable from them.
func TestGetOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	created := e.post(t, e.a.Key, "k1", orderBody("inv-1"))
	wantStatus(t, created, http.StatusCreated)
	o := decodeOrder(t, created)

	t.Run("OwnerSeesTheOrder", func(t *testing.T) {
		res := e.get(t, e.a.Key, "/v1/orders/"+o.Id.String())
		wantStatus(t, res, http.StatusOK)
		want := api.Order{
			Id: o.Id, Reference: "inv-1", CustomerId: "cus_1", Amount: 2500, Currency: "EUR",
			Description: "", Metadata: api.Metadata{}, Status: api.OrderStatusPending, AmountPaid: 0, CreatedAt: o.CreatedAt,
		}
		if diff := cmp.Diff(want, decodeOrder(t, res)); diff != "" {
			t.Errorf("order (-want +got):\n%s", diff)
		}
		if _, err := uuid.Parse(o.Id.String()); err != nil {
			t.Errorf("id %q is not a UUID", o.Id.String())
		}
	})

	tests := []struct {
		name string
		key  string
		path string
	}{
		{name: "OtherTenantsOrder", key: e.b.Key, path: "/v1/orders/" + o.Id.String()},
		{name: "UnknownID", key: e.a.Key, path: "/v1/orders/" + uuid.NewString()},
		{name: "MalformedID", key: e.a.Key, path: "/v1/orders/not-a-uuid"},
		{name: "IDWithTrailingJunk", key: e.a.Key, path: "/v1/orders/" + o.Id.String() + "x"},
	}
	for _, tt := range tests {
		t.Run(tt.name+"IsNotFound", func(t *testing.T) {
			res := e.get(t, tt.key, tt.path)
			p := wantProblem(t, res, http.StatusNotFound, httpapi.CodeNotFound)
			if strings.Contains(string(res.body), o.Id.String()) {
				t.Errorf("the 404 mentions the order id: %+v", p)
			}
		})
	}
}

func (e *bundle) list(t *testing.T, apiKey, query string) api.OrderList {
	t.Helper()
	res := e.get(t, apiKey, "/v1/orders"+query)
	wantStatus(t, res, http.StatusOK)
	var l api.OrderList
	if err := json.Unmarshal(res.body, &l); err != nil {
		t.Fatalf("decode list: %v; body: %s", err, res.body)
	}
	if l.Data == nil {
		t.Errorf("data is null, want an array; body: %s", res.body)
	}
	return l
}

func ids(orders []api.Order) []string {
	out := []string{}
	for _, o := range orders {
		out = append(out, o.Id.String())
	}
	return out
}

func TestListOrders(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Created one after another, so newest first is the reverse order.
	var created []string
	for i := range 5 {
		res := e.post(t, e.a.Key, fmt.Sprintf("list-%d", i), orderBody(fmt.Sprintf("inv-%d", i)))
		wantStatus(t, res, http.StatusCreated)
		created = append([]string{decodeOrder(t, res).Id.String()}, created...)
	}
	other := e.post(t, e.b.Key, "list-b", orderBody("inv-b"))
	wantStatus(t, other, http.StatusCreated)
	e.wantRows(t, 6, 6)

	t.Run("ShowsOnlyOwnOrdersNewestFirst", func(t *testing.T) {
		l := e.list(t, e.a.Key, "")
		if diff := cmp.Diff(created, ids(l.Data)); diff != "" {
			t.Errorf("tenant a's list (-want +got):\n%s", diff)
		}
		if l.NextCursor != nil {
			t.Errorf("next_cursor = %q on the only page, want null", *l.NextCursor)
		}
		lb := e.list(t, e.b.Key, "")
		if diff := cmp.Diff([]string{decodeOrder(t, other).Id.String()}, ids(lb.Data)); diff != "" {
			t.Errorf("tenant b's list (-want +got):\n%s", diff)
		}
	})

	t.Run("CursorPagination", func(t *testing.T) {
		var pages [][]string
		query := "?limit=2"
		for range 10 { // bounded: a cursor that never ends fails below
			l := e.list(t, e.a.Key, query)
			pages = append(pages, ids(l.Data))
			if l.NextCursor == nil {
				break
			}
			query = "?limit=2&cursor=" + url.QueryEscape(*l.NextCursor)
		}
		want := [][]string{created[0:2], created[2:4], created[4:5]}
		if diff := cmp.Diff(want, pages); diff != "" {
			t.Errorf("pages (-want +got):\n%s", diff)
		}
	})

	t.Run("LastFullPageHasNoCursor", func(t *testing.T) {
		l := e.list(t, e.a.Key, "?limit=5")
		if diff := cmp.Diff(created, ids(l.Data)); diff != "" {
			t.Errorf("list (-want +got):\n%s", diff)
		}
		if l.NextCursor != nil {
			t.Errorf("next_cursor = %q, want null", *l.NextCursor)
		}
	})

	t.Run("CursorDoesNotCrossTenants", func(t *testing.T) {
		first := e.list(t, e.a.Key, "?limit=1")
		if first.NextCursor == nil {
			t.Fatal("no cursor after the first of 5 orders")
		}
		l := e.list(t, e.b.Key, "?cursor="+url.QueryEscape(*first.NextCursor))
		for _, o := range l.Data {
			if o.Reference != "inv-b" {
				t.Errorf("tenant b's page contains %s (%s)", o.Id.String(), o.Reference)
			}
		}
	})

	bad := []struct {
		name  string
		query string
	}{
		{name: "CursorNotBase64", query: "?cursor=!!!"},
		{name: "CursorNotIssued", query: "?cursor=bm90LWEtY3Vyc29y"},
		{name: "LimitZero", query: "?limit=0"},
		{name: "LimitNegative", query: "?limit=-1"},
		{name: "Limit101", query: "?limit=101"},
		{name: "LimitNotANumber", query: "?limit=ten"},
	}
	for _, tt := range bad {
		t.Run(tt.name+"IsInvalidQuery", func(t *testing.T) {
			res := e.get(t, e.a.Key, "/v1/orders"+tt.query)
			wantProblem(t, res, http.StatusBadRequest, httpapi.CodeInvalidQuery)
		})
	}

	t.Run("Limit100IsAccepted", func(t *testing.T) {
		if l := e.list(t, e.a.Key, "?limit=100"); len(l.Data) != 5 {
			t.Errorf("got %d orders, want 5", len(l.Data))
		}
	})
}

func TestSystemEndpoints(t *testing.T) {
	t.Parallel()
	e := setup(t)

	t.Run("HealthzIsOK", func(t *testing.T) {
		res := e.get(t, "", "/healthz")
		wantStatus(t, res, http.StatusOK)
		if diff := cmp.Diff(`{"status":"ok"}`+"\n", string(res.body)); diff != "" {
			t.Errorf("body (-want +got):\n%s", diff)
		}
	})

	t.Run("ReadyzIsOK", func(t *testing.T) {
		res := e.get(t, "", "/readyz")
		wantStatus(t, res, http.StatusOK)
		if diff := cmp.Diff(`{"status":"ready"}`+"\n", string(res.body)); diff != "" {
			t.Errorf("body (-want +got):\n%s", diff)
		}
	})

	t.Run("ServesTheOpenAPIDocument", func(t *testing.T) {
		res := e.get(t, "", "/openapi.yaml")
		wantStatus(t, res, http.StatusOK)
		if ct := res.header.Get("Content-Type"); ct != "application/yaml" {
			t.Errorf("Content-Type = %q, want application/yaml", ct)
		}
		if string(res.body) != string(apispec.OpenAPI) {
			t.Error("the served document differs from apispec.OpenAPI")
		}
	})

	notFound := []struct {
		name, key, path string
	}{
		{name: "UnknownRoute", path: "/nope"},
		{name: "UnknownVersion", path: "/v2/orders"},
		{name: "UnknownRouteUnderV1", key: e.a.Key, path: "/v1/nope"},
	}
	for _, tt := range notFound {
		t.Run(tt.name+"IsNotFoundProblem", func(t *testing.T) {
			wantProblem(t, e.get(t, tt.key, tt.path), http.StatusNotFound, httpapi.CodeNotFound)
		})
	}

	methodNotAllowed := []struct {
		name, method, key, path, allow string
	}{
		{name: "DeleteOrders", method: http.MethodDelete, key: e.a.Key, path: "/v1/orders", allow: "GET, HEAD, POST"},
		{name: "PutOrder", method: http.MethodPut, key: e.a.Key, path: "/v1/orders/" + uuid.NewString(), allow: "GET, HEAD, PATCH"},
		{name: "PostHealthz", method: http.MethodPost, path: "/healthz", allow: "GET, HEAD"},
	}
	for _, tt := range methodNotAllowed {
		t.Run(tt.name+"IsMethodNotAllowedProblem", func(t *testing.T) {
			res := e.do(t, tt.method, tt.path, tt.key, nil)
			wantProblem(t, res, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)
			// RFC 9110 section 15.5.6: a 405 must list the allowed methods.
			if got := res.header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q, want %q", got, tt.allow)
			}
		})
	}

	t.Run("EveryResponseHasARequestID", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/nope", "/v1/orders"} {
			if id := e.get(t, "", path).header.Get(httpapi.RequestIDHeader); id == "" {
				t.Errorf("GET %s: no %s", path, httpapi.RequestIDHeader)
			}
		}
	})

	t.Run("IncomingRequestIDIsKept", func(t *testing.T) {
		res := e.do(t, http.MethodGet, "/healthz", "", nil, withHeader(httpapi.RequestIDHeader, "trace-123"))
		if got := res.header.Get(httpapi.RequestIDHeader); got != "trace-123" {
			t.Errorf("%s = %q, want trace-123", httpapi.RequestIDHeader, got)
		}
	})

	t.Run("PostWithTrailingSlashIsTheSameEndpoint", func(t *testing.T) {
		first := e.post(t, e.a.Key, "slash-key", orderBody("inv-slash"))
		wantStatus(t, first, http.StatusCreated)
		again := e.do(t, http.MethodPost, "/v1/orders/", e.a.Key, []byte(orderBody("inv-slash")),
			withHeader(idem.HeaderName, "slash-key"))
		wantReplay(t, first, again)
		e.wantRows(t, 1, 1)
	})
}
