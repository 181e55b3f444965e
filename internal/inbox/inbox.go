// Package inbox owns processed_messages, the deduplication table of every
// consumer of at-least-once deliveries (M1): processor webhooks and events
// from the broker.
//
// The rule: Record the message's producer-assigned id in the same
// transaction that applies its effect, and acknowledge only after that
// transaction committed. A redelivery then finds the id and is skipped;
// a crash before the commit leaves neither the id nor the effect, so the
// redelivery applies it. Recording the id before the effect succeeded (in
// another transaction, or in memory) would lose the message whenever the
// effect then failed.
//
// Ids are pruned past MESSAGE_RETENTION (M3), so a missing id means "not
// applied" only for a message that cannot have been applied before the
// newest id pruned: Lookup says which.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db/dbsqlc"
)

// ErrRetentionWithinRedelivery: an inbox id would be pruned while its
// message can still be delivered again (M3), and the redelivery would
// apply its effect a second time.
var ErrRetentionWithinRedelivery = errors.New("inbox ids must be kept longer than any sender may still redeliver")

// CheckRetention reports ErrRetentionWithinRedelivery unless retention,
// how long processed ids are kept, outlasts every sender's redelivery
// horizon (the broker's backoff, a webhook sender's retries).
func CheckRetention(retention time.Duration, horizons ...time.Duration) error {
	for _, h := range horizons {
		if retention <= h {
			return ErrRetentionWithinRedelivery
		}
	}
	return nil
}

// NoTenant is the tenant of an id recorded without one: before the inbox
// named tenants (migration 000023), or for a message about nothing of a
// tenant's (a processor webhook about a charge that is not ours). Record
// and Lookup look under it as well as under the message's tenant.
var NoTenant = uuid.Nil

// Record inserts the id of a message from source, as seen by consumer, in
// tx, under tenant: the tenant whose rows the message's effect changes in
// tx (D8), which must be the same on every delivery of the message (an
// event's envelope names it; NoTenant when the message has none). It
// reports false when consumer already processed it: the caller skips the
// effect, commits nothing new, and acknowledges.
func Record(ctx context.Context, tx pgx.Tx, tenant uuid.UUID, consumer, source, messageID string) (fresh bool, err error) {
	n, err := dbsqlc.New(tx).ProcessedMessageInsert(ctx, dbsqlc.ProcessedMessageInsertParams{
		TenantID: tenant, Consumer: consumer, Source: source, MessageID: messageID,
	})
	return n == 1, err
}

// Verdict is what the inbox can say about whether a consumer applied a
// message.
type Verdict int

const (
	// NotApplied: the id is missing, and it would be there had the message
	// been applied.
	NotApplied Verdict = iota
	// Applied: the inbox holds the id.
	Applied
	// Unknown: the id is missing, but ids as old as the message's have been
	// pruned: it may have been applied and its id pruned since.
	Unknown
)

func (v Verdict) String() string {
	switch v {
	case NotApplied:
		return "not applied"
	case Applied:
		return "applied"
	case Unknown:
		return "unknown"
	}
	return "verdict " + strconv.Itoa(int(v))
}

// ClockSkewAllowance is how far the clock that dated a message (its
// producer's) may run ahead of the database's, which dates inbox ids.
// Lookup vouches only for a message dated at least this long after the
// newest id pruned.
const ClockSkewAllowance = time.Hour

// Lookup says whether consumer applied the message from source with
// messageID, recorded under tenant or NoTenant. sentAt is the earliest the
// message can have been applied (for an event, when it occurred: before
// its outbox row committed, so before any delivery), the zero time when
// unknown. prunedThrough is the
// processed_at of the newest id pruned so far, zero when none was.
//
// The id and the horizon are read in one statement, so in one snapshot: a
// prune that deleted the id has also moved the horizon past it. A message
// that Lookup finds NotApplied can still be applied by a delivery in flight
// (the broker gave up on it, its consumer had not): that delivery records
// the id, and whatever is delivered after it finds the id.
func Lookup(ctx context.Context, db dbsqlc.DBTX, tenant uuid.UUID, consumer, source, messageID string, sentAt time.Time) (v Verdict, prunedThrough time.Time, err error) {
	row, err := dbsqlc.New(db).ProcessedMessageLookup(ctx, dbsqlc.ProcessedMessageLookupParams{
		TenantID: tenant, Consumer: consumer, Source: source, MessageID: messageID,
	})
	if err != nil {
		return Unknown, time.Time{}, fmt.Errorf("inbox lookup: %w", err)
	}
	switch {
	case row.Applied:
		return Applied, deref(row.PrunedThrough), nil
	case row.PrunedThrough == nil:
		return NotApplied, time.Time{}, nil // nothing was ever pruned
	case sentAt.IsZero() || !sentAt.Add(-ClockSkewAllowance).After(*row.PrunedThrough):
		return Unknown, *row.PrunedThrough, nil
	}
	return NotApplied, *row.PrunedThrough, nil
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
