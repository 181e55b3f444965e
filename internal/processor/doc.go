// Package processor is what the payment machine knows of a payment
// processor (requirement S7): the Processor interface, the charges,
// refunds and events it speaks of, the classes of an answer (S6), and
// what every adapter shares: the class of a call that got no answer
// (SendFailureClass), the refusal of our own configuration
// (Misconfigured, S8), the default timeout and the call metrics.
//
// Each adapter is a package of its own beside this one, and classifies its
// own answers: internal/processor/simproc (the simulator's HTTP API) and
// internal/processor/stripeproc (Stripe, through stripe-go). Neither
// imports the other (internal/tooling/repocheck
// TestProcessorAdaptersStandAlone); both pass the contract suite,
// internal/tooling/processorcontract.
//
// # What a class means (S6)
//
// Every answer is classified once, in its adapter, as final, not executed
// or outcome unknown (Class). The class, not the status code, decides what
// a caller may do next; only a final answer may complete an idempotency
// key or mark a payment failed.
//
// "Not executed" means this call did nothing; a call sent before it may
// still land. "Outcome unknown" means the charge may exist, may appear
// later (a processor keeps executing a call whose caller gave up), or
// another call with the same key is still running and may succeed. The only
// safe resend reuses the same idempotency key, and against a processor that
// ignores keys (S4) even that is safe only once the earlier call can no
// longer land: see docs/payments.md, "Unknown outcomes".
//
// An adapter never retries: retries, their budget and the decision to
// look up instead belong to the payment state machine (requirement S1).
package processor
