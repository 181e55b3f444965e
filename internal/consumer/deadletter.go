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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
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

// Redrive publishes the dead letter at seq again, once its cause is fixed:
// to its original subject on the events stream, with its original payload,
// headers and Nats-Msg-Id, and then deletes it from the dead-letter stream.
// Every consumer of the subject receives the copy; those that applied the
// original skip it, since their inboxes hold its event id. A crash between
// the publish and the delete leaves it to be redriven again, with the same
// outcome.
//
// Within the events stream's duplicates window of the original the stream
// drops the copy as a duplicate: Redrive then reports kept and leaves the
// dead letter where it is, to be redriven after the window.
func Redrive(ctx context.Context, js jetstream.JetStream, seq uint64) (dl DeadLetter, kept bool, err error) {
	stream, err := js.Stream(ctx, broker.StreamDeadLetters)
	if err != nil {
		return DeadLetter{}, false, fmt.Errorf("dead-letter stream: %w", err)
	}
	m, err := stream.GetMsg(ctx, seq)
	if err != nil {
		return DeadLetter{}, false, err
	}
	dl = deadLetterOf(m)
	if dl.MsgID == "" {
		return dl, false, fmt.Errorf("dead letter %d has no %s header", seq, headerMsgID)
	}
	msg := &nats.Msg{Subject: dl.Subject, Data: m.Data, Header: nats.Header{}}
	for k, v := range m.Header {
		if !strings.HasPrefix(k, "Dead-Letter-") && k != jetstream.MsgIDHeader {
			msg.Header[k] = v
		}
	}
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(dl.MsgID))
	if err != nil {
		return dl, false, err
	}
	if ack.Duplicate {
		return dl, true, nil
	}
	if err := stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return dl, false, fmt.Errorf("delete dead letter %d after its redrive: %w", seq, err)
	}
	return dl, false, nil
}
