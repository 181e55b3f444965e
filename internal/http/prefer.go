package httpapi

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemref/payments/internal/idem"
)

// PreferenceAppliedHeader says which preference of the request the answer
// honoured (RFC 7240 section 3).
const PreferenceAppliedHeader = "Preference-Applied"

// preferWait reads the wait preference of RFC 7240 (section 4.3) from the
// request's Prefer headers: `Prefer: wait=10`, alone or among others
// (`respond-async, wait=10`). A wait that is not a number of seconds is a
// preference not understood, and ignored, as the RFC asks; so is none.
func preferWait(r *http.Request) (time.Duration, bool) {
	for _, line := range r.Header.Values("Prefer") {
		for pref := range strings.SplitSeq(line, ",") {
			pref, _, _ = strings.Cut(pref, ";") // parameters of a preference: none for wait
			name, value, ok := strings.Cut(pref, "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			value = strings.Trim(strings.TrimSpace(value), `"`)
			n, err := strconv.ParseUint(value, 10, 32)
			if err != nil {
				continue
			}
			return time.Duration(n) * time.Second, true
		}
	}
	return 0, false
}

// keyed answers a keyed POST with run's answer. When run finds the key's
// first attempt in flight (ErrKeyInUse) and the request prefers to wait,
// the request waits for that attempt's answer (L7; idem.Waiters), up to
// the wait asked for, capped by the server's maximum, counted from when
// the request arrived. The answer then says Preference-Applied with the
// wait it was given, replay or 409 alike; a request refused a wait (past
// the bounds of waiters) gets the 409 without it.
func (a *api) keyed(w http.ResponseWriter, r *http.Request, arrived time.Time, c idem.Claim, run func() (idem.Response, bool, error)) {
	res, replayed, err := run()
	asked, ok := preferWait(r)
	limits := a.waiters.Limits()
	if ok && errors.Is(err, idem.ErrKeyInUse) && limits.Max > 0 && asked > 0 {
		wait := min(asked, limits.Max)
		res, replayed, err = a.waiters.Wait(r.Context(), c, arrived.Add(wait), run)
		if !errors.Is(err, idem.ErrWaitRefused) {
			w.Header().Set(PreferenceAppliedHeader, "wait="+strconv.FormatInt(int64(wait/time.Second), 10))
		}
	}
	respond(w, r, res, replayed, err)
}

// Defaults of the bounds on waiting duplicates (PREFER_WAIT_MAX,
// PREFER_WAIT_PER_TENANT, PREFER_WAIT_PER_PROCESS). The maximum stays
// under the default request timeout (20 s), so a wait ends with an answer,
// not the request's deadline. A waiter costs a goroutine, an open client
// connection (counted against MAX_CONNECTIONS) and about a read a second.
const (
	DefaultPreferWaitMax        = 10 * time.Second
	DefaultPreferWaitPerTenant  = 64
	DefaultPreferWaitPerProcess = 256
)
