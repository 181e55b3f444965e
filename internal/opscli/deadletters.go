package opscli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/consumer"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/messaging"
)

// DeadLetters runs `api deadletters list` and `api deadletters redrive`:
// it prints the messages consumers gave up on, or redrives each of them
// (consumer.Redrive) and prints what it did. Redrive also needs the
// database (the caller checks DATABASE_URL is set): a dead letter is
// published again only when the inbox can vouch that its event was not
// applied.
func DeadLetters(ctx context.Context, cfg config.Config, action string, stdout io.Writer) error {
	nc, js, err := broker.Connect(cfg.NatsURL, "payments-api-deadletters")
	if err != nil {
		return fmt.Errorf("NATS_URL %s: %w: start the broker, or point NATS_URL at it", messaging.RedactURL(cfg.NatsURL), err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	letters, err := consumer.ListDeadLetters(ctx, js)
	if err != nil {
		return fmt.Errorf("%w (an API process creates the streams when it connects to the broker)", err)
	}
	if action == "list" {
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "SEQ\tCONSUMER\tREASON\tSUBJECT\tMESSAGE ID\tDEAD-LETTERED AT")
		for _, dl := range letters {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", dl.Seq, dl.Consumer, dl.Reason, dl.Subject, dl.MsgID, dl.At.UTC().Format(time.RFC3339))
		}
		return w.Flush()
	}

	pool, err := db.Open(ctx, cfg.DatabaseURL, db.MaxConns(1))
	if err != nil {
		return err
	}
	defer pool.Close()
	return redrive(ctx, js, pool, letters, stdout)
}

// redrive redrives each of letters (consumer.Redrive), printing what it
// did with each and then the counts; the error says what to do with the
// dead letters kept or refused.
func redrive(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, letters []consumer.DeadLetter, stdout io.Writer) error {
	done := map[consumer.Outcome]int{}
	for _, letter := range letters {
		r, err := consumer.Redrive(ctx, js, pool, letter.Seq)
		if err != nil {
			return fmt.Errorf("redrive dead letter %d (%d redriven, %d applied so far): %w", letter.Seq, done[consumer.Redriven], done[consumer.Applied], err)
		}
		done[r.Outcome]++
		fmt.Fprintf(stdout, "%s %d %s %s %s", r.Outcome, r.Seq, r.Consumer, r.Subject, r.MsgID)
		if r.Outcome == consumer.Refused {
			occurred := "at an unknown time"
			if !r.OccurredAt.IsZero() {
				occurred = "at " + r.OccurredAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(stdout, ": event %s occurred %s, and inbox ids processed until %s have been pruned",
				r.EventID, occurred, r.PrunedThrough.UTC().Format(time.RFC3339))
		}
		fmt.Fprintln(stdout)
	}
	fmt.Fprintf(stdout, "redriven %d, applied %d, kept %d, refused %d\n",
		done[consumer.Redriven], done[consumer.Applied], done[consumer.Kept], done[consumer.Refused])
	var errs []error
	if done[consumer.Kept] > 0 {
		errs = append(errs, errors.New("the events stream still knows the message ids of the kept dead letters: they were first published within its duplicates window (EVENTS_DUPLICATE_WINDOW). Run redrive again once it has passed"))
	}
	if done[consumer.Refused] > 0 {
		errs = append(errs, fmt.Errorf("the refused dead letters are kept, not published: their events are older than what the inbox can vouch for (ids are pruned past MESSAGE_RETENTION), "+
			"so they may have been applied already (a delivery committed and its ack was lost), and a copy could apply them again. "+
			"Check each one's effect by hand (the order named in its data). If it is there, record the event as applied, "+
			"INSERT INTO processed_messages (consumer, source, message_id) VALUES ('<consumer>', '%s', '<event id>'), "+
			"and run redrive again: it removes the dead letter without publishing it. If it is not, make the effect by hand "+
			"in the transaction that inserts that row, then run redrive again", events.Source))
	}
	return errors.Join(errs...)
}
