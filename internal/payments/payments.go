package payments

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/processor"
)

// The idempotent endpoints whose keys this package runs. Both call the
// processor, so both run on leases (MultiStep) and the completer resumes
// their keys when the client goes away. The edge routes them: internal/http
// lists them in its table of endpoints.
var (
	CreatePayment = idem.Endpoint{Method: http.MethodPost, Route: "/v1/payments", MultiStep: true}
	CreateRefund  = idem.Endpoint{Method: http.MethodPost, Route: "/v1/payments/{id}/refunds", MultiStep: true}
)

// Endpoints are the endpoints of this package, whose expired keys the
// completer takes over.
var Endpoints = []idem.Endpoint{CreatePayment, CreateRefund}

// Names of the endpoints, as their keys are scoped, for claims made outside
// the HTTP layer.
var (
	EndpointPay    = CreatePayment.String()
	EndpointRefund = CreateRefund.String()
)

// Deterministic failures. Each is recorded under the request's key and
// replayed (O1).
var (
	// ErrNotFound: no such payment for this tenant.
	ErrNotFound = errors.New("payment not found")
	// ErrRefundNotFound: no such refund of this payment for this tenant.
	ErrRefundNotFound = errors.New("refund not found")
	// ErrOrderNotFound: the order to pay does not exist for this tenant.
	ErrOrderNotFound = errors.New("the order does not exist")
	// ErrNotRefundable: only a succeeded payment can be refunded.
	ErrNotRefundable = errors.New("the payment has not succeeded, so it cannot be refunded")
	// ErrProcessorUnavailable: the processor did not execute the call (429,
	// no connection). Transient: the key is released at its recovery point
	// and the retry resumes with the same derived key (O2).
	ErrProcessorUnavailable = errors.New("the payment processor did not execute the call")
	// ErrOutcomeUnknown: the processor has not told us whether the charge or
	// refund happened (a timeout, a lost answer, a 5xx, a same-key call
	// still running), and it may still happen. Nothing is final: the key
	// is released at its recovery point, and the retry (or the completer)
	// looks the call up, waiting out the settle window before it sends
	// again (S6).
	ErrOutcomeUnknown = errors.New("the outcome of the processor call is not known yet")
)

// RetryError is a step without a final outcome: Err is
// ErrProcessorUnavailable or ErrOutcomeUnknown (wrapping the cause), and
// the key is released for RetryAfter before a retry may resume it.
type RetryError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *RetryError) Error() string { return e.Err.Error() }
func (e *RetryError) Unwrap() error { return e.Err }

// RetryAfter returns how long a client should wait before retrying after
// err, 0 when err does not say.
func RetryAfter(err error) time.Duration {
	var re *RetryError
	if errors.As(err, &re) {
		return re.RetryAfter
	}
	return 0
}

// AmountMismatchError: the payment does not pay exactly what the order
// still owes.
type AmountMismatchError struct {
	Owed     int64
	Currency string
}

func (e *AmountMismatchError) Error() string {
	return fmt.Sprintf("the order owes %d %s; the payment must match", e.Owed, e.Currency)
}

// PaymentExistsError is the backstop: the order already has a payment
// that has not failed.
type PaymentExistsError struct{ PaymentID uuid.UUID }

func (e *PaymentExistsError) Error() string {
	return fmt.Sprintf("the order already has a payment: %s", e.PaymentID)
}

// DeclinedError: the processor declined the card. Final for this request;
// a new request (new key) may try another card.
type DeclinedError struct {
	PaymentID   uuid.UUID
	DeclineCode string
}

func (e *DeclinedError) Error() string { return "the card was declined: " + e.DeclineCode }

// ProcessorRejectedError: the processor refused the request itself (not a
// decline), e.g. an unknown payment method.
type ProcessorRejectedError struct{ Code, Message string }

func (e *ProcessorRejectedError) Error() string {
	return "the processor rejected the request: " + e.Message
}

// RefundExistsError: this request made a refund already, under an
// idempotency key the server has since forgotten (past its retention).
type RefundExistsError struct{ RefundID uuid.UUID }

func (e *RefundExistsError) Error() string {
	return fmt.Sprintf("this request made refund %s already", e.RefundID)
}

// RefundExceedsError: the refund would take the refunded total above the
// payment's amount.
type RefundExceedsError struct{ Refundable int64 }

func (e *RefundExceedsError) Error() string {
	return fmt.Sprintf("at most %d can still be refunded", e.Refundable)
}

// Renderer turns outcomes into the exact responses recorded under keys.
// The HTTP layer implements it, so errors become HTTP in one place, and the
// completer records byte for byte what the request itself would have.
type Renderer interface {
	Payment(Payment) idem.Response
	Refund(Refund) idem.Response
	// Failure renders a failure, and says whether it is an outcome the key
	// records (deterministic) or one that rolls back (transient). The
	// HTTP layer owns that rule, for both paths.
	Failure(error) (res idem.Response, recorded bool)
}

// DefaultSettleWindow is Config.SettleWindow's default: comfortably above
// the longest a processor executes one call (the simulator's
// processorsim.MaxExecution is 30 s).
const DefaultSettleWindow = 2 * time.Minute

// Config tunes a Service.
type Config struct {
	// SettleWindow is how long after a processor call was sent it may
	// still land (S6). It must exceed the processor's longest execution,
	// not just our timeout: a processor keeps executing a call whose
	// caller gave up. Until it has passed since the last call with an
	// unknown outcome, and a lookup found nothing, no new call is sent and
	// nothing is recorded as final. Zero means DefaultSettleWindow.
	SettleWindow time.Duration
}

// Timings are the clocks a payment's safety rests on; Check says which
// rule they break.
type Timings struct {
	// RequestTimeout is the deadline of one HTTP request.
	RequestTimeout time.Duration
	// ProcessorTimeout bounds one processor call.
	ProcessorTimeout time.Duration
	// Lease is how long an attempt owns its key (idem.Config.Lease).
	Lease time.Duration
	// SettleWindow is Config.SettleWindow.
	SettleWindow time.Duration
}

// The rules Timings.Check enforces.
var (
	// A payment request makes one processor call and must have time to
	// record its answer.
	ErrProcessorCallOutlastsRequest = errors.New("a processor call (ProcessorTimeout) must end before the request's deadline (RequestTimeout)")
	// The lease must outlast one step, the processor call included, or a
	// healthy attempt would be taken over while it waits for the answer.
	ErrLeaseWithinProcessorCall = errors.New("the lease (Lease) must outlast a processor call (ProcessorTimeout), or a healthy attempt is taken over while it waits")
	// A call can land after we stopped waiting for it, never before.
	ErrSettleWithinProcessorCall = errors.New("the settle window (SettleWindow) must outlast a processor call (ProcessorTimeout): a call can land after its caller gave up")
)

// Check reports the first rule t breaks.
func (t Timings) Check() error {
	switch {
	case t.ProcessorTimeout >= t.RequestTimeout:
		return ErrProcessorCallOutlastsRequest
	case t.Lease <= t.ProcessorTimeout:
		return ErrLeaseWithinProcessorCall
	case t.SettleWindow <= t.ProcessorTimeout:
		return ErrSettleWithinProcessorCall
	}
	return nil
}

// Service runs payments and refunds.
type Service struct {
	pool   *pgxpool.Pool
	store  *idem.Store
	proc   processor.Processor
	render Renderer
	log    *slog.Logger
	cfg    Config
}

// NewService wires a Service.
func NewService(pool *pgxpool.Pool, store *idem.Store, proc processor.Processor, render Renderer, log *slog.Logger, cfg Config) *Service {
	if cfg.SettleWindow <= 0 {
		cfg.SettleWindow = DefaultSettleWindow
	}
	return &Service{pool: pool, store: store, proc: proc, render: render, log: log, cfg: cfg}
}

// settleWindow is how long after a call was sent an empty lookup still
// proves nothing: the call may land for Config.SettleWindow, and once it
// landed the processor's lookups may miss it for LookupLag more (Stripe's
// Search API is eventually consistent). Until both have passed, a lookup
// that finds nothing is "not yet", never "no charge", and nothing is
// resent (S6, S7).
func (s *Service) settleWindow() time.Duration {
	return s.cfg.SettleWindow + s.proc.LookupLag()
}

// sweepDelay is how long after a payment's or refund's last call the sweep
// looks again: the settle window (lookup lag included: the sweep reads the
// same lookups) plus a margin for clock drift between us and the
// processor.
func (s *Service) sweepDelay() time.Duration {
	return s.settleWindow() + max(s.settleWindow()/10, time.Second)
}
