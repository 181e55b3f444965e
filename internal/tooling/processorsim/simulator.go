package processorsim

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/simproc"
)

// Test payment methods. The payment method alone decides a charge's
// outcome, so tests are deterministic; any other pm_ value is unknown.
const (
	PaymentMethodVisa              = "pm_card_visa"
	PaymentMethodMastercard        = "pm_card_mastercard"
	PaymentMethodDeclined          = "pm_card_chargeDeclined"
	PaymentMethodInsufficientFunds = "pm_card_chargeDeclinedInsufficientFunds"
)

// declineCodes maps each known payment method to its decline code; an
// empty code means the charge succeeds.
var declineCodes = map[string]string{
	PaymentMethodVisa:              "",
	PaymentMethodMastercard:        "",
	PaymentMethodDeclined:          "generic_decline",
	PaymentMethodInsufficientFunds: "insufficient_funds",
}

// Config is the simulator's initial mode; Reset returns to it.
type Config struct {
	// Logger receives one JSON-friendly record per call. Nil discards.
	Logger *slog.Logger
	// IgnoreIdempotencyKeys makes every call execute: keys are recorded but
	// never deduplicated, like a processor without idempotency support
	// (requirement S4).
	IgnoreIdempotencyKeys bool
	// Latency is added to every call to /v1.
	Latency time.Duration
	// Webhooks is where and how events are delivered (webhooks.go);
	// Reset keeps the current webhook configuration.
	Webhooks WebhookConfig
	// HoldTimer, when set, replaces the timer of a call held by a latency
	// or late_execution fault: it is called once the call is held (its key
	// in flight), and the hold ends when the returned channel delivers.
	// Tests use it to act while the key is in flight and to decide when
	// the delay has passed, without sleeping: the schedule explorer of
	// internal/payments lands each held call as one step of a schedule.
	HoldTimer func(time.Duration) <-chan time.Time

	// onBlock is called when a call starts waiting in a timeout fault, so
	// tests can act while it is in flight without sleeping.
	onBlock func()
	// maxExecution, when set, replaces MaxExecution, so tests can watch a
	// call reach it.
	maxExecution time.Duration
}

// Simulator is the processor's state and HTTP API. It is safe for
// concurrent use.
type Simulator struct {
	cfg     Config
	logger  *slog.Logger
	handler http.Handler

	// lifetime ends when the server serving the simulator shuts down
	// (Start sets it). A late execution waits on it rather than on its
	// client, so shutdown stays bounded.
	lifetime context.Context

	// mu guards everything below. Two calls with one key never both
	// execute: a call that is not held looks up the key, executes and
	// stores the response under one hold of mu; a held call marks its key
	// in flight under mu when it is accepted and unmarks it when it lands.
	mu         sync.Mutex
	ignoreKeys bool
	// refuseKey answers every /v1 call 401, as a processor does to a
	// revoked secret key (POST /_sim/mode refuse_key).
	refuseKey   bool
	latency     time.Duration
	faults      map[string][]Fault
	seq         int64
	calls       []*Call
	charges     []processor.Charge
	chargeIndex map[string]int
	refunds     []processor.Refund
	keys        map[string]storedResponse
	// inFlight maps each key that a held call has claimed to that call.
	inFlight map[string]*Call
	// forgotten is done once Reset forgets the state held calls were
	// accepted into, so they give up without executing; forget ends it.
	forgotten context.Context
	forget    context.CancelFunc
	// webhooks is the webhook delivery state (webhooks.go).
	webhooks webhookState
	// held counts calls held by a latency or late_execution fault, across
	// resets; idle is closed whenever it is zero (see WaitIdle).
	held int
	idle chan struct{}
}

// storedResponse is what a key is bound to once a call with it executed.
type storedResponse struct {
	path        string
	fingerprint string
	status      int
	body        []byte
}

// Call is one recorded call to /v1, in arrival order. Status is the HTTP
// status sent, 0 when none was (timeout, lost response, client gone, a
// late execution whose client had left). Executed says the call created a
// charge or refund, which for a held call becomes true only once it
// lands; Replayed says it got a stored response instead.
type Call struct {
	Seq            int64     `json:"seq"`
	Method         string    `json:"method"`
	Path           string    `json:"path"`
	IdempotencyKey string    `json:"idempotency_key"`
	Status         int       `json:"status"`
	Fault          FaultKind `json:"fault"`
	Executed       bool      `json:"executed"`
	Replayed       bool      `json:"replayed"`
	At             time.Time `json:"at"`
}

// New returns a simulator in the mode cfg describes, with no state.
func New(cfg Config) *Simulator {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.maxExecution == 0 {
		cfg.maxExecution = MaxExecution
	}
	if cfg.HoldTimer == nil {
		cfg.HoldTimer = time.After
	}
	s := &Simulator{cfg: cfg, logger: logger, lifetime: context.Background(), idle: make(chan struct{})}
	close(s.idle)
	s.webhooks.cfg = cfg.Webhooks
	s.webhooks.client = &http.Client{}
	s.webhooks.idle = make(chan struct{})
	close(s.webhooks.idle)
	s.resetLocked()
	s.handler = s.routes()
	return s
}

// Handler returns the simulator's HTTP API. Served by anything but Start,
// nothing tells a late execution that its server is shutting down, so it
// waits out its delay: call WaitIdle or Reset before closing that server.
func (s *Simulator) Handler() http.Handler { return s.handler }

// SetIgnoreIdempotencyKeys switches deduplication off (true) or back on.
// Responses stored before the switch are kept and replayed again once
// deduplication is back on.
func (s *Simulator) SetIgnoreIdempotencyKeys(ignore bool) {
	s.mu.Lock()
	s.ignoreKeys = ignore
	s.mu.Unlock()
	s.logger.Info("mode changed", slog.Bool("ignore_idempotency_keys", ignore))
}

// SetRefuseKey makes every later call to /v1 answer 401, without
// executing or recording it, as a processor answers a revoked secret key
// (true), or serves them again (false).
func (s *Simulator) SetRefuseKey(refuse bool) {
	s.mu.Lock()
	s.refuseKey = refuse
	s.mu.Unlock()
	s.logger.Info("mode changed", slog.Bool("refuse_key", refuse))
}

// refusing answers 401 to every /v1 call while the key is refused.
func (s *Simulator) refusing(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		refuse := s.refuseKey
		s.mu.Unlock()
		if refuse && strings.HasPrefix(r.URL.Path, "/v1/") {
			writeOutcome(w, errorOutcome(http.StatusUnauthorized, simproc.APIError{
				Type: simproc.ErrorTypeInvalidRequest, Message: "Invalid API Key provided (the simulator's refuse_key mode).",
			}))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// SetLatency sets the latency added to every later call to /v1.
func (s *Simulator) SetLatency(d time.Duration) {
	s.mu.Lock()
	s.latency = d
	s.mu.Unlock()
	s.logger.Info("mode changed", slog.Duration("latency", d))
}

// InjectFault queues a one-shot fault: the next POST to f.Path takes it.
// Faults for one path are taken in the order they were queued. It panics
// on a fault the /_sim/faults endpoint would reject (an unknown kind or
// path, a parameter out of range or of another kind): that is a bug in
// the test, better found at once than as a call that never misbehaves.
func (s *Simulator) InjectFault(f Fault) {
	if !validFault(f) {
		panic(fmt.Sprintf("processorsim: invalid fault %+v", f))
	}
	s.mu.Lock()
	s.faults[f.Path] = append(s.faults[f.Path], f)
	s.mu.Unlock()
	s.logger.Info("fault queued", slog.String("path", f.Path), slog.String("kind", string(f.Kind)), slog.Duration("latency", f.Latency))
}

// Reset forgets every charge, refund, stored response, call and queued
// fault, and restores the mode from the Config given to New. Calls held by
// a latency or late_execution fault belong to the forgotten state: they
// give up at once, without executing, so none lands in the fresh one.
func (s *Simulator) Reset() {
	s.mu.Lock()
	s.resetLocked()
	s.mu.Unlock()
	s.logger.Info("reset")
}

func (s *Simulator) resetLocked() {
	s.ignoreKeys = s.cfg.IgnoreIdempotencyKeys
	s.refuseKey = false
	s.latency = s.cfg.Latency
	s.faults = map[string][]Fault{}
	s.seq = 0
	s.calls = nil
	s.charges = nil
	s.chargeIndex = map[string]int{}
	s.refunds = nil
	s.keys = map[string]storedResponse{}
	s.inFlight = map[string]*Call{}
	s.webhooks.faults, s.webhooks.deliveries, s.webhooks.events = nil, nil, nil
	if s.forget != nil {
		s.forget()
	}
	s.forgotten, s.forget = context.WithCancel(context.Background())
}

// WaitIdle returns once no call is held by a latency or late_execution
// fault: each has executed, with its response stored and its call record
// final, or given up without executing. Tests use it to wait, without
// sleeping, until a late charge has landed. Calls not yet accepted when it
// is called (still reading their body, say) are not waited for. It returns
// ctx's error if ctx ends first.
func (s *Simulator) WaitIdle(ctx context.Context) error {
	s.mu.Lock()
	idle := s.idle
	s.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Calls returns every recorded call, in arrival order.
func (s *Simulator) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Call, len(s.calls))
	for i, c := range s.calls {
		out[i] = *c
	}
	return out
}

// Charges returns every charge created, failed ones included, in creation
// order and with their current refunded amount.
func (s *Simulator) Charges() []processor.Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]processor.Charge, len(s.charges))
	for i, ch := range s.charges {
		out[i] = cloneCharge(ch)
	}
	return out
}

// Refunds returns every refund created, in creation order.
func (s *Simulator) Refunds() []processor.Refund {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]processor.Refund(nil), s.refunds...)
}

// CreateChargeDirect creates a charge as if a call with idempotencyKey had
// executed, bypassing deduplication, validation and the call record. Tests
// use it to put a double charge in place for reconciliation to find. A
// declining test payment method gives a failed charge; anything else, even
// an unknown payment method, a succeeded one.
func (s *Simulator) CreateChargeDirect(req processor.ChargeRequest, idempotencyKey string) processor.Charge {
	status := processor.StatusSucceeded
	if declineCodes[req.PaymentMethod] != "" {
		status = processor.StatusFailed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneCharge(s.newChargeLocked(req, idempotencyKey, status))
}

func (s *Simulator) newChargeLocked(req processor.ChargeRequest, key, status string) processor.Charge {
	metadata := maps.Clone(req.Metadata)
	if metadata == nil {
		// Always an object on the wire, never null, as at Stripe.
		metadata = map[string]string{}
	}
	ch := processor.Charge{
		ID:             newID("ch_"),
		Object:         "charge",
		Amount:         req.Amount,
		Currency:       req.Currency,
		PaymentMethod:  req.PaymentMethod,
		Status:         status,
		Metadata:       metadata,
		IdempotencyKey: key,
		Created:        time.Now().Unix(),
	}
	if status == processor.StatusFailed {
		ch.DeclineCode = declineCodes[req.PaymentMethod]
	}
	s.chargeIndex[ch.ID] = len(s.charges)
	s.charges = append(s.charges, ch)
	if status == processor.StatusSucceeded {
		s.emitLocked(processor.EventChargeSucceeded, ch)
	} else {
		s.emitLocked(processor.EventChargeFailed, ch)
	}
	return ch
}

// cloneCharge copies the metadata map so callers cannot race with the
// simulator through it.
func cloneCharge(ch processor.Charge) processor.Charge {
	ch.Metadata = maps.Clone(ch.Metadata)
	return ch
}

const idAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newID returns prefix plus 24 random alphanumerics, the shape of a Stripe
// id. Ids need to be unique, not secret, so math/rand is enough.
func newID(prefix string) string {
	b := make([]byte, 24)
	for i := range b {
		b[i] = idAlphabet[rand.IntN(len(idAlphabet))]
	}
	return prefix + string(b)
}
