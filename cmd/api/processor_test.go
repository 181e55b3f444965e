package main

import (
	"testing"

	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/tooling/stripefake"
)

// PROCESSOR=stripe wires the Stripe adapter with the key and URL set: the
// charge reaches Stripe's (recorded) API, authenticated with that key.
func TestStripeProcessorIsWiredFromTheEnvironment(t *testing.T) {
	t.Parallel()
	fake := stripefake.Start(t)
	env := map[string]string{"PROCESSOR": "stripe", "STRIPE_API_KEY": "sk_test_wired", "STRIPE_API_URL": fake.URL}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	proc := newProcessor(cfg)
	ch, err := proc.CreateCharge(t.Context(), processor.ChargeRequest{Amount: 700, Currency: "EUR", PaymentMethod: stripefake.PaymentMethodVisa}, "wired-key")
	if err != nil {
		t.Fatal(err)
	}
	intents := fake.PaymentIntents()
	if len(intents) != 1 || intents[0].ID != ch.ID || intents[0].Metadata["idempotency_key"] != "wired-key" {
		t.Errorf("Stripe has %+v, want the one PaymentIntent %s under wired-key", intents, ch.ID)
	}
	if got := proc.LookupLag(); got != cfg.StripeSearchLag || got <= 0 {
		t.Errorf("LookupLag = %s, want STRIPE_SEARCH_LAG's %s", got, cfg.StripeSearchLag)
	}
}
