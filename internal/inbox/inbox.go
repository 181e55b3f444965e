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
package inbox

import (
	"context"
	"errors"
	"time"

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

// Record inserts the id of a message from source, as seen by consumer, in
// tx. It reports false when consumer already processed it: the caller
// skips the effect, commits nothing new, and acknowledges.
func Record(ctx context.Context, tx pgx.Tx, consumer, source, messageID string) (fresh bool, err error) {
	n, err := dbsqlc.New(tx).ProcessedMessageInsert(ctx, dbsqlc.ProcessedMessageInsertParams{
		Consumer: consumer, Source: source, MessageID: messageID,
	})
	return n == 1, err
}
