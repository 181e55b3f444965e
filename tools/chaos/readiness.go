package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// readinessProbe asks one API process's /readyz every 100 ms, as a load
// balancer's health check would, and totals how long it answered 503:
// the API must report a database outage while it lasts (D1), and only
// while it lasts.
type readinessProbe struct {
	mu       sync.Mutex
	notReady time.Duration
}

const readinessInterval = 100 * time.Millisecond

// probeReadiness runs until ctx is done.
func probeReadiness(ctx context.Context, baseURL string) *readinessProbe {
	p := &readinessProbe{}
	client := &http.Client{Timeout: time.Second}
	go func() {
		t := time.NewTicker(readinessInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			p.probe(ctx, client, baseURL)
		}
	}()
	return p
}

func (p *readinessProbe) probe(ctx context.Context, client *http.Client, baseURL string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/readyz", nil)
	if err != nil {
		return
	}
	resp, err := client.Do(req)
	if err != nil {
		return // the process is down (killed) or overloaded: not its answer
	}
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable {
		p.mu.Lock()
		p.notReady += readinessInterval
		p.mu.Unlock()
	}
}

// NotReady is about how long /readyz answered 503 (to the probe's
// interval).
func (p *readinessProbe) NotReady() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.notReady
}

// waitEventsFlowing waits until every API process's /readyz answers 200
// with events flowing: its streams and consumer set up on the cluster.
// A three-node cluster takes seconds to create streams of three
// replicas; a scenario's clock, and the monitor's, start on a deployment
// that has settled, not on one still starting.
func waitEventsFlowing(ctx context.Context, baseURLs []string) error {
	ctx, cancel := context.WithTimeout(ctx, natsSettle)
	defer cancel()
	for _, u := range baseURLs {
		for {
			var body struct {
				Events string `json:"events"`
			}
			err := getJSON(ctx, u+"/readyz", &body)
			if err == nil && body.Events == "flowing" {
				break
			}
			if ctx.Err() != nil {
				if err == nil {
					err = fmt.Errorf("events %q", body.Events)
				}
				return fmt.Errorf("%s: events not flowing within %s: %w", u, natsSettle, err)
			}
			sleep(ctx, 200*time.Millisecond)
		}
	}
	return nil
}
