package processorsim

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/webhook"
)

// Webhooks. Once a URL is set, every charge and refund the simulator
// creates becomes an event (charge.succeeded, charge.failed,
// charge.refunded) delivered to it by POST, signed like Stripe's
// (internal/webhook) with every configured secret, so a receiver in the
// middle of a secret rotation accepts it with either. Delivery is at
// least once, as at a real processor:
//
//   - an attempt answered with anything but 2xx, or not answered within
//     the timeout, is retried after the next wait of the retry schedule,
//     until the schedule is used up;
//   - a WebhookFault queued with InjectWebhookFault makes the next event
//     deliberately duplicated (each copy delivered on its own, with the
//     same event id) or delayed (held before its first attempt, so events
//     created after it overtake it: out of order).
//
// Deliveries records every attempt; WaitWebhooks waits until none is in
// flight.

// DefaultWebhookRetry is the wait before each retry of a webhook attempt
// that failed. WebhookRetrySpan is its sum: after it no attempt of an
// event is made any more, which receivers need to know to keep the ids
// they deduplicate on long enough.
var DefaultWebhookRetry = []time.Duration{
	time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, 30 * time.Minute, time.Hour,
}

// WebhookRetrySpan is the longest time from an event's first delivery
// attempt to its last under DefaultWebhookRetry (plus one timeout per
// attempt).
func WebhookRetrySpan() time.Duration {
	span := time.Duration(len(DefaultWebhookRetry)+1) * defaultWebhookTimeout
	for _, d := range DefaultWebhookRetry {
		span += d
	}
	return span
}

const defaultWebhookTimeout = 5 * time.Second

// WebhookConfig says where and how events are delivered.
type WebhookConfig struct {
	// URL receives the events; empty turns webhooks off.
	URL string
	// Secrets sign every delivery, one v1 signature each.
	Secrets []string
	// Scheme is how deliveries are signed: webhook.SchemeProcessor (the
	// default: Processor-Signature) or webhook.SchemeStandard (Standard
	// Webhooks: webhook-id, webhook-timestamp, webhook-signature, with
	// whsec_ secrets).
	Scheme webhook.Scheme
	// Retry is the wait before each retry; nil means DefaultWebhookRetry.
	Retry []time.Duration
	// Timeout bounds each attempt; zero means 5 s.
	Timeout time.Duration
}

// WebhookFault is a one-shot fault for the next event.
type WebhookFault struct {
	// Duplicates delivers the event this many extra times.
	Duplicates int
	// Delay holds the event (every copy) this long before its first
	// attempt.
	Delay time.Duration
}

// Delivery is one delivery attempt.
type Delivery struct {
	EventID string    `json:"event_id"`
	Type    string    `json:"type"`
	Copy    int       `json:"copy"`
	Attempt int       `json:"attempt"`
	Status  int       `json:"status"` // 0: no answer
	At      time.Time `json:"at"`
}

// webhookState is the simulator's webhook part, guarded by Simulator.mu.
type webhookState struct {
	cfg        WebhookConfig
	faults     []WebhookFault
	deliveries []Delivery
	events     []processor.Event
	// pending counts deliveries in flight; idle is closed whenever it is
	// zero (see WaitWebhooks).
	pending int
	idle    chan struct{}
	client  *http.Client
}

// SetWebhooks sets where and how later events are delivered.
func (s *Simulator) SetWebhooks(cfg WebhookConfig) {
	s.mu.Lock()
	s.webhooks.cfg = cfg
	s.mu.Unlock()
	s.logger.Info("webhooks configured", slog.String("url", cfg.URL), slog.Int("secrets", len(cfg.Secrets)))
}

// InjectWebhookFault queues a fault for the next event.
func (s *Simulator) InjectWebhookFault(f WebhookFault) {
	s.mu.Lock()
	s.webhooks.faults = append(s.webhooks.faults, f)
	s.mu.Unlock()
}

// Deliveries returns every webhook delivery attempt so far.
func (s *Simulator) Deliveries() []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Delivery(nil), s.webhooks.deliveries...)
}

// Events returns every event created while webhooks were on.
func (s *Simulator) Events() []processor.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]processor.Event(nil), s.webhooks.events...)
}

// WaitWebhooks returns once no delivery is in flight (each has succeeded
// or used up its retries), or with ctx's error.
func (s *Simulator) WaitWebhooks(ctx context.Context) error {
	s.mu.Lock()
	idle := s.webhooks.idle
	s.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// emitLocked creates the event for ch and starts its deliveries. s.mu is
// held.
func (s *Simulator) emitLocked(typ string, ch processor.Charge) {
	cfg := s.webhooks.cfg
	if cfg.URL == "" {
		return
	}
	ev := processor.Event{ID: newID("evt_"), Object: "event", Type: typ, Created: time.Now().Unix()}
	ev.Data.Object = cloneCharge(ch)
	s.webhooks.events = append(s.webhooks.events, ev)
	body, _ := json.Marshal(ev)
	var f WebhookFault
	if len(s.webhooks.faults) > 0 {
		f, s.webhooks.faults = s.webhooks.faults[0], s.webhooks.faults[1:]
	}
	// Deliveries of a state that Reset forgets stop, as do those of a
	// server that shuts down.
	ctx, cancel := context.WithCancel(s.forgotten)
	stop := context.AfterFunc(s.lifetime, cancel)
	var copies sync.WaitGroup
	for c := range 1 + f.Duplicates {
		if s.webhooks.pending == 0 {
			s.webhooks.idle = make(chan struct{})
		}
		s.webhooks.pending++
		copies.Go(func() {
			s.deliver(ctx, cfg, ev, body, c, f.Delay)
			s.mu.Lock()
			if s.webhooks.pending--; s.webhooks.pending == 0 {
				close(s.webhooks.idle)
			}
			s.mu.Unlock()
		})
	}
	go func() {
		copies.Wait()
		stop()
		cancel()
	}()
}

// deliver makes the attempts of one copy of an event.
func (s *Simulator) deliver(ctx context.Context, cfg WebhookConfig, ev processor.Event, body []byte, copyNo int, delay time.Duration) {
	if !sleep(ctx, delay) {
		return
	}
	retry := cfg.Retry
	if retry == nil {
		retry = DefaultWebhookRetry
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = defaultWebhookTimeout
	}
	for attempt := 1; ; attempt++ {
		status := s.attempt(ctx, cfg, ev.ID, body, timeout)
		s.mu.Lock()
		s.webhooks.deliveries = append(s.webhooks.deliveries, Delivery{
			EventID: ev.ID, Type: ev.Type, Copy: copyNo, Attempt: attempt, Status: status, At: time.Now(),
		})
		s.mu.Unlock()
		if status >= 200 && status < 300 {
			return
		}
		if attempt > len(retry) {
			s.logger.Warn("webhook given up", slog.String("event_id", ev.ID), slog.Int("attempts", attempt))
			return
		}
		if !sleep(ctx, retry[attempt-1]) {
			return
		}
	}
}

// attempt POSTs body (the event id's) once, signed now, and returns the
// status (0: none).
func (s *Simulator) attempt(ctx context.Context, cfg WebhookConfig, id string, body []byte, timeout time.Duration) int {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	now := time.Now()
	if cfg.Scheme == webhook.SchemeStandard {
		// The message id is the event's: the same on every retry, as the
		// scheme asks.
		sig, err := webhook.SignStandard(id, now, body, cfg.Secrets...)
		if err != nil {
			s.logger.Error("webhook not signed", slog.Any("error", err))
			return 0
		}
		req.Header.Set(webhook.StandardIDHeader, id)
		req.Header.Set(webhook.StandardTimestampHeader, strconv.FormatInt(now.Unix(), 10))
		req.Header.Set(webhook.StandardSignatureHeader, sig)
	} else {
		req.Header.Set(webhook.Header, webhook.Sign(body, now, cfg.Secrets...))
	}
	res, err := s.webhooks.client.Do(req)
	if err != nil {
		return 0
	}
	defer res.Body.Close()
	return res.StatusCode
}
