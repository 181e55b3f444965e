package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tooling/testdb"
)

// The banner of api dev (make run) says what applies to the processor it
// runs with: the simulator's URL and export SIM= line under the simulator;
// under Stripe no simulator line and no SIM (Stripe has no /_sim), but
// Stripe's URL, that a URL other than Stripe's is a mock that declines
// every payment, and how its webhooks reach the API.
func TestDevBannerFitsTheProcessor(t *testing.T) {
	t.Parallel()
	stripeURL := "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	tests := []struct {
		name       string
		env        []string
		want       []string
		wantNoneOf []string
	}{
		{"Simulator", nil,
			[]string{"Processor simulator on http://127.0.0.1:", "  export SIM=http://127.0.0.1:", "The processor's signed webhooks arrive at"},
			[]string{"Stripe"}},
		{"Stripe", []string{"PROCESSOR=stripe", "STRIPE_API_KEY=sk_test_banner", "STRIPE_API_URL=" + stripeURL},
			[]string{"Processor: Stripe at " + stripeURL + " ", "not Stripe's servers: a mock such as stripe-mock, whose fixed answers decline every payment", "stripe listen --forward-to $API/v1/webhooks/processor"},
			[]string{"SIM", "simulator", "_sim", "Processor simulator on ", "sk_test_banner"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := append([]string{"DATABASE_URL=" + testdb.New(t), "ADDR=127.0.0.1:0"}, tt.env...)
			out, ready := runUntilReady(t, "dev", env)
			banner, _, _ := strings.Cut(out, "Press Ctrl-C to stop.")
			if !ready {
				t.Fatalf("api dev printed no banner:\n%s", out)
			}
			// The banner only: the log lines are JSON, each starting {.
			var lines []string
			for line := range strings.Lines(banner) {
				if !strings.HasPrefix(line, "{") {
					lines = append(lines, line)
				}
			}
			banner = strings.Join(lines, "")
			for _, want := range tt.want {
				if !strings.Contains(banner, want) {
					t.Errorf("the banner lacks %q:\n%s", want, banner)
				}
			}
			for _, unwanted := range tt.wantNoneOf {
				if strings.Contains(banner, unwanted) {
					t.Errorf("the banner says %q:\n%s", unwanted, banner)
				}
			}
		})
	}
}
