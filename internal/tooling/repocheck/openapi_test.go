package repocheck

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	apispec "github.com/idemref/payments"
)

const (
	problemSchemaRef  = "#/components/schemas/Problem"
	problemMediaType  = "application/problem+json"
	problemTypePrefix = "/docs/problems#"
)

// problemStatus is the contract between problem codes and HTTP status codes.
var problemStatus = map[string]int{
	"idempotency_key_budget_exceeded": 429,
	"refund_exists":                   409,
	"unauthorized":                    401,
	"idempotency_key_missing":         400,
	"idempotency_key_invalid":         400,
	"invalid_json":                    400,
	"body_too_large":                  413,
	"unsupported_media_type":          415,
	"validation_failed":               400,
	"idempotency_key_in_use":          409,
	"idempotency_key_reused":          422,
	"order_reference_exists":          409,
	"not_found":                       404,
	"method_not_allowed":              405,
	"invalid_query":                   400,
	"ambiguous_framing":               400,
	"headers_too_large":               431,
	"service_unavailable":             503,
	"internal_error":                  500,
	"order_not_found":                 422,
	"payment_amount_mismatch":         422,
	"payment_exists":                  409,
	"card_declined":                   402,
	"processor_rejected":              422,
	"payment_not_refundable":          409,
	"refund_exceeds_payment":          422,
	"processor_unavailable":           503,
	// processor_outcome_unknown: the charge or refund may still land (S6).
	"processor_outcome_unknown":  503,
	"rate_limited":               429,
	"idempotency_result_expired": 409,
	"precondition_failed":        412,
	"precondition_required":      428,
	// Webhook rejections (M4).
	"webhook_signature_invalid":          400,
	"webhook_timestamp_out_of_tolerance": 400,
	// A lock wait on another key's uncommitted write (not recorded).
	"conflicting_write_in_progress": 409,
}

// postV1Responses are the responses every idempotent POST under /v1 must document.
var postV1Responses = []string{"400", "401", "409", "413", "415", "422", "503"}

func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	if len(apispec.OpenAPI) == 0 {
		t.Fatal("embedded openapi.yaml is empty")
	}
	doc, err := openapi3.NewLoader().LoadFromData(apispec.OpenAPI)
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("validate openapi.yaml: %v", err)
	}
	return doc
}

type operation struct {
	method, path string
	op           *openapi3.Operation
}

func (o operation) String() string { return o.method + " " + o.path }

func operations(doc *openapi3.T) []operation {
	var ops []operation
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			ops = append(ops, operation{method: strings.ToUpper(method), path: path, op: op})
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].String() < ops[j].String() })
	return ops
}

// isSuccess: a 2xx, or the 304 of a conditional GET (no body: nothing
// went wrong).
func isSuccess(status string) bool { return strings.HasPrefix(status, "2") || status == "304" }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// problemExamples returns the example problem documents of a media type.
func problemExamples(t *testing.T, mt *openapi3.MediaType) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	add := func(name string, v any) {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("example %s: %v", name, err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("example %s is not an object: %v", name, err)
		}
		out[name] = m
	}
	if mt.Example != nil {
		add("example", mt.Example)
	}
	for name, ex := range mt.Examples {
		if ex == nil || ex.Value == nil {
			t.Fatalf("example %s is unresolved", name)
		}
		add(name, ex.Value.Value)
	}
	return out
}

func TestOpenAPIDocumentIsValid31(t *testing.T) {
	doc := loadOpenAPI(t)
	if !doc.IsOpenAPI31OrLater() || doc.OpenAPIMajorMinor() != "3.1" {
		t.Fatalf("openapi = %q, want 3.1.x", doc.OpenAPI)
	}
}

func TestOperationsHaveUniqueOperationIDs(t *testing.T) {
	doc := loadOpenAPI(t)
	seen := map[string]string{}
	for _, o := range operations(doc) {
		id := o.op.OperationID
		if id == "" {
			t.Errorf("%s: missing operationId", o)
			continue
		}
		if prev, dup := seen[id]; dup {
			t.Errorf("%s: operationId %q already used by %s", o, id, prev)
		}
		seen[id] = o.String()
	}
	for _, want := range []string{"createOrder", "getOrder", "listOrders", "createPayment", "getPayment", "createRefund"} {
		if _, ok := seen[want]; !ok {
			t.Errorf("operationId %q not found", want)
		}
	}
}

func TestEveryResponseCarriesRequestID(t *testing.T) {
	doc := loadOpenAPI(t)
	for _, o := range operations(doc) {
		for status, resp := range o.op.Responses.Map() {
			h := resp.Value.Headers["X-Request-Id"]
			if h == nil || h.Ref != "#/components/headers/XRequestId" {
				t.Errorf("%s %s: missing X-Request-Id header reference", o, status)
			}
		}
	}
}

func TestErrorResponsesAreProblems(t *testing.T) {
	doc := loadOpenAPI(t)

	// Problem.code is an open string: a closed enum makes a generated
	// client reject (or fail to compile against) a code added later. The
	// codes of today are listed in x-extensible-enum.
	codeSchema := doc.Components.Schemas["Problem"].Value.Properties["code"].Value
	if len(codeSchema.Enum) != 0 || !codeSchema.Type.Is(openapi3.TypeString) {
		t.Errorf("Problem.code must be a string without enum, got type %v enum %v", codeSchema.Type, codeSchema.Enum)
	}
	listed, _ := codeSchema.Extensions["x-extensible-enum"].([]any)
	var enum []string
	for _, v := range listed {
		enum = append(enum, fmt.Sprint(v))
	}
	sort.Strings(enum)
	if want := sortedKeys(problemStatus); !slices.Equal(enum, want) {
		t.Errorf("Problem.code x-extensible-enum = %v, want %v", enum, want)
	}

	for _, o := range operations(doc) {
		for status, resp := range o.op.Responses.Map() {
			if isSuccess(status) {
				continue
			}
			where := fmt.Sprintf("%s %s", o, status)
			content := resp.Value.Content
			mt := content.Get(problemMediaType)
			if mt == nil || len(content) != 1 {
				t.Errorf("%s: content must be exactly %s, got %v", where, problemMediaType, sortedKeys(content))
				continue
			}
			if mt.Schema == nil || mt.Schema.Ref != problemSchemaRef {
				t.Errorf("%s: schema must reference %s", where, problemSchemaRef)
			}
			if h := resp.Value.Headers["Cache-Control"]; h == nil || h.Ref != "#/components/headers/CacheControlNoStore" {
				t.Errorf("%s: missing Cache-Control: no-store header", where)
			}

			examples := problemExamples(t, mt)
			if len(examples) == 0 {
				t.Errorf("%s: no problem example", where)
			}
			for name, ex := range examples {
				code, _ := ex["code"].(string)
				wantStatus, known := problemStatus[code]
				if !known {
					t.Errorf("%s example %s: unknown code %q", where, name, code)
					continue
				}
				if strconv.Itoa(wantStatus) != status {
					t.Errorf("%s example %s: code %s belongs to status %d", where, name, code, wantStatus)
				}
				if got, _ := ex["status"].(float64); int(got) != wantStatus {
					t.Errorf("%s example %s: status member = %v, want %d", where, name, ex["status"], wantStatus)
				}
				wantType := problemTypePrefix + strings.ReplaceAll(code, "_", "-")
				if ex["type"] != wantType {
					t.Errorf("%s example %s: type = %v, want %s", where, name, ex["type"], wantType)
				}
			}
		}
	}
}

func TestSecurity(t *testing.T) {
	doc := loadOpenAPI(t)
	for _, o := range operations(doc) {
		reqs := doc.Security
		if o.op.Security != nil {
			reqs = *o.op.Security
		}
		bearer := slices.ContainsFunc(reqs, func(r openapi3.SecurityRequirement) bool {
			_, ok := r["bearerAuth"]
			return ok
		})
		if isWebhook(o) {
			// The processor authenticates with its signature header, and
			// takes no API key.
			signed := slices.ContainsFunc(reqs, func(r openapi3.SecurityRequirement) bool {
				_, ok := r["processorSignature"]
				return ok && len(r) == 1
			})
			if !signed || len(reqs) != 1 {
				t.Errorf("%s: a webhook must require processorSignature only", o)
			}
			continue
		}
		if strings.HasPrefix(o.path, "/v1/") || o.path == "/v1" {
			if !bearer || len(reqs) != 1 {
				t.Errorf("%s: must require bearerAuth only", o)
			}
			if o.op.Responses.Value("401") == nil {
				t.Errorf("%s: must document 401", o)
			}
		} else if len(reqs) != 0 {
			t.Errorf("%s: must be unauthenticated", o)
		}
	}
}

// isWebhook reports whether o receives webhooks: deduplicated by the
// producer's event id (x-deduplication), not by an Idempotency-Key, and
// authenticated by a signature, not an API key.
func isWebhook(o operation) bool {
	_, ok := o.op.Extensions["x-deduplication"]
	return ok && strings.HasPrefix(o.path, "/v1/webhooks/")
}

// xIdempotency mirrors the x-idempotency vendor extension.
type xIdempotency struct {
	Key         string   `json:"key"`
	Recorded    []string `json:"recorded"`
	NotRecorded []string `json:"not_recorded"`
	Retention   string   `json:"retention"`
}

func TestV1PostsAreIdempotent(t *testing.T) {
	doc := loadOpenAPI(t)
	found := 0
	for _, o := range operations(doc) {
		if o.method != "POST" || !strings.HasPrefix(o.path, "/v1/") || isWebhook(o) {
			continue
		}
		found++

		var key *openapi3.Parameter
		for _, p := range o.op.Parameters {
			if p.Value.In == openapi3.ParameterInHeader && strings.EqualFold(p.Value.Name, "Idempotency-Key") {
				key = p.Value
				if p.Ref != "#/components/parameters/IdempotencyKey" {
					t.Errorf("%s: Idempotency-Key should reference #/components/parameters/IdempotencyKey", o)
				}
			}
		}
		if key == nil {
			t.Errorf("%s: no Idempotency-Key header parameter", o)
		} else if !key.Required {
			t.Errorf("%s: Idempotency-Key must be required", o)
		}

		for _, status := range postV1Responses {
			if o.op.Responses.Value(status) == nil {
				t.Errorf("%s: response %s not documented", o, status)
			}
		}

		checkOutcomePolicy(t, o)
	}
	if found == 0 {
		t.Fatal("no POST operation under /v1")
	}
}

// checkOutcomePolicy asserts that x-idempotency classifies every documented
// outcome (status, or status plus problem code) exactly once, and names no
// outcome that is not documented.
func checkOutcomePolicy(t *testing.T, o operation) {
	t.Helper()
	raw, ok := o.op.Extensions["x-idempotency"]
	if !ok {
		t.Errorf("%s: missing x-idempotency extension", o)
		return
	}
	b, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	var policy xIdempotency
	if err := json.Unmarshal(b, &policy); err != nil {
		t.Fatalf("%s: x-idempotency: %v", o, err)
	}
	if policy.Key != "required" || policy.Retention == "" {
		t.Errorf("%s: x-idempotency must say key: required and give a retention", o)
	}

	class := map[string]string{}
	for _, e := range policy.Recorded {
		class[e] = "recorded"
	}
	for _, e := range policy.NotRecorded {
		if _, dup := class[e]; dup {
			t.Errorf("%s: outcome %q is both recorded and not recorded", o, e)
		}
		class[e] = "not_recorded"
	}

	used := map[string]bool{}
	for status, resp := range o.op.Responses.Map() {
		var outcomes []string
		if isSuccess(status) {
			outcomes = []string{status}
		} else {
			mt := resp.Value.Content.Get(problemMediaType)
			if mt == nil {
				continue // reported by TestErrorResponsesAreProblems
			}
			for _, ex := range problemExamples(t, mt) {
				code, _ := ex["code"].(string)
				outcomes = append(outcomes, status+" "+code)
			}
		}
		for _, outcome := range outcomes {
			switch {
			case class[outcome] != "":
				used[outcome] = true
			case class[status] != "":
				used[status] = true
			default:
				t.Errorf("%s: outcome %q is not classified by x-idempotency", o, outcome)
			}
		}
	}
	for e := range class {
		if !used[e] {
			t.Errorf("%s: x-idempotency names %q, which is not a documented response", o, e)
		}
	}
}

// rateLimited reports whether o runs behind the tenant's rate limit: an
// authenticated /v1 operation.
func rateLimited(doc *openapi3.T, o operation) bool {
	reqs := doc.Security
	if o.op.Security != nil {
		reqs = *o.op.Security
	}
	return strings.HasPrefix(o.path, "/v1/") && slices.ContainsFunc(reqs, func(r openapi3.SecurityRequirement) bool {
		_, ok := r["bearerAuth"]
		return ok
	})
}

// Every answer to an authenticated /v1 request carries RateLimit and
// RateLimit-Policy while the limit is on, so every 2xx and 4xx of those
// operations declares them (optional: the operator may turn the limit
// off), except 401, which is answered before any tenant is known. The
// operations without a tenant (system endpoints, webhooks) declare
// neither.
func TestRateLimitHeadersDeclared(t *testing.T) {
	doc := loadOpenAPI(t)
	refs := map[string]string{
		"RateLimit":        "#/components/headers/RateLimit",
		"RateLimit-Policy": "#/components/headers/RateLimitPolicy",
	}
	for _, name := range []string{"RateLimit", "RateLimitPolicy"} {
		if h := doc.Components.Headers[name]; h == nil || h.Value.Required {
			t.Errorf("components.headers.%s must exist and be optional", name)
		}
	}
	for _, o := range operations(doc) {
		limited := rateLimited(doc, o)
		for status, resp := range o.op.Responses.Map() {
			for name, ref := range refs {
				h := resp.Value.Headers[name]
				want := limited && (status[0] == '2' || status[0] == '4') && status != "401"
				switch {
				case want && (h == nil || h.Ref != ref):
					t.Errorf("%s %s: header %s must reference %s", o, status, name, ref)
				case !limited && h != nil:
					t.Errorf("%s %s: declares %s, but no tenant's limit applies to it", o, status, name)
				case status == "401" && h != nil:
					t.Errorf("%s %s: a 401 is answered before the rate limit and carries no %s", o, status, name)
				}
			}
		}
	}
}

// Every integer says how wide it is (OWASP API4:2023: integer-format), the
// limit and Retry-After among them.
func TestIntegersHaveFormats(t *testing.T) {
	doc := loadOpenAPI(t)
	var check func(where string, s *openapi3.SchemaRef)
	seen := map[*openapi3.Schema]bool{}
	check = func(where string, s *openapi3.SchemaRef) {
		if s == nil || s.Value == nil || seen[s.Value] {
			return
		}
		seen[s.Value] = true
		v := s.Value
		if v.Type.Is(openapi3.TypeInteger) || v.Type.Includes(openapi3.TypeInteger) {
			if v.Format != "int32" && v.Format != "int64" {
				t.Errorf("%s: integer without format int32 or int64", where)
			}
		}
		for name, p := range v.Properties {
			check(where+"."+name, p)
		}
		check(where+"[]", v.Items)
		for i, sub := range append(append(append(openapi3.SchemaRefs{}, v.OneOf...), v.AnyOf...), v.AllOf...) {
			check(fmt.Sprintf("%s/%d", where, i), sub)
		}
	}
	for name, s := range doc.Components.Schemas {
		check("schemas."+name, s)
	}
	for name, h := range doc.Components.Headers {
		check("headers."+name, h.Value.Schema)
	}
	for _, o := range operations(doc) {
		for _, p := range o.op.Parameters {
			check(fmt.Sprintf("%s parameter %s", o, p.Value.Name), p.Value.Schema)
		}
		for status, resp := range o.op.Responses.Map() {
			for name, h := range resp.Value.Headers {
				check(fmt.Sprintf("%s %s header %s", o, status, name), h.Value.Schema)
			}
		}
	}
}

// GET /openapi.yaml answers YAML text; declared as an object, a validator
// that does not parse YAML (Prism) rejects every fetch.
func TestOpenAPIDocumentIsServedAsText(t *testing.T) {
	doc := loadOpenAPI(t)
	mt := doc.Paths.Value("/openapi.yaml").Get.Responses.Value("200").Value.Content.Get("application/yaml")
	if mt == nil || mt.Schema == nil || !mt.Schema.Value.Type.Is(openapi3.TypeString) {
		t.Fatal("GET /openapi.yaml: application/yaml must be declared type: string")
	}
}
