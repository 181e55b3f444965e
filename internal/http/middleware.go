package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/idemref/payments/internal/clientaddr"
	"github.com/idemref/payments/internal/tenants"
)

type ctxKey int

const (
	ctxLogger ctxKey = iota
	// ctxProblemCode holds a *string where writeError leaves the code of
	// the problem it answered, for the access log line.
	ctxProblemCode
	ctxTenant
)

// RequestIDHeader carries the request id on every response.
const RequestIDHeader = "X-Request-Id"

func loggerFrom(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(ctxLogger).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

func tenantFrom(ctx context.Context) uuid.UUID {
	id, _ := ctx.Value(ctxTenant).(uuid.UUID)
	return id
}

// statusRecorder remembers the status for the access log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

// Unwrap lets http.ResponseController reach the connection (read
// deadlines, flushes) through the recorder.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// requestContext gives every request an id (a well-formed incoming
// X-Request-Id is kept, so ids follow a request across services), a logger
// carrying it, a deadline, an access log line and panic recovery. Request
// bodies, API keys and idempotency keys are never logged.
func requestContext(base *slog.Logger, timeout time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			id := r.Header.Get(RequestIDHeader)
			if !validRequestID(id) {
				id = newRequestID()
			}
			w.Header().Set(RequestIDHeader, id)
			// R2: no response of this API is ever to be sniffed into
			// another content type.
			w.Header().Set("X-Content-Type-Options", "nosniff")
			logger := base.With(slog.String("request_id", id))
			var problemCode string
			ctx := context.WithValue(r.Context(), ctxLogger, logger)
			ctx = context.WithValue(ctx, ctxProblemCode, &problemCode)
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			r = r.WithContext(ctx)
			rec := &statusRecorder{ResponseWriter: w}

			defer func() {
				if v := recover(); v != nil {
					if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
						panic(v)
					}
					logger.ErrorContext(ctx, "panic", slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
					if rec.status == 0 {
						writeError(rec, r, errors.New("panic"))
					}
				}
				route := chi.RouteContext(r.Context()).RoutePattern()
				nameSpan(ctx, r.Method, route)
				elapsed := time.Since(start)
				observeRequest(route, r.Method, rec.status, elapsed)
				attrs := []slog.Attr{
					slog.String("method", r.Method),
					slog.String("route", route),
					slog.Int("status", rec.status),
					// Milliseconds with microsecond precision: a log reader
					// compares them at a glance, unlike nanosecond integers.
					slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
					slog.Bool("replayed", rec.Header().Get(ReplayedHeader) == "true"),
				}
				if problemCode != "" {
					attrs = append(attrs, slog.String("code", problemCode))
				}
				logger.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
			}()
			next.ServeHTTP(rec, r)
		})
	}
}

func validRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// bearerKey returns the key of the one "Authorization: Bearer <key>"
// header. Several Authorization headers are refused, never picked from: a
// proxy and a client disagreeing about which one counts is how requests
// get attributed to the wrong tenant. The scheme is case-insensitive and
// may be followed by one or more spaces (RFC 9110 section 11.4: 1*SP).
func bearerKey(values []string) (string, bool) {
	if len(values) != 1 {
		return "", false
	}
	scheme, rest, _ := strings.Cut(values[0], " ")
	key := strings.TrimLeft(rest, " ")
	return key, strings.EqualFold(scheme, "Bearer") && key != "" && !strings.ContainsAny(key, " \t")
}

// authError is a 401 with its challenge (RFC 6750 section 3): plain
// "Bearer" when no credentials came, error="invalid_request" when the
// Authorization header is malformed (several lines, another scheme, junk
// after the key), error="invalid_token" when the key is unknown or revoked.
type authError struct{ challenge string }

func (e *authError) Error() string { return tenants.ErrUnauthenticated.Error() }
func (e *authError) Unwrap() error { return tenants.ErrUnauthenticated }

// authenticate resolves the bearer key to a tenant before anything else
// runs, so an unauthenticated request never reaches the idempotency layer.
// A failed lookup (database down) fails closed with 503.
func (a *api) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		values := r.Header.Values("Authorization")
		key, ok := bearerKey(values)
		switch {
		case len(values) == 0:
			writeError(w, r, &authError{challenge: `Bearer`})
			return
		case !ok:
			writeError(w, r, &authError{challenge: `Bearer error="invalid_request"`})
			return
		}
		tenantID, found, err := a.auth.Cached(key)
		if !found {
			tenantID, err = a.lookUp(r, key)
		}
		switch {
		case errors.Is(err, tenants.ErrUnauthenticated):
			writeError(w, r, &authError{challenge: `Bearer error="invalid_token"`})
			return
		case err != nil:
			writeError(w, r, err)
			return
		}
		ctx := context.WithValue(r.Context(), ctxTenant, tenantID)
		ctx = context.WithValue(ctx, ctxLogger, loggerFrom(ctx).With(slog.String("tenant_id", tenantID.String())))
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// lookUp asks the database for the tenant of a key the cache does not
// know. Only the database can tell, at the price of a query. Each lookup is
// charged to the client, and to every client together, before it runs, and
// kept only if it found no tenant; a client past its budget, or a
// suspect one past the total, is answered before any query. A key that
// authenticates costs nothing, so only a flood of keys nobody knows is held
// back, whatever AUTH_CACHE_TTL. The client is the one behind a trusted
// proxy, never the proxy (internal/clientaddr): behind a balancer, one
// abusive client must not spend every tenant's budget.
func (a *api) lookUp(r *http.Request, key string) (tenantID uuid.UUID, err error) {
	turn, err := a.authLookups.begin(r.Context(), clientaddr.Key(a.clients.Client(r)))
	var throttled *authThrottledError
	if errors.As(err, &throttled) {
		authLookupsRefusedTotal.Inc()
	}
	if err != nil {
		return uuid.Nil, err
	}
	var found bool
	// Ended however the lookup ends, a panic included: a turn never ended
	// would hold every later lookup of the client.
	defer func() { turn.end(!found && errors.Is(err, tenants.ErrUnauthenticated)) }()
	// The lookup this request waited behind may have cached its key.
	if tenantID, found, err = a.auth.Cached(key); !found {
		tenantID, err = a.auth.Authenticate(r.Context(), key)
	}
	return tenantID, err
}

// noStore marks every response under /v1 Cache-Control: no-store (R2):
// payment data must not be kept by intermediaries, and a cached answer
// served to a retry in place of ours would defeat the idempotency record.
// Replays keep it too: their recorded headers never include Cache-Control
// for success responses, and problems record no-store themselves.
func noStore(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}
