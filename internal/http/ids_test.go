package httpapi_test

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// idForms are the spellings of one UUID that uuid.Parse takes besides the
// canonical one the API writes (lower case, 36 characters, hyphens at 8,
// 13, 18 and 23). One id has one spelling: each of these is refused, the
// same way on every endpoint.
func idForms(t *testing.T, id string) map[string]string {
	t.Helper()
	first := strings.IndexAny(id, "abcdef")
	if first < 0 {
		t.Fatalf("id %s has no letter to spell in upper case", id)
	}
	return map[string]string{
		"UpperCase":       strings.ToUpper(id),
		"OneLetterUpper":  id[:first] + strings.ToUpper(id[first:first+1]) + id[first+1:],
		"WithoutHyphens":  strings.ReplaceAll(id, "-", ""),
		"Braced":          "{" + id + "}",
		"URN":             "urn:uuid:" + id,
		"URNUpperCase":    "urn:uuid:" + strings.ToUpper(id),
		"BracedUpperCase": "{" + strings.ToUpper(id) + "}",
	}
}

// letteredID is a new random UUID with at least one letter, so that its
// upper-case spelling differs.
func letteredID() string {
	for {
		if id := uuid.NewString(); strings.ContainsAny(id, "abcdef") {
			return id
		}
	}
}

func TestIDsInOneFormOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	tables := e.publicTables(t)

	order := e.newOrder(t, e.a, "ids-order")
	toPay := e.newOrder(t, e.a, "ids-to-pay")
	paidOrder, payment := e.paidOrder(t, e.a, "ids-paid")
	res := e.refund(t, e.a.Key, "ids-refund", payment.Id.String(), refundBody(100))
	wantStatus(t, res, http.StatusCreated)
	refund := decodeRefund(t, res)
	customer := letteredID()
	wantStatus(t, e.do(t, http.MethodPut, "/v1/customers/"+customer, e.a.Key, []byte(customerBody("Ada"))), http.StatusCreated)
	newCustomer := letteredID()

	// An endpoint takes an id in one place; request builds the request
	// with the id spelt as given.
	type endpoint struct {
		name string
		id   string // the canonical id it is given
		// request returns the method, path (and query) and body (nil: none).
		request func(id string) (method, path string, body []byte)
		opts    []reqOption
		// reject is the answer to any other spelling of the id; accept the
		// status of the canonical one.
		status int
		code   string
		accept int
	}
	pathOf := func(format string) func(id string) (string, string, []byte) {
		return func(id string) (string, string, []byte) {
			return http.MethodGet, fmt.Sprintf(format, url.PathEscape(id)), nil
		}
	}
	var keys int
	withKey := func(r *http.Request) { keys++; r.Header.Set(idem.HeaderName, fmt.Sprintf("ids-key-%d", keys)) }

	endpoints := []endpoint{
		{name: "GetOrder", id: order.Id.String(), request: pathOf("/v1/orders/%s"),
			status: 404, code: httpapi.CodeNotFound, accept: 200},
		{name: "PatchOrder", id: order.Id.String(), request: func(id string) (string, string, []byte) {
			return http.MethodPatch, "/v1/orders/" + url.PathEscape(id), []byte(`{"description":"ids"}`)
		}, opts: []reqOption{withHeader("If-Match", "*")}, status: 404, code: httpapi.CodeNotFound, accept: 200},
		{name: "GetPayment", id: payment.Id.String(), request: pathOf("/v1/payments/%s"),
			status: 404, code: httpapi.CodeNotFound, accept: 200},
		{name: "CreateRefund", id: payment.Id.String(), request: func(id string) (string, string, []byte) {
			return http.MethodPost, "/v1/payments/" + url.PathEscape(id) + "/refunds", []byte(refundBody(1))
		}, opts: []reqOption{withKey}, status: 404, code: httpapi.CodeNotFound, accept: 201},
		{name: "GetRefundPaymentID", id: payment.Id.String(), request: pathOf("/v1/payments/%s/refunds/" + refund.Id.String()),
			status: 404, code: httpapi.CodeNotFound, accept: 200},
		{name: "GetRefundRefundID", id: refund.Id.String(), request: pathOf("/v1/payments/" + payment.Id.String() + "/refunds/%s"),
			status: 404, code: httpapi.CodeNotFound, accept: 200},
		{name: "GetCustomer", id: customer, request: pathOf("/v1/customers/%s"),
			status: 404, code: httpapi.CodeNotFound, accept: 200},
		// The client chooses a customer's id: another spelling is its
		// request's fault.
		{name: "PutCustomer", id: newCustomer, request: func(id string) (string, string, []byte) {
			return http.MethodPut, "/v1/customers/" + url.PathEscape(id), []byte(customerBody("Grace"))
		}, status: 400, code: httpapi.CodeValidationFailed, accept: 201},
		{name: "ListPaymentsOfOrder", id: paidOrder.Id.String(), request: func(id string) (string, string, []byte) {
			return http.MethodGet, "/v1/payments?order_id=" + url.QueryEscape(id), nil
		}, status: 400, code: httpapi.CodeInvalidQuery, accept: 200},
		{name: "PayOrderIDInBody", id: toPay.Id.String(), request: func(id string) (string, string, []byte) {
			return http.MethodPost, "/v1/payments", []byte(paymentOf(id).String())
		}, opts: []reqOption{withKey}, status: 400, code: httpapi.CodeInvalidJSON, accept: 201},
	}

	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			forms := idForms(t, ep.id)
			for _, name := range slices.Sorted(maps.Keys(forms)) {
				t.Run(name, func(t *testing.T) {
					before := e.rowCounts(t, tables)
					method, path, body := ep.request(forms[name])
					res := e.do(t, method, path, e.a.Key, body, ep.opts...)
					wantProblem(t, res, ep.status, ep.code)
					after := e.rowCounts(t, tables)
					if diff := cmp.Diff(before, after); diff != "" {
						t.Errorf("rows changed (-before +after):\n%s", diff)
					}
				})
			}
			// Last, as it may create what the others must not.
			t.Run("Canonical", func(t *testing.T) {
				method, path, body := ep.request(ep.id)
				res := e.do(t, method, path, e.a.Key, body, ep.opts...)
				wantStatus(t, res, ep.accept)
			})
		})
	}
}
