package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// G4: SIGTERM under load loses nothing. Clients create orders, each with
// its own sequence of keys, against one `api serve`; a client that is
// turned away (a 503, or a connection closed before any answer) retries
// the same key against a second process on the same database, and stays
// there. Meanwhile the first process gets SIGTERM. Every request must end
// in a success or a retryable answer, and once the retries have landed
// every acknowledged order exists exactly once.
//
// That much an idempotent API gives even when the process dies at once;
// a drain gives two things more, checked by their side effects:
//
//   - /readyz answered 503 while /v1 was still served: a request sent
//     after a 503 of /readyz was received got its 201 from the draining
//     process (the balancer's probe sees the process leave while what it
//     still sends is served), and with Connection: close, so that a
//     client on a keep-alive connection comes back through the balancer;
//   - every request the draining process took in was answered by it: no
//     client had to learn its order from a replay. The process answers
//     each create 200 ms after its commit (a failpoint), so requests are
//     committed and unanswered whenever the signal comes and when the
//     listener closes; a process that exits at once leaves them
//     unanswered, and their retries are replays.
func TestSIGTERMDrainsUnderLoadAndLosesNothing(t *testing.T) {
	t.Parallel()
	const clients = 6
	pool, url := testdb.NewPool(t)
	apiKey := runTenantCreate(t, url, "drain")
	// The clients send as fast as they are answered: no rate limit.
	draining := startServer(t, url, "RATE_LIMIT_RPS=0", "SHUTDOWN_GRACE=2s", "FAILPOINTS=idem-after-commit=sleep:200ms")
	other := startServer(t, url, "RATE_LIMIT_RPS=0")

	load := &drainLoad{apiKey: apiKey, draining: draining.base, other: other.base,
		acked: map[string]string{}, outcomes: map[string]int{}, stop: make(chan struct{})}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() { load.client(c) })
	}
	t.Cleanup(func() {
		load.halt()
		wg.Wait()
	})
	testkit.WaitFor(t, 30*time.Second, func() bool { return load.ackCount() >= 3*clients })

	// The balancer's view: /readyz, polled on fresh connections until the
	// listener is gone.
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		load.probe()
	}()
	signalled := time.Now()
	if err := draining.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-draining.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the process did not exit within 60s of SIGTERM")
	}
	took := time.Since(signalled)
	<-probeDone
	// The retries land on the other process; then every client finishes
	// the key in hand and stops.
	acked := load.ackCount()
	testkit.WaitFor(t, 30*time.Second, func() bool { return load.ackCount() >= acked+3*clients })
	load.halt()
	wg.Wait()

	load.mu.Lock()
	defer load.mu.Unlock()
	t.Logf("SIGTERM to exit: %s (grace 2s); outcomes %v; /readyz 503 %d times; %d creates served by the draining process after a 503 of /readyz",
		took.Round(10*time.Millisecond), load.outcomes, load.notReady.Load(), load.servedAfterNotReady.Load())
	if code := draining.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0 (the drain ran to its end)", code)
	}
	draining.mu.Lock()
	logs := draining.logs.String()
	draining.mu.Unlock()
	if !strings.Contains(logs, `"msg":"stopped"`) {
		t.Errorf("the draining process did not log that it stopped")
	}
	for _, u := range load.unexpected {
		t.Errorf("not a success nor a retryable answer: %s", u)
	}
	if load.notReady.Load() == 0 {
		t.Errorf("/readyz never answered 503 with Retry-After after SIGTERM: the process left without telling the balancer")
	}
	if load.servedAfterNotReady.Load() == 0 {
		t.Errorf("no create sent after /readyz answered 503 was served by the draining process: the listener closed without a grace for the balancer to stop sending")
	}
	if n := load.keptAlive.Load(); n > 0 {
		t.Errorf("%d creates served after /readyz answered 503 kept their connection alive: want Connection: close on every answer of the drain", n)
	}
	if n := load.outcomes["replayed"]; n > 0 {
		t.Errorf("%d creates got their order from a replay: the draining process committed them and never answered", n)
	}

	// Every acknowledged order, exactly once, and no order that was not
	// acknowledged: each key was retried until it was.
	rows, err := pool.Query(context.Background(), `SELECT reference, id::text FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	orders := map[string][]string{}
	for rows.Next() {
		var ref, id string
		if err := rows.Scan(&ref, &id); err != nil {
			t.Fatal(err)
		}
		orders[ref] = append(orders[ref], id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for key, id := range load.acked {
		if got := orders[key]; len(got) != 1 || got[0] != id {
			t.Errorf("order %s: acknowledged as %s, the database has %v", key, id, got)
		}
	}
	if len(orders) != len(load.acked) {
		t.Errorf("%d orders in the database, %d acknowledged", len(orders), len(load.acked))
	}
	t.Logf("%d orders acknowledged, each once in the database", len(load.acked))
}

// drainLoad is the clients of TestSIGTERMDrainsUnderLoadAndLosesNothing and
// what they saw.
type drainLoad struct {
	apiKey          string
	draining, other string // base URLs
	stop            chan struct{}
	stopOnce        sync.Once

	// notReady counts the 503s of the draining process's /readyz;
	// notReadySeen is set at the first.
	notReady     atomic.Int64
	notReadySeen atomic.Bool
	// servedAfterNotReady counts creates sent to the draining process
	// after notReadySeen, and answered 201 by it; keptAlive those of them
	// whose answer did not say Connection: close.
	servedAfterNotReady, keptAlive atomic.Int64

	mu         sync.Mutex
	acked      map[string]string // key (the order's reference too) -> order id
	outcomes   map[string]int
	unexpected []string
}

func (l *drainLoad) halt() { l.stopOnce.Do(func() { close(l.stop) }) }

func (l *drainLoad) ackCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// drainHTTP is the clients' HTTP client: keep-alive, as a real client's.
var drainHTTP = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}

// client sends creates, key after key, each until it is acknowledged: to
// the draining process until it turns the client away, then to the other.
func (l *drainLoad) client(c int) {
	target := l.draining
	for seq := 0; ; seq++ {
		select {
		case <-l.stop:
			return
		default:
		}
		key := fmt.Sprintf("drain-%d-%d", c, seq)
		body := fmt.Sprintf(`{"reference":%q,"customer_id":"cus_%d","amount":%d,"currency":"EUR"}`, key, c, 100+seq)
		for attempt := 1; ; attempt++ {
			afterNotReady := l.notReadySeen.Load()
			outcome, orderID, closing, detail := createOnce(target, l.apiKey, key, body)
			l.mu.Lock()
			l.outcomes[outcome]++
			switch outcome {
			case "created", "replayed":
				l.acked[key] = orderID
				if target == l.draining && afterNotReady {
					l.servedAfterNotReady.Add(1)
					if !closing {
						l.keptAlive.Add(1)
					}
				}
			case "unavailable", "closed":
			default:
				l.unexpected = append(l.unexpected, fmt.Sprintf("%s to %s, attempt %d: %s", key, target, attempt, detail))
			}
			l.mu.Unlock()
			if outcome == "created" || outcome == "replayed" || attempt == 20 {
				break
			}
			// Turned away: the same key, to the other process, from now on.
			target = l.other
		}
	}
}

// createOnce sends one create and says how it ended: created, replayed, or
// one of the retryable answers, unavailable (503 with Retry-After) and
// closed (the connection closed before any answer); anything else is
// unexpected, and detail says what it was. closing reports an answer with
// Connection: close.
func createOnce(base, apiKey, key, body string) (outcome, orderID string, closing bool, detail string) {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(body))
	if err != nil {
		return "unexpected", "", false, err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := drainHTTP.Do(req)
	if err != nil {
		// No status line: the connection was refused, or closed before
		// any byte of an answer.
		return "closed", "", false, err.Error()
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return "unexpected", "", res.Close, fmt.Sprintf("%d, then the answer was cut: %v", res.StatusCode, err)
	}
	switch {
	case res.StatusCode == http.StatusCreated:
		var o struct{ ID string }
		if err := json.Unmarshal(b, &o); err != nil || o.ID == "" {
			return "unexpected", "", res.Close, fmt.Sprintf("201 without an order: %s", b)
		}
		if res.Header.Get("Idempotent-Replayed") == "true" {
			return "replayed", o.ID, res.Close, ""
		}
		return "created", o.ID, res.Close, ""
	case res.StatusCode == http.StatusServiceUnavailable && res.Header.Get("Retry-After") != "":
		return "unavailable", "", res.Close, ""
	}
	return "unexpected", "", res.Close, fmt.Sprintf("%d %s", res.StatusCode, b)
}

// probe polls the draining process's /readyz on fresh connections, as a
// balancer's health check does, until its listener is gone.
func (l *drainLoad) probe() {
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		res, err := probe.Get(l.draining + "/readyz")
		if err != nil {
			return // the listener closed
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusServiceUnavailable && res.Header.Get("Retry-After") != "" {
			l.notReady.Add(1)
			l.notReadySeen.Store(true)
		}
		time.Sleep(20 * time.Millisecond) // the probe's period
	}
}

// G4: the drain is bounded. A request that outlasts SHUTDOWN_TIMEOUT (here
// it sleeps 30 s after its commit, the timeout is 1 s) does not hold the
// process: it exits, non-zero, with the request cut unanswered as a crash
// would cut it, and the client's retry on another process replays the
// committed order. So the process is gone before an orchestrator's grace
// period, however long the requests in flight.
func TestSIGTERMCutsWhatOutlastsTheShutdownTimeout(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	apiKey := runTenantCreate(t, url, "cut")
	stuck := startServer(t, url, "SHUTDOWN_GRACE=0", "SHUTDOWN_TIMEOUT=1s", "FAILPOINTS=idem-after-commit=sleep:30s")
	body := `{"reference":"cut-1","customer_id":"cus_1","amount":100,"currency":"EUR"}`
	done := make(chan error, 1)
	go func() {
		res, err := postOrder(stuck.base, apiKey, "cut-key", body)
		if err == nil {
			err = fmt.Errorf("answered %d: %s", res.status, res.body)
		}
		done <- err
	}()
	testkit.WaitFor(t, 20*time.Second, func() bool { return count(t, pool, `SELECT count(*) FROM orders`) == 1 })
	if err := stuck.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stuck.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the process did not exit within 20s of SIGTERM while a request outlasted SHUTDOWN_TIMEOUT")
	}
	if code := stuck.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit code = %d, want 1: a drain that cut a request says so", code)
	}
	if err := <-done; err == nil || strings.HasPrefix(err.Error(), "answered") {
		t.Errorf("the request that outlasted the timeout: %v, want its connection closed unanswered", err)
	}
	res, err := postOrder(startServer(t, url).base, apiKey, "cut-key", body)
	if err != nil || res.status != http.StatusCreated || res.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry: %v %d %s, want the committed order replayed", err, res.status, res.body)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 1 {
		t.Errorf("orders = %d, want 1", n)
	}
}
