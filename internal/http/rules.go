package httpapi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/idemref/payments/internal/idem"
)

// The rules of keys, per keyed endpoint (L8, F5): one table, rulesTable,
// which the handlers enforce and GET /v1/idempotency states, so the
// document cannot say one thing while the server does another.
//
// Part of it comes from the contract itself: what a fingerprint ignores
// is declared per operation in openapi.yaml (x-idempotency's
// fingerprint-exclude, JSON Pointers into the request body), and read
// from the embedded document when the server starts (readContract), as
// are the outcomes each operation records. A retry may change an
// excluded member and still be replayed; a change of anything else is 422
// idempotency_key_reused.

// neverExcluded are the members a fingerprint may never ignore: what a
// request moves (amounts, currencies) and what it acts on (its order, its
// card, its natural key). A retry that changed one of them is another
// request, and replaying the first one's answer to it would tell the
// client that something happened which did not. readContract refuses a
// contract that excludes one of them, a part of one, or the whole body.
var neverExcluded = []string{"/amount", "/currency", "/order_id", "/payment_method", "/reference", "/customer_id"}

// contractRules is what x-idempotency declares of one operation.
type contractRules struct {
	Recorded           []string `json:"recorded"`
	FingerprintExclude []string `json:"fingerprint-exclude"`
}

// readContract reads x-idempotency of every keyed endpoint from the
// OpenAPI document spec. It fails for an endpoint the document does not
// describe as keyed, a pointer that is not one, and a pointer to a member
// that must never be excluded.
func readContract(spec []byte) (map[string]contractRules, error) {
	raw, err := yaml.YAMLToJSON(spec)
	if err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	// A path item holds operations by method, and parameters beside them.
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	out := map[string]contractRules{}
	for _, e := range Endpoints {
		var op struct {
			Idempotency *contractRules `json:"x-idempotency"`
		}
		if err := json.Unmarshal(doc.Paths[e.Route][strings.ToLower(e.Method)], &op); err != nil || op.Idempotency == nil {
			return nil, fmt.Errorf("openapi: %s has no x-idempotency", e)
		}
		for _, p := range op.Idempotency.FingerprintExclude {
			if err := excludable(p); err != nil {
				return nil, fmt.Errorf("openapi: %s: fingerprint-exclude %q: %w", e, p, err)
			}
		}
		out[e.String()] = *op.Idempotency
	}
	return out, nil
}

// excludable says why pointer p may not be a fingerprint's exclusion.
func excludable(p string) error {
	if !strings.HasPrefix(p, "/") || p == "/" {
		return fmt.Errorf("want a JSON Pointer to a member of the body, such as /metadata/request_id")
	}
	// Every member in neverExcluded is one of the body's own, so the one
	// pointer that holds them, the whole body, is refused above.
	for _, never := range neverExcluded {
		if p == never || strings.HasPrefix(p, never+"/") {
			return fmt.Errorf("%s is never excluded: a retry that changes it is another request", never)
		}
	}
	return nil
}

// endpointRules is one row of the rules document: what the server
// enforces for keys of one endpoint.
type endpointRules struct {
	Endpoint string   `json:"endpoint"`
	Key      keyRules `json:"key"`
	// ResultRetentionSeconds: how long a completed key's exact response
	// is replayed; TombstoneRetentionSeconds: how long after its creation
	// the key is remembered (409 idempotency_result_expired).
	ResultRetentionSeconds    int64 `json:"result_retention_seconds"`
	TombstoneRetentionSeconds int64 `json:"tombstone_retention_seconds"`
	// LockWaitSeconds: how long a duplicate waits on the first attempt's
	// uncommitted claim before its 409, without a preference.
	LockWaitSeconds float64 `json:"lock_wait_seconds"`
	// PreferWaitMaxSeconds caps Prefer: wait (0: not honoured).
	PreferWaitMaxSeconds int64 `json:"prefer_wait_max_seconds"`
	// LeaseSeconds: a multi-step key's lease (0: one transaction).
	LeaseSeconds       float64  `json:"lease_seconds,omitempty"`
	Recorded           []string `json:"recorded"`
	FingerprintExclude []string `json:"fingerprint_exclude"`
}

type keyRules struct {
	Header    string `json:"header"`
	Format    string `json:"format"`
	MaxLength int    `json:"max_length"`
}

// keyFormat is how ParseKey reads a key (K1).
const keyFormat = "1 to 255 visible ASCII characters (0x21-0x7E), as an RFC 8941 sf-string (\"...\") or bare, on one header line"

// rulesTable builds the table from the contract and the settings the
// store and the waiters enforce.
func rulesTable(contract map[string]contractRules, cfg idem.Config, limits idem.WaitLimits) []endpointRules {
	out := make([]endpointRules, 0, len(Endpoints))
	for _, e := range Endpoints {
		c := contract[e.String()]
		r := endpointRules{
			Endpoint:                  e.String(),
			Key:                       keyRules{Header: idem.HeaderName, Format: keyFormat, MaxLength: idem.MaxKeyLength},
			ResultRetentionSeconds:    int64(cfg.TTL / time.Second),
			TombstoneRetentionSeconds: int64(cfg.KeyRetention / time.Second),
			LockWaitSeconds:           cfg.LockTimeout.Seconds(),
			PreferWaitMaxSeconds:      int64(limits.Max / time.Second),
			Recorded:                  slices.Clone(c.Recorded),
			FingerprintExclude:        append([]string{}, c.FingerprintExclude...),
		}
		if e.MultiStep {
			r.LeaseSeconds = cfg.Lease.Seconds()
		}
		out = append(out, r)
	}
	return out
}

// rulesDocument is GET /v1/idempotency's body, rendered once.
type rulesDocument struct {
	body []byte
	etag string
}

func newRulesDocument(rows []endpointRules) rulesDocument {
	body, err := json.Marshal(struct {
		Endpoints []endpointRules `json:"endpoints"`
	}{rows})
	if err != nil {
		panic(err) // our own types always encode
	}
	body = append(body, '\n')
	sum := sha256.Sum256(body)
	return rulesDocument{body: body, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
}

// rulesMaxAge is how long a client may keep the rules document: they
// change only with a deployment.
const rulesMaxAge = "private, max-age=300"

// serveRules is GET /v1/idempotency: the rules, cacheable by the client
// that asked (private: it is behind authentication), with an ETag for a
// revalidation that costs no body. It is the one /v1 answer that is not
// no-store: it holds nothing of the tenant's.
func (d rulesDocument) serveRules(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", rulesMaxAge)
	w.Header().Set("ETag", d.etag)
	if match := r.Header.Get("If-None-Match"); match != "" && strings.Contains(match, d.etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(d.body)
}
