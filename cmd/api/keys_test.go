package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// apiRun runs the api binary with args against databaseURL and returns
// what it printed and its exit code.
func apiRun(t *testing.T, databaseURL string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(apiBinary(t), args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("api %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// apiOK is apiRun for a command that must succeed; it returns stdout.
func apiOK(t *testing.T, databaseURL string, args ...string) string {
	t.Helper()
	stdout, stderr, code := apiRun(t, databaseURL, args...)
	if code != 0 {
		t.Fatalf("api %v exited %d:\n%s%s", args, code, stdout, stderr)
	}
	return stdout
}

// lastLine is the last line of out: where create commands print the key.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// orderBody is an order whose reference names the key that sent it, so a
// test counts the rows each key created.
func orderBody(reference string) string {
	return fmt.Sprintf(`{"reference":%q,"customer_id":"c","amount":1,"currency":"EUR"}`, reference)
}

// The operator's commands: a second key, the listings, revocation, and the
// errors an operator meets. No output but the create commands' last line
// holds a key or its secret.
func TestKeyCommands(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	created := apiOK(t, url, "tenant", "create", "acme corp")
	first := lastLine(created)
	if !strings.Contains(created, "key id "+tenants.KeyID(first)) {
		t.Errorf("tenant create does not name the key's id %s:\n%s", tenants.KeyID(first), created)
	}
	out := apiOK(t, url, "key", "create", "acme corp")
	second := lastLine(out)
	if !strings.HasPrefix(second, "sk_") || second == first {
		t.Fatalf("key create's last line %q is not a new key:\n%s", second, out)
	}
	if !strings.Contains(out, "key "+tenants.KeyID(second)+" created") {
		t.Errorf("key create does not name the key's id:\n%s", out)
	}
	firstID, secondID := tenants.KeyID(first), tenants.KeyID(second)
	for _, key := range []string{first, second} {
		if _, err := tenants.Authenticate(t.Context(), pool, key); err != nil {
			t.Fatalf("key %s does not authenticate: %v", tenants.KeyID(key), err)
		}
	}
	tenant, err := tenants.Find(t.Context(), pool, "acme corp")
	if err != nil {
		t.Fatal(err)
	}

	// Every output from here on, to be searched for key material.
	var printed strings.Builder
	run := func(t *testing.T, wantCode int, args ...string) string {
		t.Helper()
		stdout, stderr, code := apiRun(t, url, args...)
		printed.WriteString(stdout + stderr)
		if code != wantCode {
			t.Fatalf("api %q exited %d, want %d:\n%s%s", args, code, wantCode, stdout, stderr)
		}
		return stdout + stderr
	}

	t.Run("TenantList", func(t *testing.T) {
		out := run(t, 0, "tenant", "list")
		if !regexp.MustCompile(`(?m)^` + tenant.ID.String() + ` +\S+ +2 +2 +acme corp$`).MatchString(out) {
			t.Errorf("tenant list has no line for acme corp with 2 live keys of 2:\n%s", out)
		}
	})

	t.Run("KeyListByNameOrID", func(t *testing.T) {
		for _, ref := range []string{"acme corp", tenant.ID.String()} {
			out := run(t, 0, "key", "list", ref)
			for _, id := range []string{firstID, secondID} {
				// Both were used (authenticated above): last used is a time.
				if !regexp.MustCompile(`(?m)^` + id + ` +\S+Z +\S+Z +-$`).MatchString(out) {
					t.Errorf("key list %q has no live, used line for %s:\n%s", ref, id, out)
				}
			}
		}
	})

	t.Run("RevokeTwice", func(t *testing.T) {
		out := run(t, 0, "key", "revoke", "acme corp", firstID)
		if !strings.Contains(out, "key "+firstID+" of tenant acme corp revoked at ") || !strings.Contains(out, "AUTH_CACHE_TTL") {
			t.Errorf("key revoke printed %q", out)
		}
		if _, err := tenants.Authenticate(t.Context(), pool, first); !errors.Is(err, tenants.ErrUnauthenticated) {
			t.Errorf("the revoked key authenticates: %v", err)
		}
		out = run(t, 0, "key", "revoke", "acme corp", firstID)
		if !strings.Contains(out, "revoked already, at ") || !strings.Contains(out, "nothing to do") {
			t.Errorf("a second revoke printed %q, want it to say the key was revoked already", out)
		}
		if out := run(t, 0, "key", "list", "acme corp"); !regexp.MustCompile(`(?m)^` + firstID + ` +\S+Z +\S+ +\S+Z$`).MatchString(out) {
			t.Errorf("key list does not show %s revoked:\n%s", firstID, out)
		}
	})

	t.Run("LastLiveKeyNeedsForce", func(t *testing.T) {
		out := run(t, 1, "key", "revoke", "acme corp", secondID)
		for _, want := range []string{"last key of tenant acme corp that works", "api key create 'acme corp'", "--force"} {
			if !strings.Contains(out, want) {
				t.Errorf("revoking the last live key printed %q, want it to mention %q", out, want)
			}
		}
		if _, err := tenants.Authenticate(t.Context(), pool, second); err != nil {
			t.Fatalf("the refused revocation revoked the key: %v", err)
		}
		run(t, 0, "key", "revoke", "acme corp", secondID, "--force")
		if _, err := tenants.Authenticate(t.Context(), pool, second); !errors.Is(err, tenants.ErrUnauthenticated) {
			t.Errorf("the key revoked with --force authenticates: %v", err)
		}
		if out := run(t, 0, "tenant", "list"); !regexp.MustCompile(`(?m) 0 +2 +acme corp$`).MatchString(out) {
			t.Errorf("tenant list does not show acme corp with 0 live keys of 2:\n%s", out)
		}
	})

	t.Run("ClearErrors", func(t *testing.T) {
		tests := []struct {
			name string
			args []string
			want string
		}{
			{"UnknownTenantList", []string{"key", "list", "nobody"}, `no tenant has the id or name "nobody": api tenant list shows them`},
			{"UnknownTenantCreate", []string{"key", "create", "nobody"}, `no tenant has the id or name "nobody"`},
			{"UnknownTenantRevoke", []string{"key", "revoke", "nobody", firstID}, `no tenant has the id or name "nobody"`},
			{"UnknownKey", []string{"key", "revoke", "acme corp", unknownID(firstID, secondID)}, "tenant acme corp has no key with the id " + unknownID(firstID, secondID) + ": api key list 'acme corp' shows its keys"},
			{"NotAKeyID", []string{"key", "revoke", "acme corp", "1a2b"}, `"1a2b" is not a key id`},
			{"TheKeyInsteadOfItsID", []string{"key", "revoke", "acme corp", first}, "takes the key's id, not the key"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if out := run(t, 1, tt.args...); !strings.Contains(out, tt.want) {
					t.Errorf("api %q printed %q, want it to mention %q", tt.args, out, tt.want)
				}
			})
		}
	})

	t.Run("NoKeyMaterialPrinted", func(t *testing.T) {
		all := printed.String()
		for _, key := range []string{first, second} {
			secret := strings.SplitN(key, "_", 3)[2] // sk_<tenant>_<secret>; the secret may hold "_" itself
			if strings.Contains(all, key) || strings.Contains(all, secret) {
				t.Errorf("a listing or an error printed key %s or its secret:\n%s", tenants.KeyID(key), all)
			}
		}
	})
}

// unknownID is a key id that is neither of ids.
func unknownID(ids ...string) string {
	for _, c := range []string{"00000000", "11111111"} {
		if !strings.HasPrefix(ids[0], c) && !strings.HasPrefix(ids[1], c) {
			return c
		}
	}
	return "22222222"
}

// What each wrong command line is told.
func TestKeyCommandLineErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"BareKey", []string{"key"}, "key needs create TENANT, list TENANT or revoke TENANT KEYID"},
		{"KeyCreateWithoutTenant", []string{"key", "create"}, "key create needs the tenant's name or id"},
		{"KeyListTwoTenants", []string{"key", "list", "a", "b"}, "key list needs the tenant's name or id (one argument)"},
		{"KeyRevokeWithoutKeyID", []string{"key", "revoke", "acme"}, `key revoke needs the tenant's name or id and the key's id as api key list shows it, got "acme"`},
		{"KeyRevokeUnknownFlag", []string{"key", "revoke", "acme", "1a2b3c4d", "--now"}, `got "acme 1a2b3c4d --now"`},
		{"TenantListWithArgument", []string{"tenant", "list", "all"}, `tenant list takes no arguments, got "all"`},
		{"TenantUnknownAction", []string{"tenant", "delete", "acme"}, "tenant needs create NAME or list"},
		{"KeyListWithoutDatabaseURL", []string{"key", "list", "acme"}, "DATABASE_URL is not set"},
		{"KeyRevokeWithoutDatabaseURL", []string{"key", "revoke", "acme", "1a2b3c4d", "--force"}, "DATABASE_URL is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, func(string) string { return "" }, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("api %q: err = %v, want it to mention %q", tt.args, err, tt.want)
			}
		})
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"help"}, func(string) string { return "" }, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"api tenant list", "api key create TENANT", "api key list TENANT", "api key revoke TENANT KEYID [--force]"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("api help does not list %q", want)
		}
	}
}

// sender posts orders one after another with whichever key it holds,
// naming each by the key's label, and counts the answers.
type sender struct {
	base    string
	key     atomic.Pointer[labelledKey]
	mu      sync.Mutex
	ok      map[string]int // 201s by label
	refused []string       // every other answer
}

type labelledKey struct{ label, key string }

func (s *sender) use(label, key string) { s.key.Store(&labelledKey{label, key}) }

func (s *sender) created(label string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ok[label]
}

// run sends until ctx ends, at most one request per interval: under the
// default rate limit, so that nothing but the key can refuse one.
func (s *sender) run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 0; ctx.Err() == nil; n++ {
		k := s.key.Load()
		ref := fmt.Sprintf("%s-%d", k.label, n)
		res, err := postOrder(s.base, k.key, ref, orderBody(ref))
		s.mu.Lock()
		switch {
		case err != nil:
			s.refused = append(s.refused, fmt.Sprintf("%s: %v", ref, err))
		case res.status == http.StatusCreated:
			s.ok[k.label]++
		default:
			s.refused = append(s.refused, fmt.Sprintf("%s: %d %s", ref, res.status, res.body))
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// Rotation with overlap against a running serve: a client sends without
// pause with the old key while a second key is created, switches to the
// new key, and the old one is revoked. No request is refused at any point,
// the new key's requests create their rows, and afterwards the old key is
// refused.
func TestKeyRotationWithOverlap(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	const ttl = time.Second
	old := runTenantCreate(t, url, "rotate")
	srv := startServer(t, url, "AUTH_CACHE_TTL="+ttl.String())

	s := &sender{base: srv.base, ok: map[string]int{}}
	s.use("old", old)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.run(ctx, 20*time.Millisecond) }()
	defer func() { stop(); <-done }()
	waitCreated := func(label string, n int) {
		t.Helper()
		testkit.WaitFor(t, 30*time.Second, func() bool { return s.created(label) >= n })
	}

	waitCreated("old", 10)
	// 1. A second key: both work.
	fresh := lastLine(apiOK(t, url, "key", "create", "rotate"))
	waitCreated("old", s.created("old")+10)
	// 2. The client moves to it.
	s.use("new", fresh)
	waitCreated("new", 10)
	// 3. The old key's last use is visible, then it is revoked.
	if out := apiOK(t, url, "key", "list", "rotate"); !regexp.MustCompile(`(?m)^` + tenants.KeyID(old) + ` +\S+Z +\S+Z +-$`).MatchString(out) {
		t.Errorf("key list does not show the old key used and live:\n%s", out)
	}
	apiOK(t, url, "key", "revoke", "rotate", tenants.KeyID(old))
	// 4. Past every cache entry of the old key, the client still works.
	time.Sleep(ttl + 500*time.Millisecond)
	waitCreated("new", s.created("new")+10)
	stop()
	<-done

	s.mu.Lock()
	total := s.ok["old"] + s.ok["new"] + len(s.refused)
	t.Logf("rotation: %d requests (%d with the old key, %d with the new one), %d refused", total, s.ok["old"], s.ok["new"], len(s.refused))
	if len(s.refused) > 0 {
		t.Errorf("%d requests refused during the rotation, want none: %v", len(s.refused), s.refused)
	}
	for _, label := range []string{"old", "new"} {
		if n := count(t, pool, `SELECT count(*) FROM orders WHERE reference LIKE $1`, label+"-%"); n != s.ok[label] {
			t.Errorf("orders created with the %s key = %d, want one per 201 (%d)", label, n, s.ok[label])
		}
	}
	s.mu.Unlock()
	if s.ok["new"] == 0 {
		t.Fatal("no request with the new key created an order")
	}
	if res, err := postOrder(srv.base, old, "after", orderBody("after")); err != nil || res.status != http.StatusUnauthorized {
		t.Fatalf("the revoked old key after AUTH_CACHE_TTL: %v %d %s, want 401", err, res.status, res.body)
	}
}

// The stated bound, measured against two running serve processes: a key
// revoked with api key revoke is still served by a process that cached it,
// and refused by every process within AUTH_CACHE_TTL; then it stays
// refused and creates nothing.
func TestKeyRevokedIsRefusedWithinAuthCacheTTL(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	const (
		ttl    = 2 * time.Second
		poll   = 50 * time.Millisecond
		margin = time.Second // a poll, a request, a slow machine
	)
	old := runTenantCreate(t, url, "revoke")
	fresh := lastLine(apiOK(t, url, "key", "create", "revoke"))
	servers := []*serverProcess{
		startServer(t, url, "AUTH_CACHE_TTL="+ttl.String()),
		startServer(t, url, "AUTH_CACHE_TTL="+ttl.String()),
	}
	served := 0 // 201s with the old key, each an order
	n := 0
	send := func(srv *serverProcess) int {
		t.Helper()
		n++
		ref := fmt.Sprintf("old-%d", n)
		res, err := postOrder(srv.base, old, ref, orderBody(ref))
		if err != nil {
			t.Fatal(err)
		}
		if res.status == http.StatusCreated {
			served++
		} else if res.status != http.StatusUnauthorized {
			t.Fatalf("%s: %d %s, want 201 or 401", ref, res.status, res.body)
		}
		return res.status
	}

	// Each process looks the key up and caches it.
	primed := time.Now()
	for _, srv := range servers {
		if status := send(srv); status != http.StatusCreated {
			t.Fatalf("the key before revocation: %d", status)
		}
	}
	revoking := time.Now()
	apiOK(t, url, "key", "revoke", "revoke", tenants.KeyID(old))
	revoked := time.Now()

	refusedAfter := make([]time.Duration, len(servers))
	servedAfter := make([]int, len(servers))
	for pending := len(servers); pending > 0; time.Sleep(poll) {
		for i, srv := range servers {
			if refusedAfter[i] != 0 {
				continue
			}
			if send(srv) == http.StatusUnauthorized {
				refusedAfter[i] = time.Since(revoked)
				pending--
				continue
			}
			servedAfter[i]++
			if since := time.Since(revoked); since > ttl+margin {
				t.Fatalf("process %d still serves the revoked key %v after api key revoke returned, past AUTH_CACHE_TTL %v + %v", i, since, ttl, margin)
			}
		}
	}
	for i := range servers {
		t.Logf("process %d: revoked key served %d more times, refused %v after api key revoke returned (it ran %v; AUTH_CACHE_TTL %v, cached %v before)",
			i, servedAfter[i], refusedAfter[i].Round(time.Millisecond), revoked.Sub(revoking).Round(time.Millisecond), ttl, revoking.Sub(primed).Round(time.Millisecond))
		// The bound is real, not zero: a process that cached the key well
		// within the TTL still served it after the revocation.
		if revoked.Sub(primed) < ttl/2 && servedAfter[i] == 0 {
			t.Errorf("process %d refused the key at once although it cached it %v before: is the cache bypassed?", i, revoked.Sub(primed))
		}
	}

	// Refused from now on, everywhere, and creating nothing.
	before := count(t, pool, `SELECT count(*) FROM orders WHERE reference LIKE 'old-%'`)
	if before != served {
		t.Fatalf("orders with the old key = %d, want one per 201 (%d)", before, served)
	}
	for range 10 {
		for i, srv := range servers {
			if status := send(srv); status != http.StatusUnauthorized {
				t.Fatalf("process %d served the revoked key again after refusing it: %d", i, status)
			}
		}
		time.Sleep(ttl / 10) // the later requests span a whole TTL
	}
	if after := count(t, pool, `SELECT count(*) FROM orders WHERE reference LIKE 'old-%'`); after != before {
		t.Fatalf("the refused key created %d orders", after-before)
	}
	// The tenant's other key is untouched.
	for i, srv := range servers {
		ref := fmt.Sprintf("new-%d", i)
		if res, err := postOrder(srv.base, fresh, ref, orderBody(ref)); err != nil || res.status != http.StatusCreated {
			t.Fatalf("the tenant's other key: %v %d %s", err, res.status, res.body)
		}
	}
}
