package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/idemref/payments/internal/tooling/processorsim"
)

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of
// latencies: the smallest value at least p percent of them do not
// exceed. Zero for none.
func Percentile(latencies []time.Duration, p float64) time.Duration {
	if len(latencies) == 0 {
		return 0
	}
	v := slices.Sorted(slices.Values(latencies))
	rank := int(math.Ceil(p / 100 * float64(len(v))))
	return v[max(rank, 1)-1]
}

// ProcessorCalls reads every call the processor simulator at
// processorURL recorded (GET /_sim/calls): what a benchmark or a checker
// holds the service's records against.
func ProcessorCalls(ctx context.Context, processorURL string) ([]processorsim.Call, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, processorURL+"/_sim/calls", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("processor calls: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("processor calls: %s", res.Status)
	}
	var v struct {
		Data []processorsim.Call `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		return nil, fmt.Errorf("processor calls: %w", err)
	}
	return v.Data, nil
}
