package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/inbox"
)

// Reasons a message is dead-lettered, as labels and in its header.
const (
	reasonMaxDeliver = "max_deliver"
	reasonTerminated = "terminated"
)

// Advisory subjects the server publishes when a consumer gives up on a
// message: past MaxDeliver, or terminated (an unreadable event).
const (
	advisoryMaxDeliveries = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + broker.StreamEvents + ".*"
	advisoryTerminated    = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + broker.StreamEvents + ".*"
)

// Headers of a dead letter, besides the original's.
const (
	headerReason    = "Dead-Letter-Reason"
	headerConsumer  = "Dead-Letter-Consumer"
	headerStreamSeq = "Dead-Letter-Stream-Seq" // in the events stream
	headerMsgID     = "Dead-Letter-Msg-Id"     // the original's Nats-Msg-Id
)

// advisory is the part of both advisories the dead-lettering needs.
type advisory struct {
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
}

// DeadLetters handles the messages consumers gave up on: each is logged at
// error, counted, and copied to the dead-letter stream (its original also
// stays in the events stream, which keeps messages by age, not by ack).
// Every process may run one: a queue group gives each advisory to one.
type DeadLetters struct {
	sub  *nats.Subscription
	sub2 *nats.Subscription
}

// StartDeadLetters subscribes to the advisories.
func StartDeadLetters(nc *nats.Conn, js jetstream.JetStream, logger *slog.Logger) (*DeadLetters, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	handle := func(reason string) nats.MsgHandler {
		return func(m *nats.Msg) {
			var a advisory
			if err := json.Unmarshal(m.Data, &a); err != nil {
				logger.Error("dead letter: unreadable advisory", slog.Any("error", err))
				return
			}
			if err := deadLetter(js, a, reason); err != nil {
				logger.Error("dead letter: copy to the dead-letter stream failed; the original stays in the events stream",
					slog.String("consumer", a.Consumer), slog.Uint64("stream_seq", a.StreamSeq), slog.Any("error", err))
			}
			deadLettersTotal.WithLabelValues(a.Consumer, reason).Inc()
			logger.Error("dead letter: a consumer gave up on a message",
				slog.String("consumer", a.Consumer), slog.Uint64("stream_seq", a.StreamSeq),
				slog.Uint64("deliveries", a.Deliveries), slog.String("reason", reason))
		}
	}
	sub, err := nc.QueueSubscribe(advisoryMaxDeliveries, "dead-letters", handle(reasonMaxDeliver))
	if err != nil {
		return nil, err
	}
	sub2, err := nc.QueueSubscribe(advisoryTerminated, "dead-letters", handle(reasonTerminated))
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return &DeadLetters{sub: sub, sub2: sub2}, nil
}

// Stop unsubscribes.
func (d *DeadLetters) Stop() {
	_ = d.sub.Unsubscribe()
	_ = d.sub2.Unsubscribe()
}

func deadLetter(js jetstream.JetStream, a advisory, reason string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, broker.StreamEvents)
	if err != nil {
		return err
	}
	orig, err := stream.GetMsg(ctx, a.StreamSeq)
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: broker.DeadLetterPrefix + a.Consumer + "." + orig.Subject, Data: orig.Data, Header: nats.Header{}}
	for k, v := range orig.Header {
		msg.Header[k] = v
	}
	msg.Header.Set(headerReason, reason)
	msg.Header.Set(headerConsumer, a.Consumer)
	msg.Header.Set(headerStreamSeq, strconv.FormatUint(a.StreamSeq, 10))
	// The copy's own Nats-Msg-Id is below; Redrive publishes the original
	// again under this one.
	msg.Header.Set(headerMsgID, orig.Header.Get(jetstream.MsgIDHeader))
	// One copy per consumer and message, whoever handles the advisory.
	_, err = js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("dead:%s:%d", a.Consumer, a.StreamSeq)))
	return err
}

// DeadLetter is one message in the dead-letter stream.
type DeadLetter struct {
	// Seq is its sequence in the dead-letter stream.
	Seq uint64
	// Consumer gave up on it, for Reason (max_deliver or terminated).
	Consumer, Reason string
	// Subject and MsgID are the original's, on the events stream.
	Subject, MsgID string
	// At is when it was dead-lettered.
	At time.Time
}

// ListDeadLetters returns the messages in the dead-letter stream, oldest
// first.
func ListDeadLetters(ctx context.Context, js jetstream.JetStream) ([]DeadLetter, error) {
	stream, err := js.Stream(ctx, broker.StreamDeadLetters)
	if err != nil {
		return nil, fmt.Errorf("dead-letter stream: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []DeadLetter
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // redriven: deleted
		}
		if err != nil {
			return nil, err
		}
		out = append(out, deadLetterOf(m))
	}
	return out, nil
}

func deadLetterOf(m *jetstream.RawStreamMsg) DeadLetter {
	consumer := m.Header.Get(headerConsumer)
	return DeadLetter{
		Seq: m.Sequence, Consumer: consumer, Reason: m.Header.Get(headerReason),
		Subject: strings.TrimPrefix(m.Subject, broker.DeadLetterPrefix+consumer+"."),
		MsgID:   m.Header.Get(headerMsgID), At: m.Time,
	}
}

// Outcome is what Redrive did with a dead letter.
type Outcome string

const (
	// Redriven: published again to the events stream, and removed from the
	// dead-letter stream.
	Redriven Outcome = "redriven"
	// Applied: its consumer's inbox holds the event's id, so the event was
	// applied (a delivery committed and its ack was lost): removed, not
	// published.
	Applied Outcome = "applied"
	// Kept: the events stream dropped the copy as a duplicate, within its
	// duplicates window of the original: kept, to be redriven after it.
	Kept Outcome = "kept"
	// Refused: the inbox cannot vouch that the event was not applied, since
	// ids as old as the event have been pruned: kept, not published.
	Refused Outcome = "refused"
)

// RedriveResult is what Redrive did with one dead letter.
type RedriveResult struct {
	DeadLetter
	Outcome Outcome
	// EventID is the event's id, as its consumers record it in their inbox
	// (the envelope's id), and OccurredAt when it occurred; both empty for
	// a payload no consumer can read.
	EventID    string
	OccurredAt time.Time
	// PrunedThrough, when Refused, is the processed_at of the newest inbox
	// id pruned: the event occurred before it (or when is unknown).
	PrunedThrough time.Time
}

// Redrive publishes the dead letter at seq again, once its cause is fixed,
// unless its event may already have been applied. An event can be applied
// and still be dead-lettered: its last delivery commits (the inbox row and
// the effect) and the ack is lost. Every consumer of the subject receives a
// copy, and skips it only while its inbox holds the event's id; the reaper
// prunes ids past MESSAGE_RETENTION. So Redrive asks the dead letter's
// consumer's inbox first (inbox.Lookup), in pool:
//
//   - the id is there: the event was applied. The dead letter is removed
//     and nothing is published (Applied);
//   - ids as old as the event have been pruned: whether it was applied is
//     unknown, and a copy could apply it twice, at this consumer or at any
//     other of the subject. It is kept, not published (Refused); an
//     operator checks its effect by hand;
//   - otherwise no consumer applied it, or its inbox would hold the id
//     (the horizon is the same for every consumer): it is published to
//     its original subject on the events stream, with its original
//     payload, headers and Nats-Msg-Id, and then removed (Redriven). A
//     crash between the publish and the removal leaves it to be redriven
//     again, and the consumers' inboxes skip the second copy.
//
// Within the events stream's duplicates window of the original the stream
// drops the copy as a duplicate: Redrive then leaves the dead letter where
// it is, to be redriven after the window (Kept).
func Redrive(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, seq uint64) (RedriveResult, error) {
	stream, err := js.Stream(ctx, broker.StreamDeadLetters)
	if err != nil {
		return RedriveResult{}, fmt.Errorf("dead-letter stream: %w", err)
	}
	m, err := stream.GetMsg(ctx, seq)
	if err != nil {
		return RedriveResult{}, err
	}
	r := RedriveResult{DeadLetter: deadLetterOf(m)}
	if r.MsgID == "" {
		return r, fmt.Errorf("dead letter %d has no %s header", seq, headerMsgID)
	}
	// A payload that does not parse is terminated by every consumer before
	// it touches its inbox: it cannot have been applied, and publishing it
	// again is harmless. Anything else is looked up under the id the
	// consumer records, the envelope's.
	var ev events.Envelope
	if json.Unmarshal(m.Data, &ev) == nil {
		r.EventID, r.OccurredAt = ev.ID.String(), ev.OccurredAt
		// The event cannot have been applied before it occurred: it was
		// dated before its outbox row committed, so before any delivery.
		verdict, prunedThrough, err := inbox.Lookup(ctx, pool, ev.TenantID, r.Consumer, events.Source, r.EventID, ev.OccurredAt)
		if err != nil {
			return r, fmt.Errorf("dead letter %d: %w", seq, err)
		}
		switch verdict {
		case inbox.Applied:
			r.Outcome = Applied
			return r, removeDeadLetter(ctx, stream, seq)
		case inbox.Unknown:
			r.Outcome, r.PrunedThrough = Refused, prunedThrough
			return r, nil
		case inbox.NotApplied:
			// Published again, below.
		}
	}
	msg := &nats.Msg{Subject: r.Subject, Data: m.Data, Header: nats.Header{}}
	for k, v := range m.Header {
		if !strings.HasPrefix(k, "Dead-Letter-") && k != jetstream.MsgIDHeader {
			msg.Header[k] = v
		}
	}
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(r.MsgID))
	if err != nil {
		return r, err
	}
	if ack.Duplicate {
		r.Outcome = Kept
		return r, nil
	}
	r.Outcome = Redriven
	return r, removeDeadLetter(ctx, stream, seq)
}

// removeDeadLetter deletes the dead letter at seq; one already gone (a
// redrive running at the same time) is no error.
func removeDeadLetter(ctx context.Context, stream jetstream.Stream, seq uint64) error {
	if err := stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("remove dead letter %d: %w", seq, err)
	}
	return nil
}
