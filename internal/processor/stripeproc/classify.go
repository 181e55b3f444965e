package stripeproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/idemref/payments/internal/processor"
)

// ShouldRetryHeader is Stripe's hint whether a resend with the same key
// may get another answer.
const ShouldRetryHeader = "Stripe-Should-Retry"

// answer is what the transport saw of one call's last HTTP exchange:
// stripe-go hides the status and headers of an answer it cannot parse,
// and classify needs both.
type answer struct {
	status int
	header http.Header
}

type answerKey struct{}

// withAnswer gives ctx a slot for the answer of the call made with it.
func withAnswer(ctx context.Context) (context.Context, *answer) {
	a := &answer{}
	return context.WithValue(ctx, answerKey{}, a), a
}

// recorder fills the answer slot of the request's context.
type recorder struct{ next http.RoundTripper }

func (r recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if a, ok := req.Context().Value(answerKey{}).(*answer); ok && resp != nil {
		a.status, a.header = resp.StatusCode, resp.Header
	}
	return resp, err
}

// noResend keeps net/http from resending a request on its own: it
// resends a POST that carries an Idempotency-Key when a reused connection
// closes before the answer, which would hide a lost answer from the
// classification. Without GetBody it cannot (as in simproc.Client).
type noResend struct{ next http.RoundTripper }

func (n noResend) RoundTrip(req *http.Request) (*http.Response, error) {
	r := *req
	r.GetBody = nil
	return n.next.RoundTrip(&r)
}

// classified turns err, the result of one stripe-go call whose exchange
// ans recorded, into the processor package's vocabulary: nil, a
// *processor.DeclineError or *processor.RequestError (final), or a
// *processor.UnsettledError. See the table in the package documentation.
func classified(op string, ans *answer, err error) error {
	if err == nil {
		return nil
	}
	var decline *processor.DeclineError
	if errors.As(err, &decline) {
		return decline
	}
	var se *stripe.Error
	isStripe := errors.As(err, &se)
	if ans.status == 0 {
		// No HTTP answer: stripe-go's api_connection_error. Only a refused
		// connection proves nothing was sent.
		return &processor.UnsettledError{Class: processor.SendFailureClass(err), Op: op, Err: err}
	}
	if !isStripe {
		se = nil
	}
	class, ours := classify(ans.status, ans.header, se)
	if ours {
		return processor.MisconfiguredError(op, ans.status)
	}
	if class != processor.ClassFinal || ans.status < 300 {
		if class == processor.ClassFinal {
			// A 2xx that did not read as a complete object: executed, but
			// what it was is unknown.
			class = processor.ClassOutcomeUnknown
		}
		return &processor.UnsettledError{Class: class, Op: op, Status: ans.status, RetryAfter: retryAfter(ans.header), Err: err}
	}
	if ans.status == http.StatusPaymentRequired {
		d := &processor.DeclineError{Code: processor.CodeCardDeclined}
		if se != nil {
			d.Code, d.DeclineCode, d.Message, d.ChargeID = string(se.Code), string(se.DeclineCode), se.Msg, se.ChargeID
			if se.PaymentIntent != nil && se.PaymentIntent.ID != "" {
				// The charge, in the payment machine's words, is the
				// PaymentIntent; se.ChargeID names Stripe's ch_ object.
				d.ChargeID = se.PaymentIntent.ID
			}
		}
		return d
	}
	re := &processor.RequestError{Status: ans.status, Message: err.Error()}
	if se != nil {
		re.Type, re.Code, re.Message = string(se.Type), string(se.Code), se.Msg
	}
	return re
}

// classify is the one classification of Stripe's answers (S6, S7): status
// and headers of the HTTP answer, and its error object when it had one
// (nil otherwise). Only ClassFinal may complete a key or fail a payment.
// ours says the answer refused our own configuration (S8,
// processor.Misconfigured): then the class is ClassNotExecuted.
func classify(status int, h http.Header, se *stripe.Error) (class processor.Class, ours bool) {
	var code string
	if se != nil {
		code = string(se.Code)
	}
	switch {
	case status >= 200 && status < 300:
		return processor.ClassFinal, false
	case status == http.StatusTooManyRequests:
		// rate_limit, or lock_timeout on a contended object: refused
		// before anything ran.
		return processor.ClassNotExecuted, false
	case status == http.StatusConflict:
		// A request with this key is still running: this one did nothing,
		// that one may yet succeed.
		return processor.ClassOutcomeUnknown, false
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status >= 500:
		// Stripe may have started; a 500 is even replayed to the same key,
		// so only a lookup tells. Stripe-Should-Retry changes nothing here.
		return processor.ClassOutcomeUnknown, false
	case processor.Misconfigured(status, code):
		// 401 Invalid API Key, 403 a restricted key's missing permission,
		// 404 Unrecognized request URL: our key or URL, refused before
		// anything ran. A retry executes once it is fixed.
		return processor.ClassNotExecuted, true
	case se != nil && se.Type == stripe.ErrorTypeIdempotency:
		// The key was first used with other parameters: whatever ran under
		// it is not what this answer says. Look it up.
		return processor.ClassOutcomeUnknown, false
	case h.Get(ShouldRetryHeader) == "true":
		// Stripe says a resend may be answered otherwise: this answer is
		// not the outcome.
		return processor.ClassOutcomeUnknown, false
	case status >= 400:
		return processor.ClassFinal, false // a decline (402), or the request itself is wrong
	}
	return processor.ClassOutcomeUnknown, false // 1xx, 3xx: not part of the API
}

// retryAfter reads Retry-After in seconds, 0 when absent or unreadable.
func retryAfter(h http.Header) time.Duration {
	if h == nil {
		return 0
	}
	if secs, err := strconv.Atoi(h.Get("Retry-After")); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second
	}
	return 0
}

// errorf is the error of a webhook that is signed but no event.
func errorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{processor.ErrBadEvent}, args...)...)
}
