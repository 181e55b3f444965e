package simproc_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/tooling/processorcontract"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/webhook"
)

// The simulator's client passes the contract every adapter passes (S7),
// against the real simulator over HTTP.
func TestSimulatorClientPassesTheContract(t *testing.T) {
	sim := processorsim.New(processorsim.Config{})
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close)
	const secret = "whsec_contract"
	client := simproc.NewClient(srv.URL, 5*time.Second)

	processorcontract.Run(t, processorcontract.Harness{
		Processor: client,
		Approved:  processorsim.PaymentMethodVisa,
		Declined:  processorsim.PaymentMethodDeclined,
		Fail: func(t *testing.T, f processorcontract.Fault, req processor.ChargeRequest, key string) {
			switch f {
			case processorcontract.FaultRateLimited:
				sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultStatus, Status: 429})
			case processorcontract.FaultUnauthorized:
				sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultStatus, Status: 401})
			case processorcontract.FaultServerError:
				sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultServerError})
			case processorcontract.FaultKeyInUse:
				// A real call in flight under the key: held by the
				// simulator, so the next one with the key gets its 409.
				sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultLatency, Latency: 2 * time.Second})
				before := len(sim.Calls())
				go func() { _, _ = client.CreateCharge(t.Context(), req, key) }()
				for deadline := time.Now().Add(10 * time.Second); len(sim.Calls()) == before; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the call held in flight never reached the simulator")
					}
				}
			}
		},
		Deliver: func(t *testing.T, ch processor.Charge) ([]byte, http.Header) {
			ev := processor.Event{ID: "evt_contract_" + ch.ID, Object: "event", Type: processor.EventChargeSucceeded, Created: time.Now().Unix()}
			// The simulator's event carries the charge as it records it.
			for _, c := range sim.Charges() {
				if c.ID == ch.ID {
					ev.Data.Object = c
				}
			}
			payload, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			return payload, http.Header{webhook.Header: {webhook.Sign(payload, time.Now(), secret)}}
		},
		Verifier: webhook.Verifier{Secrets: []string{secret}},
	})
}
