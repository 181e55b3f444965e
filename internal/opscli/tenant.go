package opscli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tenants"
)

// The operator's commands for tenants and keys: api tenant create, api
// tenant list, api key create, api key list, api key revoke. They need
// DATABASE_URL and nothing else, and no HTTP surface exposes them:
// whoever may change keys already holds the database's credentials, and an
// admin endpoint would need an authentication of its own, stronger than
// the keys it manages (docs/operations.md, "Rotating and revoking API
// keys"). Keys are printed once, when created, and never again: listings
// show a key's id (tenants.KeyID), never the key.

// TenantList prints every tenant: id, creation time, live and all keys,
// and the name last (it may hold spaces).
func TenantList(ctx context.Context, databaseURL string, stdout io.Writer) error {
	pool, err := db.Open(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	all, err := tenants.List(ctx, pool)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tCREATED\tLIVE KEYS\tKEYS\tNAME")
	for _, t := range all {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", t.ID, when(&t.CreatedAt), t.LiveKeys, t.Keys, t.Name)
	}
	return w.Flush()
}

// KeyCreate adds a key to the tenant named or identified by ref, and
// prints it alone on the last line, like tenant create, so scripts can
// take it with tail -n 1.
func KeyCreate(ctx context.Context, databaseURL, ref string, stdout io.Writer) error {
	pool, t, err := openTenant(ctx, databaseURL, ref)
	if err != nil {
		return err
	}
	defer pool.Close()
	k, key, err := tenants.CreateKey(ctx, pool, t.ID)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "key %s created for tenant %s (%s); the tenant's other keys work until revoked (api key revoke %s KEYID).\nThe new API key, shown only once:\n%s\n",
		k.ID, t.Name, t.ID, shellWord(ref), key)
	return nil
}

// KeyList prints the tenant's keys, oldest first: id, creation, last use
// (within a minute plus AUTH_CACHE_TTL; "-" when not used since the stamp
// exists) and revocation ("-" while the key works).
func KeyList(ctx context.Context, databaseURL, ref string, stdout io.Writer) error {
	pool, t, err := openTenant(ctx, databaseURL, ref)
	if err != nil {
		return err
	}
	defer pool.Close()
	keys, err := tenants.Keys(ctx, pool, t.ID)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "KEY ID\tCREATED\tLAST USED\tREVOKED")
	for _, k := range keys {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", k.ID, when(&k.CreatedAt), when(k.LastUsedAt), when(k.RevokedAt))
	}
	return w.Flush()
}

// KeyRevoke revokes the tenant's key whose id is keyID. A key revoked
// already is not an error: the wanted state holds, so a script run twice
// (or two operators at once) succeeds, and the first revocation's time is
// printed. The tenant's last live key is refused without --force.
func KeyRevoke(ctx context.Context, databaseURL, ref, keyID string, force bool, authCacheTTL time.Duration, stdout io.Writer) error {
	if strings.HasPrefix(keyID, "sk_") {
		// Never echoed: it is a key, however leaked.
		return errors.New("key revoke takes the key's id, not the key: the id is the first 8 hex digits of the key's SHA-256 (printf %s \"$KEY\" | sha256sum | cut -c1-8), as api key list shows it")
	}
	pool, t, err := openTenant(ctx, databaseURL, ref)
	if err != nil {
		return err
	}
	defer pool.Close()
	k, err := tenants.Revoke(ctx, pool, t.ID, keyID, force)
	switch {
	case errors.Is(err, tenants.ErrAlreadyRevoked):
		fmt.Fprintf(stdout, "key %s of tenant %s was revoked already, at %s: nothing to do\n", k.ID, t.Name, when(k.RevokedAt))
		return nil
	case errors.Is(err, tenants.ErrLastLiveKey):
		return fmt.Errorf("key %s is the last key of tenant %s that works: revoking it refuses every request of the tenant until it has a new key. Create one first (api key create %s) and move its clients to it, or, to lock the tenant out now, add --force: api key revoke %s %s --force",
			keyID, t.Name, shellWord(ref), shellWord(ref), keyID)
	case errors.Is(err, tenants.ErrKeyNotFound):
		return fmt.Errorf("tenant %s has no key with the id %s: api key list %s shows its keys", t.Name, keyID, shellWord(ref))
	case errors.Is(err, tenants.ErrKeyIDInvalid):
		return fmt.Errorf("%q is not a key id: a key id is 8 to 64 hex digits of the key's SHA-256, as api key list %s shows it", keyID, shellWord(ref))
	case errors.Is(err, tenants.ErrKeyIDAmbiguous):
		return fmt.Errorf("%w: give more of its hex digits", err)
	case err != nil:
		return err
	}
	fmt.Fprintf(stdout, "key %s of tenant %s revoked at %s; every API process refuses it within its AUTH_CACHE_TTL (%s in this environment), or at once after a restart\n",
		k.ID, t.Name, when(k.RevokedAt), authCacheTTL)
	return nil
}

// openTenant opens the database and finds the tenant ref names (its id
// or its name), saying what to do when none matches. The caller closes
// the pool.
func openTenant(ctx context.Context, databaseURL, ref string) (*pgxpool.Pool, tenants.Tenant, error) {
	pool, err := db.Open(ctx, databaseURL)
	if err != nil {
		return nil, tenants.Tenant{}, err
	}
	t, err := tenants.Find(ctx, pool, ref)
	if errors.Is(err, tenants.ErrTenantNotFound) {
		err = fmt.Errorf("no tenant has the id or name %q: api tenant list shows them", ref)
	}
	if err != nil {
		pool.Close()
		return nil, tenants.Tenant{}, err
	}
	return pool, t, nil
}

// when prints a time for the listings: UTC to the second, "-" for none.
func when(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// shellWord quotes s for the commands the messages suggest, when it needs
// it (a tenant name with spaces).
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// CreateTenant prints the new tenant's API key alone on the last line, so
// scripts can take it with `tail -n 1`.
func CreateTenant(ctx context.Context, databaseURL, name string, stdout io.Writer) error {
	pool, err := db.Open(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	id, key, err := tenants.Create(ctx, pool, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tenant %s created (%s); its API key (key id %s in api key list), shown only once:\n%s\n", name, id, tenants.KeyID(key), key)
	return nil
}
