package idem

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db/dbsqlc"
)

// Key states a client can be told (E4).
const (
	StateInProgress    = "in_progress"
	StateCompleted     = "completed"
	StateResultExpired = "result_expired"
)

// ErrKeyUnknown: no record of the key on that endpoint for this tenant, or
// the key is past its retention and forgotten. It is not yet "never ran":
// a one-transaction request writes its key's row as the last statement of
// its transaction (Execute), and a multi-step one in the transaction of its
// first step (Begin), so a request still running has no row. No record is
// final only once CommitWindow has passed since the key's last request was
// sent.
var ErrKeyUnknown = errors.New("no record of this Idempotency-Key")

// commitGrace is what CommitWindow adds for the time a request takes from
// the client's write to the handler, and for the COMMIT the database may
// still be running when the request's deadline passes.
const commitGrace = 2 * time.Second

// CommitWindow is how long after it was sent a request under a key can
// still commit, for requests whose context gave them at most
// requestTimeout: after that, a key with no record stays without one until
// a new request comes.
//
// Every statement of Execute and Begin runs under the request's context,
// so none is sent past its deadline. One may still be running at the
// database then: when the deadline passes, pgx closes the connection, and
// the server finishes the statements it already received before it notices.
// The last of those can be the claim with COMMIT behind it, and the claim
// can wait up to Config.LockTimeout on a duplicate's uncommitted key row.
// Hence requestTimeout + LockTimeout, plus commitGrace, rounded up to the
// second. A proxy in front of the API that holds requests adds its hold.
func (s *Store) CommitWindow(requestTimeout time.Duration) time.Duration {
	return (requestTimeout + s.cfg.LockTimeout + commitGrace + time.Second - 1).Truncate(time.Second)
}

// KeyStatus is what became of a key: what a client asks after its
// retries ran out without a final answer. It never carries the stored body.
type KeyStatus struct {
	State string
	// RecoveryPoint is the last committed step of a multi-step key.
	RecoveryPoint string
	// ResponseStatus is the recorded status, 0 while in progress.
	ResponseStatus int
	// ResourceID and ResourceLocation name what the request created, when
	// known.
	ResourceID       uuid.UUID
	ResourceLocation string
	CreatedAt        time.Time
	CompletedAt      *time.Time
	// ExpiresAt: the result is replayed until then. RetainUntil: the key
	// is remembered until then.
	ExpiresAt, RetainUntil time.Time
}

// Status reports the state of the tenant's key on endpoint, or
// ErrKeyUnknown.
func (s *Store) Status(ctx context.Context, tenantID uuid.UUID, endpoint, key string) (KeyStatus, error) {
	row, err := dbsqlc.New(s.pool).IdemKeyStatus(ctx, dbsqlc.IdemKeyStatusParams{TenantID: tenantID, Endpoint: endpoint, IdemKey: key})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && row.Forgotten) {
		// Past its retention a key behaves as unknown (E3), pruned or not.
		return KeyStatus{}, ErrKeyUnknown
	}
	if err != nil {
		return KeyStatus{}, s.wrap(err)
	}
	st := KeyStatus{
		State: row.State, CreatedAt: row.CreatedAt, CompletedAt: row.CompletedAt,
		ExpiresAt: row.ExpiresAt, RetainUntil: row.RetainUntil,
	}
	if row.ResultExpired {
		st.State = StateResultExpired
	}
	if row.RecoveryPoint != nil {
		st.RecoveryPoint = *row.RecoveryPoint
	}
	if row.ResponseStatus != nil {
		st.ResponseStatus = int(*row.ResponseStatus)
	}
	if row.ResourceID != nil {
		st.ResourceID = *row.ResourceID
	}
	if row.ResourceLocation != nil {
		st.ResourceLocation = *row.ResourceLocation
	}
	return st, nil
}
