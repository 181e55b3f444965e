package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemref/payments/internal/tooling/harness"
)

// The operator's view of one deployment (X6): a real Prometheus scrapes
// every API process's admin listener each scrapeEvery and evaluates the
// rules of deploy/prometheus/alerts.yml, time-scaled (scaleRules), against
// a real Alertmanager, whose webhook receiver is the harness: what it
// records is what a person on call would have been paged with.
const (
	scrapeEvery = time.Second
	// apiJob is the API's job name: the rules' up and absent alerts
	// select it.
	apiJob = "payments-api"
)

// monitor is one deployment's Prometheus, its Alertmanager and the
// receiver of Alertmanager's notifications.
type monitor struct {
	prom, am *harness.Process
	promURL  string
	recv     *http.Server
	pages    *pageLog
}

// waitReady polls url until it answers 200, p exits or ctx ends.
func waitReady(ctx context.Context, p *harness.Process, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("exited; its log:\n%s", harness.Tail(p.LogPath))
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w; its log:\n%s", ctx.Err(), harness.Tail(p.LogPath))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

const prometheusConfig = `global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
rule_files: [%[2]q]
alerting:
  alertmanagers:
    - static_configs:
        - targets: [%[3]q]
scrape_configs:
  - job_name: %[4]s
    static_configs:
      - targets: [%[5]s]
`

// Each alert is its own group, notified at once and again on every
// change, resolutions included: the receiver sees each alert fire and
// resolve within a second of Prometheus saying so.
const alertmanagerConfig = `route:
  receiver: harness
  group_by: ['...']
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 24h
receivers:
  - name: harness
    webhook_configs:
      - url: %q
        send_resolved: true
`

// startMonitor starts the monitor of the API processes whose admin
// listeners are targets, in dir; broken, when set, is the rule it
// misspells on purpose.
func startMonitor(ctx context.Context, dir string, targets []string, broken *brokenRule) (m *monitor, err error) {
	root, err := harness.ModuleRoot()
	if err != nil {
		return nil, err
	}
	rules, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		return nil, err
	}
	scaled, err := scaleRules(rules, timeScale)
	if err != nil {
		return nil, fmt.Errorf("scale deploy/prometheus/alerts.yml: %w", err)
	}
	if broken != nil {
		if scaled, err = breakRule(scaled, *broken); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rulesPath := filepath.Join(dir, "alerts.scaled.yml")
	if err := os.WriteFile(rulesPath, scaled, 0o644); err != nil {
		return nil, err
	}
	m = &monitor{pages: &pageLog{}}
	defer func() {
		if err != nil {
			m.stop()
		}
	}()
	recvAddr, err := m.startReceiver()
	if err != nil {
		return m, err
	}
	amAddr, err := freeAddr()
	if err != nil {
		return m, err
	}
	amConfig := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(amConfig, fmt.Appendf(nil, alertmanagerConfig, "http://"+recvAddr+"/alerts"), 0o644); err != nil {
		return m, err
	}
	if m.am, err = harness.Spawn(dir, "alertmanager", "prometheus-alertmanager", []string{
		"--config.file=" + amConfig, "--storage.path=" + filepath.Join(dir, "alertmanager"),
		"--web.listen-address=" + amAddr, "--cluster.listen-address=", "--log.level=warn"}, nil); err != nil {
		return m, err
	}
	if err := waitReady(ctx, m.am, "http://"+amAddr+"/-/ready"); err != nil {
		return m, fmt.Errorf("alertmanager: %w", err)
	}
	promAddr, err := freeAddr()
	if err != nil {
		return m, err
	}
	quoted := make([]string, len(targets))
	for i, t := range targets {
		quoted[i] = fmt.Sprintf("%q", t)
	}
	promConfig := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(promConfig, fmt.Appendf(nil, prometheusConfig, scrapeEvery, rulesPath, amAddr, apiJob, strings.Join(quoted, ", ")), 0o644); err != nil {
		return m, err
	}
	// resend-delay: an alert still firing is sent again this often, so
	// that Alertmanager never times it out between two evaluations.
	if m.prom, err = harness.Spawn(dir, "prometheus", "prometheus", []string{
		"--config.file=" + promConfig, "--storage.tsdb.path=" + filepath.Join(dir, "prometheus"),
		"--web.listen-address=" + promAddr, "--rules.alert.resend-delay=" + scrapeEvery.String(), "--log.level=warn"}, nil); err != nil {
		return m, err
	}
	m.promURL = "http://" + promAddr
	if err := waitReady(ctx, m.prom, m.promURL+"/-/ready"); err != nil {
		return m, fmt.Errorf("prometheus: %w", err)
	}
	return m, nil
}

// startReceiver serves Alertmanager's webhook on a free address.
func (m *monitor) startReceiver() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /alerts", func(w http.ResponseWriter, r *http.Request) {
		var n notification
		if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m.pages.record(time.Now(), n)
	})
	m.recv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = m.recv.Serve(l) }()
	return l.Addr().String(), nil
}

func (m *monitor) stop() {
	if m == nil {
		return
	}
	for _, p := range []*harness.Process{m.prom, m.am} {
		if p != nil {
			p.Stop()
		}
	}
	if m.recv != nil {
		_ = m.recv.Close()
	}
}

// settle waits until Prometheus has scraped every one of n targets and
// found it up, then until nothing fires or is pending, and starts the
// page log afresh: what fired while the monitor itself started is shown
// in the returned list and not judged. Prometheus publishes the targets
// it discovered up to 5 s after it starts, which absent() reads, on the
// harness's clock, as five minutes without a process: an artifact of
// starting Prometheus after the service, never of the service.
func (m *monitor) settle(ctx context.Context, n int) (startup []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	up := false
	var quietSince time.Time
	for {
		if !up {
			up = m.countQuery(ctx, fmt.Sprintf("up{job=%q}==1", apiJob)) == n
		}
		switch {
		case !up || m.countQuery(ctx, "ALERTS") != 0 || m.pages.anyFiring():
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) >= quietFor:
			// Quiet long enough for a notification Alertmanager was
			// still sending to have arrived.
			startup = m.pages.names()
			m.pages.reset()
			return startup, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the deployment did not settle within 60s (every process up: %v; alerts seen: %q)", up, m.pages.names())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// quietFor is how long nothing may fire or be pending before a
// scenario's clock starts: two of Alertmanager's group intervals.
const quietFor = 2 * time.Second

// countQuery is how many series an instant query returns; -1 when it
// fails.
func (m *monitor) countQuery(ctx context.Context, query string) int {
	var res struct {
		Data struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := getJSON(ctx, m.promURL+"/api/v1/query?query="+url.QueryEscape(query), &res); err != nil {
		return -1
	}
	return len(res.Data.Result)
}

// notification is the part of Alertmanager's webhook payload the
// harness reads.
type notification struct {
	Alerts []struct {
		Status      string            `json:"status"` // firing or resolved
		Labels      map[string]string `json:"labels"`
		Fingerprint string            `json:"fingerprint"`
	} `json:"alerts"`
}

// pageLog is every alert Alertmanager notified, by name: when it first
// fired, which of its instances fire now, when the last one resolved.
type pageLog struct {
	mu     sync.Mutex
	alerts map[string]*alertSeen
}

type alertSeen struct {
	firstFired time.Time
	firing     map[string]bool // by fingerprint
	resolvedAt time.Time       // zero while an instance fires
}

func (p *pageLog) record(at time.Time, n notification) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.alerts == nil {
		p.alerts = map[string]*alertSeen{}
	}
	for _, a := range n.Alerts {
		name := a.Labels["alertname"]
		s := p.alerts[name]
		if s == nil {
			if a.Status != "firing" {
				continue // resolved before the log began
			}
			s = &alertSeen{firstFired: at, firing: map[string]bool{}}
			p.alerts[name] = s
		}
		if a.Status == "firing" {
			s.firing[a.Fingerprint] = true
			s.resolvedAt = time.Time{}
		} else if s.firing[a.Fingerprint] {
			delete(s.firing, a.Fingerprint)
			if len(s.firing) == 0 {
				s.resolvedAt = at
			}
		}
	}
}

// snapshot copies what was seen, by alert name.
func (p *pageLog) snapshot() map[string]alertSeen {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]alertSeen, len(p.alerts))
	for name, s := range p.alerts {
		out[name] = alertSeen{firstFired: s.firstFired, resolvedAt: s.resolvedAt, firing: map[string]bool{}}
		for f := range s.firing {
			out[name].firing[f] = true
		}
	}
	return out
}

// anyFiring: an alert notified as firing has not resolved since.
func (p *pageLog) anyFiring() bool {
	for _, s := range p.snapshot() {
		if len(s.firing) > 0 {
			return true
		}
	}
	return false
}

// reset forgets everything recorded.
func (p *pageLog) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.alerts = nil
}

// waitResolved waits until every alert seen has resolved, or ctx ends.
func (p *pageLog) waitResolved(ctx context.Context) {
	for ctx.Err() == nil && p.anyFiring() {
		sleep(ctx, 250*time.Millisecond)
	}
}

// names lists the alerts seen, sorted.
func (p *pageLog) names() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for name := range p.alerts {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
