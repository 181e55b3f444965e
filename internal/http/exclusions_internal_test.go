package httpapi

import (
	"slices"
	"testing"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/internal/idem"
)

// exclusionsOfVersion pins, for the fingerprint version that hashes
// them, the members each operation's fingerprint ignores. What a
// fingerprint ignores is part of what it hashes: a record stored before an
// exclusion was added holds the hash of the whole body, which the same
// body's retry no longer produces, so that honest retry would get 422. A
// new FingerprintVersion avoids it (a record of another version is
// trusted, F3); this table makes the two change together.
var exclusionsOfVersion = map[int]map[string][]string{
	2: {"POST /v1/orders": {"/metadata/request_id"}},
}

func TestExclusionsBelongToTheFingerprintVersion(t *testing.T) {
	t.Parallel()
	contract, err := readContract(apispec.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	want, ok := exclusionsOfVersion[idem.FingerprintVersion]
	if !ok {
		t.Fatalf("no exclusions pinned for FingerprintVersion %d: add its row to exclusionsOfVersion", idem.FingerprintVersion)
	}
	got := map[string][]string{}
	for endpoint, rules := range contract {
		if len(rules.FingerprintExclude) > 0 {
			got[endpoint] = rules.FingerprintExclude
		}
	}
	same := len(got) == len(want)
	for endpoint, pointers := range want {
		same = same && slices.Equal(got[endpoint], pointers)
	}
	if !same {
		t.Errorf("openapi.yaml's fingerprint exclusions %v are not those of FingerprintVersion %d, %v: a change of what "+
			"a fingerprint ignores changes the fingerprints of records already stored; raise idem.FingerprintVersion "+
			"and pin the new set here", got, idem.FingerprintVersion, want)
	}
}
