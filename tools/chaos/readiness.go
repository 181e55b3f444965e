package main

import (
	"context"
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
