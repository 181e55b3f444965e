package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/consumer"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/outbox"
	"github.com/idemref/payments/internal/reaper"
)

// startMessaging connects to NATS_URL, creates or updates the streams, and
// starts, beside the HTTP server, the outbox relay, the orders consumer and
// the dead-letter handler. Every API process runs all three: relays claim
// rows with SKIP LOCKED and the durable consumer splits messages between
// processes, so adding processes adds throughput, not duplicates. stop
// ends them in order: the relay, the consumer (finishing the message in
// hand), the connection.
func startMessaging(ctx context.Context, pool *pgxpool.Pool, cfg config, logger *slog.Logger) (stop func(), err error) {
	nc, js, err := broker.Connect(cfg.NatsURL, "payments-api")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	if err := broker.Ensure(ctx, js, cfg.Broker); err != nil {
		return nil, err
	}
	if window, needed := cfg.Broker.DuplicateWindow, cfg.OutboxClaimHold+outbox.DefaultPublishTimeout; window < needed {
		logger.Warn("EVENTS_DUPLICATE_WINDOW is shorter than OUTBOX_CLAIM_HOLD plus the publish timeout: a row republished after a relay crash reaches the consumers, whose inboxes drop it",
			slog.Duration("window", window), slog.Duration("needed", needed))
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	relay := outbox.NewRelay(pool, js, outbox.RelayConfig{ClaimHold: cfg.OutboxClaimHold, Logger: logger})
	go func() {
		defer close(relayDone)
		relay.Run(relayCtx)
	}()
	cons, err := consumer.Start(ctx, pool, js, consumer.Config{
		Name: orders.ConsumerName, Subjects: orders.Subjects, Broker: cfg.Broker, Logger: logger,
	}, orders.ApplyEvent)
	if err != nil {
		stopRelay()
		<-relayDone
		return nil, err
	}
	dead, err := consumer.StartDeadLetters(nc, js, logger)
	if err != nil {
		cons.Stop()
		stopRelay()
		<-relayDone
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	logger.Info("messaging running", slog.String("nats_url", cfg.NatsURL), slog.String("stream", broker.StreamEvents),
		slog.String("consumer", orders.ConsumerName), slog.Duration("duplicate_window", cfg.Broker.DuplicateWindow),
		slog.Duration("redelivery_horizon", cfg.Broker.RedeliveryHorizon()))
	return func() {
		stopRelay()
		<-relayDone
		cons.Stop()
		dead.Stop()
		nc.Close()
	}, nil
}

// reaperConfig is the reaper's configuration from cfg.
func reaperConfig(cfg config, logger *slog.Logger) reaper.Config {
	return reaper.Config{Interval: cfg.ReaperInterval, Batch: cfg.ReaperBatch, Duty: cfg.ReaperDuty, MessageRetention: cfg.MessageRetention, Logger: logger}
}
