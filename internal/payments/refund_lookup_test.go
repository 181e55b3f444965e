package payments

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/processor"
)

// Suspicion b: a refund lookup reads every refund made under the key by
// its status. Only a succeeded one is a success; a pending one landed and
// may still succeed or fail, so nothing is final and nothing may be sent
// again (an error, never "nothing found"); only failed or canceled ones
// are a final failure. Real processors report failed and pending refunds (the
// simulator's never fail), so this is checked on the processor's answers
// directly.
func TestRefundFoundReadsEachStatus(t *testing.T) {
	t.Parallel()
	re := func(id, status string) processor.Refund {
		return processor.Refund{ID: id, Object: "refund", Charge: "ch_1", Amount: 100, Status: status}
	}
	type got struct {
		Pending  bool
		Nothing  bool
		Refund   string
		Rejected string
		Extra    bool
	}
	describe := func(o *refundOutcome, err error) got {
		switch {
		case errors.Is(err, errRefundPending):
			return got{Pending: true}
		case err != nil:
			t.Fatalf("refundFound: %v", err)
		case o == nil:
			return got{Nothing: true}
		case o.rejected != nil:
			return got{Rejected: o.rejected.Code}
		}
		return got{Refund: o.refund.ID, Extra: o.extra}
	}
	tests := []struct {
		name string
		in   []processor.Refund
		want got
	}{
		{"None", nil, got{Nothing: true}},
		{"Succeeded", []processor.Refund{re("re_1", processor.StatusSucceeded)}, got{Refund: "re_1"}},
		{"FailedIsAFailureNeverASuccess", []processor.Refund{re("re_1", processor.StatusFailed)}, got{Rejected: "refund_failed"}},
		{"CanceledIsAFailure", []processor.Refund{re("re_1", processor.StatusCanceled)}, got{Rejected: "refund_canceled"}},
		{"PendingIsNotFinalAndNoResend", []processor.Refund{re("re_1", processor.StatusPending)}, got{Pending: true}},
		{"PendingBesideFailedIsNotFinal", []processor.Refund{re("re_1", processor.StatusFailed), re("re_2", processor.StatusPending)}, got{Pending: true}},
		{"FailedThenSucceeded", []processor.Refund{re("re_1", processor.StatusFailed), re("re_2", processor.StatusSucceeded)}, got{Refund: "re_2"}},
		{"TwoSucceeded", []processor.Refund{re("re_1", processor.StatusSucceeded), re("re_2", processor.StatusSucceeded)}, got{Refund: "re_1", Extra: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, describe(refundFound(tt.in))); diff != "" {
				t.Errorf("refundFound (-want +got):\n%s", diff)
			}
		})
	}
}
