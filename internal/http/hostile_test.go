package httpapi_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// A catalogue of hostile and malformed requests (H, K1, F4, R2, R3): every
// endpoint, every way a request can be wrong before or around the
// idempotency layer. Each row states the answer and what it may write; the
// harness checks the status, the problem code, the headers every response
// carries, that the server still answers /healthz, and the row count of
// every table in the public schema before and after.

// hostileCase is one row of the catalogue.
type hostileCase struct {
	name   string // says what is hostile
	method string
	path   string
	// auth and key are the Authorization and Idempotency-Key header lines:
	// nil sends the default (tenant a's bearer key; a fresh key on POSTs),
	// noHeader sends no header at all.
	auth []string
	key  []string
	opts []reqOption
	body string // sent on POSTs (also when empty)
	// status and code are the answer; code for problem answers only.
	status int
	code   string
	detail string // a substring the problem's detail must contain
	// writes is the number of rows each table gains; nil: nothing at all.
	writes map[string]int
	replay bool // the answer is a replay (Idempotent-Replayed: true)
	// wrongToken: a well-formed bearer key that is not one (a 401 with
	// error="invalid_token").
	wrongToken bool
}

// noHeader, as a row's auth or key, sends no such header.
var noHeader = []string{}

// What a row may write.
var (
	writesKey   = map[string]int{"idempotency_keys": 1} // a recorded outcome, nothing else
	writesOrder = map[string]int{"orders": 1, "idempotency_keys": 1}
	// A finished payment or refund also writes its event to the outbox.
	writesPayment = map[string]int{"payments": 1, "idempotency_keys": 1, "outbox": 1}
	writesRefund  = map[string]int{"refunds": 1, "idempotency_keys": 1, "outbox": 1}
)

// members is a JSON object under construction: names and raw JSON values,
// in order, duplicates allowed.
type members [][2]string

// set replaces the value of name, or appends it.
func (ms members) set(name, raw string) members {
	out := slices.Clone(ms)
	for i := range out {
		if out[i][0] == name {
			out[i][1] = raw
			return out
		}
	}
	return append(out, [2]string{name, raw})
}

// add appends name even if it is there already.
func (ms members) add(name, raw string) members {
	return append(slices.Clone(ms), [2]string{name, raw})
}

func (ms members) String() string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = strconv.Quote(m[0]) + ":" + m[1]
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// orderOf is a valid create-order body for ref.
func orderOf(ref string) members {
	return members{{"reference", strconv.Quote(ref)}, {"customer_id", `"cus_1"`}, {"amount", "2500"}, {"currency", `"EUR"`}}
}

// paymentOf is a valid body paying orderID in full.
func paymentOf(orderID string) members {
	return members{{"order_id", strconv.Quote(orderID)}, {"amount", "2500"}, {"currency", `"EUR"`}, {"payment_method", `"pm_card_visa"`}}
}

// padTo pads a JSON body with trailing whitespace to exactly n bytes.
func padTo(body string, n int) string { return body + strings.Repeat(" ", n-len(body)) }

// nested is a metadata value nested depth arrays deep.
func nested(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }

// bearer is an Authorization header line.
func bearer(key string) string { return "Bearer " + key }

func TestHostileRequests(t *testing.T) {
	e := setup(t, withProcessor())

	// Fixtures: an unpaid order (payments that slip through pay it), one to
	// pay for real, a paid order with a payment to refund, and another
	// tenant's order and payment.
	unpaid := e.newOrder(t, e.a, "hostile-unpaid")
	toPay := e.newOrder(t, e.a, "hostile-to-pay")
	paidOrder, paid := e.paidOrder(t, e.a, "hostile-paid")
	otherOrder, otherPaid := e.paidOrder(t, e.b, "hostile-other")

	var refs int
	// newOrder is a valid body with a reference no other row uses, so a row
	// that slips through cannot collide with the next.
	newOrder := func() members { refs++; return orderOf(fmt.Sprintf("hostile-%d", refs)) }
	pay := func() members { return paymentOf(unpaid.Id.String()) }
	const refundOf100 = `{"amount":100}`

	// Keys that are well-formed but never issued.
	wrongKey := "sk_" + hex.EncodeToString(e.a.ID[:]) + "_" + strings.Repeat("A", 43)
	valid := bearer(e.a.Key)

	const (
		orders   = "/v1/orders"
		payments = "/v1/payments"
	)
	refunds := "/v1/payments/" + paid.Id.String() + "/refunds"
	tooLarge := padTo(newOrder().String(), httpapi.MaxBodyBytes+1)
	// Bodies two rows send alike: the second is a replay.
	zeroAmount := orderOf("hostile-zero").set("amount", "0").String()
	bareCreate := orderOf("hostile-bare").String()

	get, post, del := http.MethodGet, http.MethodPost, http.MethodDelete
	ct := withContentType
	hdr := withHeader
	const (
		keyMissing = httpapi.CodeKeyMissing
		keyInvalid = httpapi.CodeKeyInvalid
		unauth     = httpapi.CodeUnauthorized
		media      = httpapi.CodeUnsupportedMediaType
		badJSON    = httpapi.CodeInvalidJSON
		tooBig     = httpapi.CodeBodyTooLarge
		invalid    = httpapi.CodeValidationFailed
		notFound   = httpapi.CodeNotFound
		badMethod  = httpapi.CodeMethodNotAllowed
		badQuery   = httpapi.CodeInvalidQuery
	)

	cases := []hostileCase{
		// --- POST /v1/orders: the Idempotency-Key (K1) ---
		{name: "CreateOrder/KeyMissing", method: post, path: orders, key: noHeader, body: newOrder().String(), status: 400, code: keyMissing},
		{name: "CreateOrder/KeyEmpty", method: post, path: orders, key: []string{""}, body: newOrder().String(), status: 400, code: keyInvalid},
		{name: "CreateOrder/KeyEmptySFString", method: post, path: orders, key: []string{`""`}, body: newOrder().String(), status: 400, code: keyInvalid},
		{name: "CreateOrder/Key256Chars", method: post, path: orders, key: []string{strings.Repeat("k", 256)}, body: newOrder().String(), status: 400, code: keyInvalid},
		{name: "CreateOrder/KeyControlChar", method: post, path: orders, key: []string{"abc\tdef"}, body: newOrder().String(), status: 400, code: keyInvalid},
		{name: "CreateOrder/KeySpaceInside", method: post, path: orders, key: []string{"abc def"}, body: newOrder().String(), status: 400, code: keyInvalid},
		{name: "CreateOrder/KeyNonASCII", method: post, path: orders, key: []string{"clé-1"}, body: newOrder().String(), status: 400, code: keyInvalid},
		{name: "CreateOrder/KeyTwoHeaderLines", method: post, path: orders, key: []string{"k-two", "k-two"}, body: newOrder().String(), status: 400, code: keyInvalid},
		{name: "CreateOrder/KeyUnterminatedSFString", method: post, path: orders, key: []string{`"abc`}, body: newOrder().String(), status: 400, code: keyInvalid},
		{name: "CreateOrder/KeyDataAfterSFString", method: post, path: orders, key: []string{`"abc"def`}, body: newOrder().String(), status: 400, code: keyInvalid},
		{name: "CreateOrder/KeyBareAccepted", method: post, path: orders, key: []string{"hostile-bare"}, body: bareCreate, status: 201, writes: writesOrder},
		{name: "CreateOrder/KeyBareReplayed", method: post, path: orders, key: []string{`"hostile-bare"`}, body: bareCreate, status: 201, replay: true},
		{name: "CreateOrder/KeySFStringAccepted", method: post, path: orders, key: []string{`"hostile-sf-1"`}, body: newOrder().String(), status: 201, writes: writesOrder},
		{name: "CreateOrder/Key255CharsAccepted", method: post, path: orders, key: []string{strings.Repeat("k", 255)}, body: newOrder().String(), status: 201, writes: writesOrder},

		// --- POST /v1/orders: authentication (H), before anything else ---
		{name: "CreateOrder/NoAuthorization", method: post, path: orders, auth: noHeader, body: newOrder().String(), status: 401, code: unauth},
		{name: "CreateOrder/WrongAPIKey", method: post, path: orders, auth: []string{bearer(wrongKey)}, body: newOrder().String(), status: 401, code: unauth, wrongToken: true},
		{name: "CreateOrder/BasicScheme", method: post, path: orders, auth: []string{"Basic " + e.a.Key}, body: newOrder().String(), status: 401, code: unauth},
		{name: "CreateOrder/KeyWithoutScheme", method: post, path: orders, auth: []string{e.a.Key}, body: newOrder().String(), status: 401, code: unauth},
		{name: "CreateOrder/BearerWithNothingAfter", method: post, path: orders, auth: []string{"Bearer"}, body: newOrder().String(), status: 401, code: unauth},
		{name: "CreateOrder/BearerKeyWithTrailingJunk", method: post, path: orders, auth: []string{valid + " extra"}, body: newOrder().String(), status: 401, code: unauth},
		{name: "CreateOrder/BearerHugeToken", method: post, path: orders, auth: []string{bearer(strings.Repeat("A", 15<<10))}, body: newOrder().String(), status: 401, code: unauth, wrongToken: true},
		{name: "CreateOrder/HeaderBlockOverLimit", method: post, path: orders, auth: []string{bearer(strings.Repeat("A", 16<<10))}, body: newOrder().String(), status: 431, code: "headers_too_large"},
		{name: "CreateOrder/TwoAuthorizationLinesSecondInvalid", method: post, path: orders, auth: []string{valid, bearer(wrongKey)}, body: newOrder().String(), status: 401, code: unauth},
		{name: "CreateOrder/TwoAuthorizationLinesBothValid", method: post, path: orders, auth: []string{valid, valid}, body: newOrder().String(), status: 401, code: unauth},
		{name: "CreateOrder/BearerSeveralSpacesAccepted", method: post, path: orders, auth: []string{"Bearer    " + e.a.Key}, body: newOrder().String(), status: 201, writes: writesOrder},
		{name: "CreateOrder/LowercaseSchemeAccepted", method: post, path: orders, auth: []string{"bearer " + e.a.Key}, body: newOrder().String(), status: 201, writes: writesOrder},
		{name: "CreateOrder/UppercaseSchemeAccepted", method: post, path: orders, auth: []string{"BEARER " + e.a.Key}, body: newOrder().String(), status: 201, writes: writesOrder},

		// --- POST /v1/orders: media type and encoding (F4) ---
		{name: "CreateOrder/ContentTypeMissing", method: post, path: orders, opts: []reqOption{ct("")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/ContentTypeTextPlain", method: post, path: orders, opts: []reqOption{ct("text/plain")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/ContentTypeForm", method: post, path: orders, opts: []reqOption{ct("application/x-www-form-urlencoded")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/ContentTypeJSONLookalike", method: post, path: orders, opts: []reqOption{ct("application/jsonx")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/CharsetLatin1", method: post, path: orders, opts: []reqOption{ct("application/json; charset=latin1")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/CharsetISO88591Uppercase", method: post, path: orders, opts: []reqOption{ct("application/json; charset=ISO-8859-1")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/CharsetUTF16", method: post, path: orders, opts: []reqOption{ct("application/json; charset=utf-16")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/CharsetUTF8UppercaseAccepted", method: post, path: orders, opts: []reqOption{ct("application/json; charset=UTF-8")}, body: newOrder().String(), status: 201, writes: writesOrder},
		{name: "CreateOrder/MediaTypeUppercaseAccepted", method: post, path: orders, opts: []reqOption{ct("Application/JSON")}, body: newOrder().String(), status: 201, writes: writesOrder},
		{name: "CreateOrder/ContentEncodingGzip", method: post, path: orders, opts: []reqOption{hdr("Content-Encoding", "gzip")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/ContentEncodingBr", method: post, path: orders, opts: []reqOption{hdr("Content-Encoding", "br")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/ContentEncodingDeflate", method: post, path: orders, opts: []reqOption{hdr("Content-Encoding", "deflate")}, body: newOrder().String(), status: 415, code: media},
		{name: "CreateOrder/ContentEncodingIdentityAccepted", method: post, path: orders, opts: []reqOption{hdr("Content-Encoding", "identity")}, body: newOrder().String(), status: 201, writes: writesOrder},

		// --- POST /v1/orders: ambiguous bodies, rejected before the claim (F4) ---
		{name: "CreateOrder/BodyEmpty", method: post, path: orders, body: "", status: 400, code: badJSON},
		{name: "CreateOrder/BodyNull", method: post, path: orders, body: "null", status: 400, code: badJSON},
		{name: "CreateOrder/BodyArray", method: post, path: orders, body: "[]", status: 400, code: badJSON},
		{name: "CreateOrder/BodyString", method: post, path: orders, body: `"str"`, status: 400, code: badJSON},
		{name: "CreateOrder/BodyNumber", method: post, path: orders, body: "123", status: 400, code: badJSON},
		{name: "CreateOrder/BodyTruncated", method: post, path: orders, body: strings.TrimSuffix(newOrder().String(), "}"), status: 400, code: badJSON},
		{name: "CreateOrder/BodyTrailingObject", method: post, path: orders, body: newOrder().String() + "{}", status: 400, code: badJSON},
		{name: "CreateOrder/DuplicateMember", method: post, path: orders, body: newOrder().add("amount", "1").String(), status: 400, code: badJSON},
		{name: "CreateOrder/UnknownMember", method: post, path: orders, body: newOrder().add("tip", "5").String(), status: 400, code: badJSON},
		{name: "CreateOrder/CaseVariantMember", method: post, path: orders, body: newOrder().add("Reference", `"x"`).String(), status: 400, code: badJSON},
		{name: "CreateOrder/AmountAsString", method: post, path: orders, body: newOrder().set("amount", `"2500"`).String(), status: 400, code: badJSON},
		{name: "CreateOrder/AmountOnePointZero", method: post, path: orders, body: newOrder().set("amount", "1.0").String(), status: 400, code: badJSON},
		{name: "CreateOrder/AmountExponent", method: post, path: orders, body: newOrder().set("amount", "1e3").String(), status: 400, code: badJSON},
		{name: "CreateOrder/AmountBeyondInt64", method: post, path: orders, body: newOrder().set("amount", "9223372036854775808").String(), status: 400, code: badJSON},
		{name: "CreateOrder/ReferenceAsObject", method: post, path: orders, body: newOrder().set("reference", `{"a":"b"}`).String(), status: 400, code: badJSON},
		{name: "CreateOrder/MetadataValueAsNumber", method: post, path: orders, body: newOrder().set("metadata", `{"n":1}`).String(), status: 400, code: badJSON},
		{name: "CreateOrder/BodyOverLimit", method: post, path: orders, body: tooLarge, status: 413, code: tooBig},
		{name: "CreateOrder/BodyAtLimitAccepted", method: post, path: orders, body: padTo(newOrder().String(), httpapi.MaxBodyBytes), status: 201, writes: writesOrder},
		{name: "CreateOrder/NestingDepth33", method: post, path: orders, body: newOrder().set("metadata", nested(33)).String(), status: 400, code: badJSON},
		{name: "CreateOrder/NestingDepth10000", method: post, path: orders, body: newOrder().set("metadata", nested(10000)).String(), status: 400, code: badJSON},
		{name: "CreateOrder/NestingDepth10000Unclosed", method: post, path: orders, body: `{"metadata":` + strings.Repeat("[", 10000), status: 400, code: badJSON},

		// --- POST /v1/orders: bytes that are not UTF-8 text without NUL (R3) ---
		{name: "CreateOrder/NULInReference", method: post, path: orders, body: newOrder().set("reference", `"inv\u0000-1"`).String(), status: 400, code: badJSON, detail: "reference"},
		{name: "CreateOrder/NULInCustomerID", method: post, path: orders, body: newOrder().set("customer_id", `"cus\u0000"`).String(), status: 400, code: badJSON, detail: "customer_id"},
		{name: "CreateOrder/NULInDescription", method: post, path: orders, body: newOrder().set("description", `"a\u0000b"`).String(), status: 400, code: badJSON, detail: "description"},
		{name: "CreateOrder/NULInMetadataKey", method: post, path: orders, body: newOrder().set("metadata", `{"k\u0000":"v"}`).String(), status: 400, code: badJSON, detail: "metadata"},
		{name: "CreateOrder/NULInMetadataValue", method: post, path: orders, body: newOrder().set("metadata", `{"k":"v\u0000"}`).String(), status: 400, code: badJSON, detail: "metadata"},
		{name: "CreateOrder/RawNULByte", method: post, path: orders, body: newOrder().set("description", "\"a\x00b\"").String(), status: 400, code: badJSON},
		{name: "CreateOrder/InvalidUTF8ByteFF", method: post, path: orders, body: newOrder().set("reference", "\"inv\xff-1\"").String(), status: 400, code: badJSON},
		{name: "CreateOrder/InvalidUTF8SequenceC328", method: post, path: orders, body: newOrder().set("description", "\"a\xc3\x28b\"").String(), status: 400, code: badJSON},
		{name: "CreateOrder/InvalidUTF8InMetadataKey", method: post, path: orders, body: newOrder().set("metadata", "{\"k\xfe\":\"v\"}").String(), status: 400, code: badJSON},
		{name: "CreateOrder/LoneHighSurrogate", method: post, path: orders, body: newOrder().set("description", `"a\ud800b"`).String(), status: 400, code: badJSON},
		{name: "CreateOrder/LoneLowSurrogate", method: post, path: orders, body: newOrder().set("customer_id", `"cus\udc00"`).String(), status: 400, code: badJSON},

		// --- POST /v1/orders: semantic failures are recorded (O1): the key row only ---
		{name: "CreateOrder/AmountNegative", method: post, path: orders, body: newOrder().set("amount", "-5").String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/AmountZero", method: post, path: orders, key: []string{"hostile-zero"}, body: zeroAmount, status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/AmountAtTheCeilingAccepted", method: post, path: orders, body: newOrder().set("amount", "99999999").String(), status: 201, writes: writesOrder},
		{name: "CreateOrder/AmountOverTheCeiling", method: post, path: orders, body: newOrder().set("amount", "100000000").String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/AmountInt64Max", method: post, path: orders, body: newOrder().set("amount", "9223372036854775807").String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/ReferenceWhitespaceOnly", method: post, path: orders, body: newOrder().set("reference", `" \t "`).String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/ReferenceWithBell", method: post, path: orders, body: newOrder().set("reference", `"ord\u0007"`).String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/ReferenceWithEscape", method: post, path: orders, body: newOrder().set("reference", `"ord\u001b[2J"`).String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/ReferenceWithLineBreak", method: post, path: orders, body: newOrder().set("reference", `"ord\r\nx"`).String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/CustomerIDWithRightToLeftOverride", method: post, path: orders, body: newOrder().set("customer_id", `"cus_\u202egnp"`).String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/AmountZeroReplayed", method: post, path: orders, key: []string{"hostile-zero"}, body: zeroAmount, status: 400, code: invalid, replay: true},
		{name: "CreateOrder/CurrencyLowercase", method: post, path: orders, body: newOrder().set("currency", `"eur"`).String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/CurrencyUnknown", method: post, path: orders, body: newOrder().set("currency", `"XXZ"`).String(), status: 400, code: invalid, writes: writesKey},
		{name: "CreateOrder/ReferenceEmpty", method: post, path: orders, body: newOrder().set("reference", `""`).String(), status: 400, code: invalid, writes: writesKey},

		// --- POST /v1/payments ---
		{name: "Pay/KeyMissing", method: post, path: payments, key: noHeader, body: pay().String(), status: 400, code: keyMissing},
		{name: "Pay/KeyTwoHeaderLines", method: post, path: payments, key: []string{"p-two", "p-three"}, body: pay().String(), status: 400, code: keyInvalid},
		{name: "Pay/KeyUnterminatedSFString", method: post, path: payments, key: []string{`"abc`}, body: pay().String(), status: 400, code: keyInvalid},
		{name: "Pay/NoAuthorization", method: post, path: payments, auth: noHeader, body: pay().String(), status: 401, code: unauth},
		{name: "Pay/TwoAuthorizationLinesBothValid", method: post, path: payments, auth: []string{valid, valid}, body: pay().String(), status: 401, code: unauth},
		{name: "Pay/ContentTypeTextPlain", method: post, path: payments, opts: []reqOption{ct("text/plain")}, body: pay().String(), status: 415, code: media},
		{name: "Pay/CharsetLatin1", method: post, path: payments, opts: []reqOption{ct("application/json; charset=LATIN1")}, body: pay().String(), status: 415, code: media},
		{name: "Pay/ContentEncodingGzip", method: post, path: payments, opts: []reqOption{hdr("Content-Encoding", "gzip")}, body: pay().String(), status: 415, code: media},
		{name: "Pay/BodyEmpty", method: post, path: payments, body: "", status: 400, code: badJSON},
		{name: "Pay/BodyTrailingData", method: post, path: payments, body: pay().String() + "{}", status: 400, code: badJSON},
		{name: "Pay/UnknownMember", method: post, path: payments, body: pay().add("tip", "1").String(), status: 400, code: badJSON},
		{name: "Pay/OrderIDNotAUUID", method: post, path: payments, body: pay().set("order_id", `"abcd"`).String(), status: 400, code: badJSON, detail: "order_id"},
		{name: "Pay/OrderIDAsNumber", method: post, path: payments, body: pay().set("order_id", "1").String(), status: 400, code: badJSON, detail: "order_id"},
		{name: "Pay/AmountOnePointZero", method: post, path: payments, body: pay().set("amount", "2500.0").String(), status: 400, code: badJSON},
		{name: "Pay/BodyOverLimit", method: post, path: payments, body: padTo(pay().String(), httpapi.MaxBodyBytes+1), status: 413, code: tooBig},
		{name: "Pay/NULInPaymentMethod", method: post, path: payments, body: pay().set("payment_method", `"pm_card_visa\u0000"`).String(), status: 400, code: badJSON, detail: "payment_method"},
		{name: "Pay/InvalidUTF8InPaymentMethod", method: post, path: payments, body: pay().set("payment_method", "\"pm_\xff\"").String(), status: 400, code: badJSON},
		{name: "Pay/LoneSurrogateInCurrency", method: post, path: payments, body: pay().set("currency", `"EU\ud800"`).String(), status: 400, code: badJSON},
		{name: "Pay/PaymentMethodWithoutPrefix", method: post, path: payments, body: pay().set("payment_method", `"card_visa"`).String(), status: 400, code: invalid, writes: writesKey},
		{name: "Pay/AmountZero", method: post, path: payments, body: pay().set("amount", "0").String(), status: 400, code: invalid, writes: writesKey},
		{name: "Pay/AmountInt64Max", method: post, path: payments, body: pay().set("amount", "9223372036854775807").String(), status: 400, code: invalid, writes: writesKey},
		{name: "Pay/CurrencyLowercase", method: post, path: payments, body: pay().set("currency", `"eur"`).String(), status: 400, code: invalid, writes: writesKey},
		{name: "Pay/CharsetUTF8Accepted", method: post, path: payments, opts: []reqOption{ct("application/json; charset=utf-8")}, body: paymentOf(toPay.Id.String()).String(), status: 201, writes: writesPayment},

		// --- POST /v1/payments/{id}/refunds ---
		{name: "Refund/KeyMissing", method: post, path: refunds, key: noHeader, body: refundOf100, status: 400, code: keyMissing},
		{name: "Refund/Key256Chars", method: post, path: refunds, key: []string{strings.Repeat("r", 256)}, body: refundOf100, status: 400, code: keyInvalid},
		{name: "Refund/KeyNonASCII", method: post, path: refunds, key: []string{"ключ"}, body: refundOf100, status: 400, code: keyInvalid},
		{name: "Refund/NoAuthorization", method: post, path: refunds, auth: noHeader, body: refundOf100, status: 401, code: unauth},
		{name: "Refund/BasicScheme", method: post, path: refunds, auth: []string{"Basic " + e.a.Key}, body: refundOf100, status: 401, code: unauth},
		{name: "Refund/ContentTypeForm", method: post, path: refunds, opts: []reqOption{ct("application/x-www-form-urlencoded")}, body: "amount=100", status: 415, code: media},
		{name: "Refund/ContentEncodingBr", method: post, path: refunds, opts: []reqOption{hdr("Content-Encoding", "br")}, body: refundOf100, status: 415, code: media},
		{name: "Refund/BodyNull", method: post, path: refunds, body: "null", status: 400, code: badJSON},
		{name: "Refund/AmountAsString", method: post, path: refunds, body: `{"amount":"100"}`, status: 400, code: badJSON},
		{name: "Refund/AmountExponent", method: post, path: refunds, body: `{"amount":1e2}`, status: 400, code: badJSON},
		{name: "Refund/UnknownMember", method: post, path: refunds, body: `{"amount":100,"reason":"x"}`, status: 400, code: badJSON},
		{name: "Refund/DuplicateMember", method: post, path: refunds, body: `{"amount":100,"amount":2500}`, status: 400, code: badJSON},
		{name: "Refund/BodyOverLimit", method: post, path: refunds, body: padTo(refundOf100, httpapi.MaxBodyBytes+1), status: 413, code: tooBig},
		{name: "Refund/MalformedPaymentID", method: post, path: "/v1/payments/not-a-uuid/refunds", body: refundOf100, status: 404, code: notFound},
		{name: "Refund/AmountZero", method: post, path: refunds, body: `{"amount":0}`, status: 400, code: invalid, writes: writesKey},
		{name: "Refund/AmountNegative", method: post, path: refunds, body: `{"amount":-100}`, status: 400, code: invalid, writes: writesKey},
		{name: "Refund/AmountInt64Max", method: post, path: refunds, body: `{"amount":9223372036854775807}`, status: 400, code: invalid, writes: writesKey},
		{name: "Refund/OtherTenantsPayment", method: post, path: "/v1/payments/" + otherPaid.Id.String() + "/refunds", body: refundOf100, status: 404, code: notFound, writes: writesKey},
		{name: "Refund/SFStringKeyAccepted", method: post, path: refunds, key: []string{`"hostile-refund-1"`}, body: refundOf100, status: 201, writes: writesRefund},

		// --- GET /v1/orders: queries ---
		{name: "ListOrders/Plain", method: get, path: orders, status: 200},
		{name: "ListOrders/LimitZero", method: get, path: orders + "?limit=0", status: 400, code: badQuery},
		{name: "ListOrders/Limit101", method: get, path: orders + "?limit=101", status: 400, code: badQuery},
		{name: "ListOrders/LimitNotANumber", method: get, path: orders + "?limit=abc", status: 400, code: badQuery},
		{name: "ListOrders/LimitNegative", method: get, path: orders + "?limit=-1", status: 400, code: badQuery},
		{name: "ListOrders/LimitHuge", method: get, path: orders + "?limit=99999999999999999999", status: 400, code: badQuery},
		{name: "ListOrders/CursorGarbage", method: get, path: orders + "?cursor=garbage", status: 400, code: badQuery},
		{name: "ListOrders/LimitBrokenEscape", method: get, path: orders + "?limit=%zz", status: 400, code: badQuery},
		{name: "ListOrders/BrokenEscapeElsewhere", method: get, path: orders + "?limit=5&x=%2", status: 400, code: badQuery},
		{name: "ListPayments/LimitBrokenEscape", method: get, path: payments + "?limit=%zz", status: 400, code: badQuery},
		{name: "ListOrders/CursorNotBase64", method: get, path: orders + "?cursor=%25%25%25", status: 400, code: badQuery},
		{name: "ListOrders/NoAuthorization", method: get, path: orders, auth: noHeader, status: 401, code: unauth},
		{name: "ListOrders/BearerWithNothingAfter", method: get, path: orders, auth: []string{"Bearer "}, status: 401, code: unauth},
		{name: "ListOrders/TwoAuthorizationLinesFirstValid", method: get, path: orders, auth: []string{valid, "Basic x"}, status: 401, code: unauth},
		{name: "ListOrders/LowercaseSchemeAccepted", method: get, path: orders, auth: []string{"bearer " + e.b.Key}, status: 200},

		// --- GET /v1/orders/{id} and /v1/payments/{id} ---
		{name: "GetOrder/Own", method: get, path: orders + "/" + paidOrder.Id.String(), status: 200},
		{name: "GetOrder/MalformedUUID", method: get, path: orders + "/not-a-uuid", status: 404, code: notFound},
		{name: "GetOrder/UUIDWithTrailingJunk", method: get, path: orders + "/" + paidOrder.Id.String() + "x", status: 404, code: notFound},
		{name: "GetOrder/EncodedSlashInID", method: get, path: orders + "/a%2Fb", status: 404, code: notFound},
		{name: "GetOrder/DotDotAsID", method: get, path: orders + "/..", status: 404, code: notFound},
		{name: "GetOrder/UnknownUUID", method: get, path: orders + "/" + uuid.NewString(), status: 404, code: notFound},
		{name: "GetOrder/OtherTenantsOrder", method: get, path: orders + "/" + otherOrder.Id.String(), status: 404, code: notFound},
		{name: "GetOrder/NoAuthorization", method: get, path: orders + "/" + paidOrder.Id.String(), auth: noHeader, status: 401, code: unauth},
		{name: "GetPayment/Own", method: get, path: payments + "/" + paid.Id.String(), status: 200},
		{name: "GetPayment/MalformedUUID", method: get, path: payments + "/not-a-uuid", status: 404, code: notFound},
		{name: "GetPayment/OtherTenantsPayment", method: get, path: payments + "/" + otherPaid.Id.String(), status: 404, code: notFound},
		{name: "GetPayment/WrongAPIKey", method: get, path: payments + "/" + paid.Id.String(), auth: []string{bearer(wrongKey)}, status: 401, code: unauth, wrongToken: true},

		// --- PUT /v1/customers/{id}: the id in its canonical form only (lower case) ---
		{name: "PutCustomer/BracedUUID", method: http.MethodPut, path: "/v1/customers/{" + uuid.NewString() + "}", body: `{"name":"Ada","email":"ada@example.com"}`, status: 400, code: invalid},
		{name: "PutCustomer/URNUUID", method: http.MethodPut, path: "/v1/customers/urn:uuid:" + uuid.NewString(), body: `{"name":"Ada","email":"ada@example.com"}`, status: 400, code: invalid},
		{name: "PutCustomer/UUIDWithoutDashes", method: http.MethodPut, path: "/v1/customers/" + strings.ReplaceAll(uuid.NewString(), "-", ""), body: `{"name":"Ada","email":"ada@example.com"}`, status: 400, code: invalid},
		{name: "PutCustomer/NameWithEscape", method: http.MethodPut, path: "/v1/customers/" + uuid.NewString(), body: `{"name":"Ada\u001b[31m","email":"ada@example.com"}`, status: 400, code: invalid},
		{name: "PutCustomer/UpperCaseUUID", method: http.MethodPut, path: "/v1/customers/" + strings.ToUpper(uuid.NewString()), body: `{"name":"Ada","email":"ada@example.com"}`, status: 400, code: invalid},
		{name: "PutCustomer/CanonicalAccepted", method: http.MethodPut, path: "/v1/customers/" + uuid.NewString(), body: `{"name":"Ada","email":"ada@example.com"}`, status: 201, writes: map[string]int{"customers": 1}},

		// --- Routes and methods ---
		{name: "Route/Unknown", method: get, path: "/nope", status: 404, code: notFound},
		{name: "Route/UnknownUnderV1", method: get, path: "/v1/nope", status: 404, code: notFound},
		{name: "Route/UnknownVersion", method: get, path: "/v2/orders", status: 404, code: notFound},
		{name: "Route/PostToUnknownUnderV1", method: post, path: "/v1/charges", body: newOrder().String(), status: 404, code: notFound},
		{name: "Method/DeleteOrders", method: del, path: orders, status: 405, code: badMethod},
		{name: "Method/DeleteOrder", method: del, path: orders + "/" + paidOrder.Id.String(), status: 405, code: badMethod},
		{name: "Method/PatchOrderWithoutIfMatch", method: http.MethodPatch, path: orders + "/" + paidOrder.Id.String(), body: "{}", status: 428, code: httpapi.CodePreconditionRequired},
		{name: "Method/PutPayment", method: http.MethodPut, path: payments + "/" + paid.Id.String(), body: "{}", status: 405, code: badMethod},
		{name: "Method/GetRefunds", method: get, path: refunds, status: 405, code: badMethod},
		{name: "Method/PostHealthz", method: post, path: "/healthz", body: "{}", status: 405, code: badMethod},

		// --- System endpoints ---
		{name: "System/Healthz", method: get, path: "/healthz", status: 200},
		{name: "System/ReadyzWhenHealthy", method: get, path: "/readyz", status: 200},
		{name: "System/OpenAPI", method: get, path: "/openapi.yaml", status: 200},
		{name: "System/MetricsOnlyOnTheAdminListener", method: get, path: "/metrics", status: 404, code: notFound},
		{name: "System/ProfilerOnlyOnTheAdminListener", method: get, path: "/debug/pprof/", status: 404, code: notFound},
		{name: "System/HealthzIgnoresBadAuthorization", method: get, path: "/healthz", auth: []string{"Basic garbage"}, status: 200},
	}

	tables := e.publicTables(t)
	byStatus := map[int]int{}
	seen := map[string]bool{}
	for i, tt := range cases {
		if seen[tt.name] {
			t.Fatalf("two rows are named %s", tt.name)
		}
		seen[tt.name] = true
		byStatus[tt.status]++
		t.Run(tt.name, func(t *testing.T) {
			before := e.rowCounts(t, tables)
			res := e.do(t, tt.method, tt.path, "", tt.requestBody(), tt.requestOptions(valid, fmt.Sprintf("hostile-key-%d", i))...)
			tt.check(t, res)

			after := e.rowCounts(t, tables)
			got := map[string]int{}
			for name, n := range after {
				if d := n - before[name]; d != 0 {
					got[name] = d
				}
			}
			want := maps.Clone(tt.writes)
			if want == nil {
				want = map[string]int{}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rows written per table (-want +got):\n%s", diff)
			}

			if h := e.get(t, "", "/healthz"); h.status != http.StatusOK {
				t.Errorf("GET /healthz afterwards = %d, want 200; body: %s", h.status, h.body)
			}
		})
	}

	statuses := slices.Sorted(maps.Keys(byStatus))
	parts := make([]string, len(statuses))
	for i, s := range statuses {
		parts[i] = fmt.Sprintf("%d=%d", s, byStatus[s])
	}
	t.Logf("catalogue: %d cases; by status: %s", len(cases), strings.Join(parts, " "))
}

// requestBody is the body to send: POSTs, PUTs and PATCHes send theirs
// (even when empty); GETs and DELETEs noHeader.
func (tt hostileCase) requestBody() []byte {
	switch tt.method {
	case http.MethodGet, http.MethodDelete:
		return nil
	}
	return []byte(tt.body)
}

// requestOptions sets the Authorization and Idempotency-Key lines, then the
// row's own tweaks.
func (tt hostileCase) requestOptions(validAuth, freshKey string) []reqOption {
	auth := tt.auth
	if auth == nil {
		auth = []string{validAuth}
	}
	keys := tt.key
	if keys == nil && tt.method == http.MethodPost {
		keys = []string{freshKey}
	}
	var opts []reqOption
	for _, v := range auth {
		opts = append(opts, withHeader("Authorization", v))
	}
	for _, v := range keys {
		opts = append(opts, withHeader(idem.HeaderName, v))
	}
	return append(opts, tt.opts...)
}

// check compares the answer with the row. Every mismatch is reported, noHeader
// ends the row, so the row counts are always checked too.
func (tt hostileCase) check(t *testing.T, res response) {
	t.Helper()
	if res.status != tt.status {
		t.Errorf("status = %d, want %d; body: %.500s", res.status, tt.status, res.body)
	}
	if tt.status >= 400 {
		var p api.Problem
		switch ct := res.header.Get("Content-Type"); {
		case ct != "application/problem+json":
			t.Errorf("Content-Type = %q, want application/problem+json", ct)
		case json.Unmarshal(res.body, &p) != nil:
			t.Errorf("the problem does not decode; body: %.500s", res.body)
		case p.Code != tt.code:
			t.Errorf("problem code = %q, want %q; detail: %s", p.Code, tt.code, deref(p.Detail))
		case !strings.Contains(deref(p.Detail), tt.detail):
			t.Errorf("problem detail = %q, want it to name %q", deref(p.Detail), tt.detail)
		}
	}
	// R2: on every response; no-store on every /v1 response, whatever it is.
	if got := res.header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q, want nosniff", got)
	}
	if strings.HasPrefix(tt.path, "/v1/") || tt.path == "/v1" {
		if got := res.header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("Cache-Control = %q, want no-store", got)
		}
	}
	if tt.status == http.StatusUnauthorized {
		// RFC 9110 section 11.6.1: a 401 names the scheme to use; RFC 6750
		// section 3.1 says what was wrong: nothing when no credentials
		// came, invalid_request for a malformed header, invalid_token for
		// a key that is not one.
		want := `Bearer error="invalid_request"`
		switch {
		case tt.auth != nil && len(tt.auth) == 0:
			want = "Bearer"
		case tt.wrongToken:
			want = `Bearer error="invalid_token"`
		}
		if got := res.header.Get("WWW-Authenticate"); got != want {
			t.Errorf("WWW-Authenticate = %q, want %q", got, want)
		}
	}
	if tt.status == http.StatusMethodNotAllowed && res.header.Get("Allow") == "" {
		t.Error("a 405 without an Allow header")
	}
	wantReplayed := ""
	if tt.replay {
		wantReplayed = "true"
	}
	if got := res.header.Get(httpapi.ReplayedHeader); got != wantReplayed {
		t.Errorf("%s = %q, want %q", httpapi.ReplayedHeader, got, wantReplayed)
	}
}

// publicTables lists the tables of the public schema, so a new table is
// counted without anyone remembering to add it here.
func (e *bundle) publicTables(t *testing.T) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY c.relname`)
	if err != nil {
		t.Fatalf("list tables: %v", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("list tables: %v", err)
	}
	if !slices.Contains(names, "idempotency_keys") || !slices.Contains(names, "orders") {
		t.Fatalf("public tables = %v; want idempotency_keys and orders among them", names)
	}
	return names
}

// rowCounts counts the rows of every table named.
func (e *bundle) rowCounts(t *testing.T, tables []string) map[string]int {
	t.Helper()
	counts := make(map[string]int, len(tables))
	for _, name := range tables {
		counts[name] = e.count(t, "SELECT count(*) FROM "+pgx.Identifier{"public", name}.Sanitize())
	}
	return counts
}
