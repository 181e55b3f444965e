// Package broker owns the connection to NATS JetStream and the
// configuration of its streams and consumers, as code: Ensure creates them
// when missing and brings them to this configuration when they differ
// (M2, M3). The server that make run and the tests start inside the
// process is internal/tooling/natstmp's.
package broker

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Streams.
const (
	// StreamEvents holds every event the outbox relays.
	StreamEvents = "PAYMENTS_EVENTS"
	// StreamDeadLetters keeps a copy of every message a consumer gave up
	// on (past MaxDeliver, or terminated as unreadable), for a person to
	// look at and replay.
	StreamDeadLetters = "PAYMENTS_DEAD_LETTERS"
	// DeadLetterPrefix prefixes the subjects of StreamDeadLetters:
	// payments.dead.<consumer>.<original subject>.
	DeadLetterPrefix = "payments.dead."
)

// MaxReplicas is the most replicas JetStream keeps of a stream.
const MaxReplicas = 5

// Defaults for Config.
const (
	// DefaultDuplicateWindow is the events stream's duplicates window. It
	// must cover a relay's republish of a row whose publish was
	// acknowledged but whose mark was lost: that happens once the row's
	// claim (outbox.DefaultClaimHold, 30 s) and the publish timeout (5 s)
	// have passed. Two minutes covers that with room for a slow restart;
	// a longer window costs server memory for every id in it. Beyond the
	// window the consumers' inboxes drop duplicates.
	DefaultDuplicateWindow = 2 * time.Minute
	// DefaultAckWait is how long a delivery may go unacknowledged before
	// it is redelivered: the first step of the backoff.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxDeliver is how many times a message is delivered before
	// it is dead-lettered.
	DefaultMaxDeliver = 5
	// DefaultMaxAge is how long the events stream keeps messages.
	DefaultMaxAge = 7 * 24 * time.Hour
)

// Config is the streams' and consumers' configuration.
type Config struct {
	// Replicas is how many servers of a NATS cluster keep each stream
	// (D4): 3 survives the loss of one server with nothing lost, since
	// a publish is acknowledged only once a majority of them stored it.
	// 1, the default, suits a single server.
	Replicas        int
	DuplicateWindow time.Duration
	AckWait         time.Duration
	MaxDeliver      int
}

func (c Config) withDefaults() Config {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.DuplicateWindow <= 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.AckWait <= 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	return c
}

// Backoff is the wait before each redelivery: AckWait, doubling each
// time, one per delivery (the server takes BackOff[n-1] as the ack wait of
// delivery n).
func (c Config) Backoff() []time.Duration {
	c = c.withDefaults()
	out := make([]time.Duration, c.MaxDeliver)
	d := c.AckWait
	for i := range out {
		out[i] = d
		d *= 2
	}
	return out
}

// RedeliveryHorizon is the longest a message can still be redelivered
// after its first delivery: the sum of the backoff. Inbox rows must be
// kept longer than this (M3).
func (c Config) RedeliveryHorizon() time.Duration {
	var sum time.Duration
	for _, d := range c.Backoff() {
		sum += d
	}
	return sum
}

// Ensure creates the streams when missing, or updates them to cfg.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	cfg = cfg.withDefaults()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamEvents,
		Description: "Events relayed from the payments outbox; Nats-Msg-Id is the outbox id.",
		Subjects:    []string{"payments.events.>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      DefaultMaxAge,
		Duplicates:  cfg.DuplicateWindow,
		Replicas:    cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("broker: stream %s: %w", StreamEvents, err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamDeadLetters,
		Description: "Messages consumers gave up on; kept until a person removes them.",
		Subjects:    []string{DeadLetterPrefix + ">"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  cfg.DuplicateWindow,
		Replicas:    cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("broker: stream %s: %w", StreamDeadLetters, err)
	}
	return nil
}

// ConsumerConfig is the durable pull consumer name of the events stream,
// filtered to subjects: explicit acks, redelivery on the backoff, at most
// MaxDeliver deliveries.
func ConsumerConfig(name string, subjects []string, cfg Config) jetstream.ConsumerConfig {
	cfg = cfg.withDefaults()
	return jetstream.ConsumerConfig{
		Durable:        name,
		Description:    "Applies events with an inbox row in the same transaction; acks after commit.",
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        cfg.AckWait,
		MaxDeliver:     cfg.MaxDeliver,
		BackOff:        cfg.Backoff(),
		FilterSubjects: subjects,
		MaxAckPending:  1000,
	}
}

// MinServerVersion is the oldest nats-server that takes this
// configuration. ConsumerConfig sets MaxDeliver to the number of BackOff
// values (one wait per delivery); servers before 2.10.23 refuse that
// ("max deliver is required to be > length of backoff values"). The
// consumers' FilterSubjects need 2.10.0, and TermWithReason 2.10.4.
const MinServerVersion = "2.10.23"

// ErrServerTooOld is the refusal of a server older than MinServerVersion.
var ErrServerTooOld = errors.New("broker: the NATS server is too old")

var versionPattern = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)`)

// CheckServerVersion refuses a server version older than
// MinServerVersion, or one it cannot read, with an error that says which
// version is required. A pre-release counts as its release.
func CheckServerVersion(version string) error {
	have, ok := parseVersion(version)
	want, _ := parseVersion(MinServerVersion)
	if !ok {
		return fmt.Errorf("%w: its version %q cannot be read; nats-server %s or later is required", ErrServerTooOld, version, MinServerVersion)
	}
	for i := range have {
		if have[i] != want[i] {
			if have[i] < want[i] {
				return fmt.Errorf("%w: nats-server %s; %s or later is required (older ones refuse the consumers' MaxDeliver equal to their BackOff's length)", ErrServerTooOld, version, MinServerVersion)
			}
			return nil
		}
	}
	return nil
}

// parseVersion reads major.minor.patch.
func parseVersion(version string) (v [3]int, ok bool) {
	m := versionPattern.FindStringSubmatch(version)
	if m == nil {
		return v, false
	}
	for i := range v {
		v[i], _ = strconv.Atoi(m[i+1])
	}
	return v, true
}

// Connect connects to url and returns the JetStream context. Once
// connected, the connection reconnects for ever; opts add to that, such as
// handlers that follow the connection's state. A server older than
// MinServerVersion is refused (ErrServerTooOld): it would refuse the
// consumers' configuration with a cryptic error, on every attempt. The
// error does not repeat url, which may hold a password.
func Connect(url, name string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1)}, opts...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("broker: connect: %w", err)
	}
	if err := CheckServerVersion(nc.ConnectedServerVersion()); err != nil {
		nc.Close()
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// Missing names what the broker lacks of the streams and of the durable
// consumers named, such as "the stream PAYMENTS_EVENTS", or returns ""
// when everything is there. A server restarted on empty storage has none
// of them, and says so: only a "not found" counts, not an error that
// leaves it unknown (the broker unreachable, a leader being elected).
func Missing(ctx context.Context, js jetstream.JetStream, consumers ...string) (string, error) {
	for _, name := range []string{StreamEvents, StreamDeadLetters} {
		_, err := js.Stream(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return "the stream " + name, nil
		case err != nil:
			return "", fmt.Errorf("broker: stream %s: %w", name, err)
		}
	}
	for _, name := range consumers {
		_, err := js.Consumer(ctx, StreamEvents, name)
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			return "the consumer " + name, nil
		case err != nil:
			return "", fmt.Errorf("broker: consumer %s: %w", name, err)
		}
	}
	return "", nil
}
