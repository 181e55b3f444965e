package httpapi

import (
	"bytes"
	"html/template"
	"net/http"
	"strings"
)

// The page of problem types: every problem's `type` points at an anchor
// of it (DefaultProblemBaseURL), so a client that follows a problem's link
// reads the rule the request broke. TestProblemTypesResolve follows each
// one.

// problemDoc documents one problem code.
type problemDoc struct {
	Code   string
	Status int
	Rule   string
}

// Anchor is the code with dashes: the part of the type after the base.
func (d problemDoc) Anchor() string { return strings.ReplaceAll(d.Code, "_", "-") }

// problemDocs is the rule of every code the API answers with.
var problemDocs = []problemDoc{
	{CodeUnauthorized, 401, "The request has no valid API key. Send one `Authorization: Bearer <key>` header. Nothing was recorded."},
	{CodeKeyMissing, 400, "A POST under /v1 requires an Idempotency-Key header. Nothing was recorded; send the request with a key generated once for this operation."},
	{CodeKeyInvalid, 400, "The Idempotency-Key must be 1 to 255 visible ASCII characters, bare or as a structured-field string, on one header line. Nothing was recorded. GET /v1/idempotency states the format."},
	{CodeInvalidJSON, 400, "The body must be one JSON document with no duplicate or unknown members, no member-name case variants, the documented types and no trailing data. Nothing was recorded."},
	{CodeBodyTooLarge, 413, "The body is over the size limit (1 MiB). Nothing was recorded."},
	{CodeUnsupportedMediaType, 415, "The body must be sent as application/json. Nothing was recorded."},
	{CodeValidationFailed, 400, "Well-formed values broke a field's rule; see errors. Under an Idempotency-Key this outcome is recorded and replayed: send the corrected request under a new key."},
	{CodeKeyInUse, 409, "The key's first request is still in flight. Retry with the same key after Retry-After, or send Prefer: wait=N to wait for its answer (GET /v1/idempotency states the maximum wait)."},
	{CodeConflictingWrite, 409, "Another request, under another key, is writing what this request must write and has not finished. Nothing was recorded: retry with the same key after Retry-After."},
	{CodeKeyReused, 422, "The key was used before for a different request: its fingerprint differs (only the members GET /v1/idempotency lists as excluded may change). Use a new key for a new request."},
	{CodeReferenceExists, 409, "An order with this reference exists already, made under another key; order_id names it. Recorded under the key."},
	{CodeNotFound, 404, "No such route or resource for this tenant."},
	{CodeMethodNotAllowed, 405, "The path does not take this method; Allow lists those it takes."},
	{CodeInvalidQuery, 400, "A query parameter or cursor is not valid."},
	{CodeAmbiguousFraming, 400, "The request's framing could be read more than one way (several Content-Type lines). The connection is closed."},
	{CodeHeadersTooLarge, 431, "The header block is over 16 KiB or 500 lines. The connection is closed."},
	{CodeKeyBudgetExceeded, 429, "The tenant holds as many live idempotency keys as its budget allows: a request with a new key is refused and nothing recorded; keys it holds still replay."},
	{CodeRefundExists, 409, "This request made its refund already, under a key past its retention; the detail names the refund."},
	{CodeUnavailable, 503, "A temporary failure; nothing was recorded. Retry after Retry-After, with the same Idempotency-Key."},
	{CodeInternal, 500, "An unexpected failure; the request was rolled back and nothing was recorded. Retrying with the same key is safe."},
	{CodeOrderNotFound, 422, "order_id names no order of this tenant. Recorded under the key."},
	{CodeAmountMismatch, 422, "A payment's amount and currency must match what the order still owes. Recorded under the key."},
	{CodePaymentExists, 409, "The order has a payment that has not failed already; payment_id names it. Recorded under the key."},
	{CodeCardDeclined, 402, "The processor declined the card. Recorded: a retry replays the decline; pay under a new key to try again."},
	{CodeProcessorRejected, 422, "The processor refused the request as invalid. Recorded under the key."},
	{CodeNotRefundable, 409, "The payment cannot be refunded in its state. Recorded under the key."},
	{CodeRefundExceeds, 422, "A refund may not exceed what is left of the payment. Recorded under the key."},
	{CodeProcessorUnavailable, 503, "The processor did not execute the request. Nothing final was recorded: retry with the same key after Retry-After, and it resumes where it stopped."},
	{CodeOutcomeUnknown, 503, "The processor has not confirmed whether the request took effect. Retry with the same key after Retry-After: it resumes, never charging or refunding twice."},
	{CodeRateLimited, 429, "Too many requests from this tenant or client. Nothing was recorded: retry after Retry-After, with the same key."},
	{CodeResultExpired, 409, "The request was made under this key already, and its result is past its retention: it is neither replayed nor run again. resource and original_status say what it did."},
	{CodeWebhookSignatureInvalid, 400, "A webhook's signature headers are missing or malformed, or no signature matches the body. Nothing was recorded."},
	{CodeWebhookTimestampInvalid, 400, "A webhook's signature timestamp is further from now than the tolerance. Nothing was recorded."},
	{CodePreconditionFailed, 412, "The resource changed since the ETag in If-Match was read: read it again."},
	{CodePreconditionRequired, 428, "A conditional update needs If-Match with the resource's ETag."},
}

var problemPage = template.Must(template.New("problems").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Problem types</title></head>
<body>
<h1>Problem types</h1>
<p>Every error of this API is an RFC 9457 problem document. Its <code>type</code> links here; its <code>code</code> is the anchor with <code>_</code> for <code>-</code>. The rules of Idempotency-Key are at <code>GET /v1/idempotency</code>.</p>
<dl>
{{range .}}<dt id="{{.Anchor}}"><code>{{.Code}}</code> ({{.Status}})</dt>
<dd>{{.Rule}}</dd>
{{end}}</dl>
</body></html>
`))

// problemsPage is GET /docs/problems, rendered once.
var problemsPage = func() []byte {
	var b bytes.Buffer
	if err := problemPage.Execute(&b, problemDocs); err != nil {
		panic(err)
	}
	return b.Bytes()
}()

func serveProblems(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(problemsPage)
}
