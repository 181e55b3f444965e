package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
)

// Advisory subjects the server publishes when a consumer gives up on a
// message: past MaxDeliver, or terminated (an unreadable event).
const (
	advisoryMaxDeliveries = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + broker.StreamEvents + ".*"
	advisoryTerminated    = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + broker.StreamEvents + ".*"
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
	sub, err := nc.QueueSubscribe(advisoryMaxDeliveries, "dead-letters", handle("max_deliver"))
	if err != nil {
		return nil, err
	}
	sub2, err := nc.QueueSubscribe(advisoryTerminated, "dead-letters", handle("terminated"))
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
	msg.Header.Set("Dead-Letter-Reason", reason)
	msg.Header.Set("Dead-Letter-Consumer", a.Consumer)
	msg.Header.Set("Dead-Letter-Stream-Seq", strconv.FormatUint(a.StreamSeq, 10))
	// One copy per consumer and message, whoever handles the advisory.
	_, err = js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("dead:%s:%d", a.Consumer, a.StreamSeq)))
	return err
}
