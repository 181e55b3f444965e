package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/consumer"
)

// deadLetters runs `api deadletters list` and `api deadletters redrive`:
// it prints the messages consumers gave up on, or publishes each of them
// again to the events stream (consumer.Redrive) and prints what it did.
func deadLetters(ctx context.Context, cfg config, action string, stdout io.Writer) error {
	nc, js, err := broker.Connect(cfg.NatsURL, "payments-api-deadletters")
	if err != nil {
		return fmt.Errorf("NATS_URL %s: %w: start the broker, or point NATS_URL at it", redactURL(cfg.NatsURL), err)
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
	var redriven, kept int
	for _, letter := range letters {
		dl, wasKept, err := consumer.Redrive(ctx, js, letter.Seq)
		if err != nil {
			return fmt.Errorf("redrive dead letter %d (%d redriven so far): %w", letter.Seq, redriven, err)
		}
		verb := "redriven"
		if wasKept {
			verb, kept = "kept", kept+1
		} else {
			redriven++
		}
		fmt.Fprintf(stdout, "%s %d %s %s %s\n", verb, dl.Seq, dl.Consumer, dl.Subject, dl.MsgID)
	}
	fmt.Fprintf(stdout, "redriven %d, kept %d\n", redriven, kept)
	if kept > 0 {
		return errors.New("the events stream still knows the message ids of the kept dead letters: they were first published within its duplicates window (EVENTS_DUPLICATE_WINDOW). Run redrive again once it has passed")
	}
	return nil
}
