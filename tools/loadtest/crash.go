package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/tooling/harness"
)

// The crash test, side by side (P8): for ours and for each peer, a process
// is killed after the order has committed and before the response is
// stored, a fresh process of the same kind takes the same request under
// the same key, and what the retry did is counted. Each party is killed at
// a crash point in its own code, armed for the run (kill by timing is not
// needed: every party has a place where the window is open):
//
//	ours         FAILPOINTS=idem-after-commit=kill, in idem.Store.Execute
//	             after COMMIT (the API built with -tags "loadtest failpoints")
//	claim-first  FAILPOINTS=claim-first-after-commit=kill, the same place in
//	             idem.Store.ExecuteClaimFirst
//	fiber        PEER_FAILPOINT=after-commit, at the end of the app's
//	             handler: the order has committed, and the middleware, which
//	             stores the response once the handler has returned, has not
//	             run that step yet
//
// A retry that replays the first answer is safe. A retry that runs the
// handler again is a duplicate execution: with the orders table's natural
// key (orders_tenant_reference_key, N1) the second insert finds the
// reference taken, so no second row is written and the retry is answered
// 409 order_reference_exists for the order its first attempt created; a write
// without such a key (a payment, a transfer) would be done twice. Both are
// counted: duplicate executions, and rows past one per key.

// codeReferenceExists is the problem code of an order whose reference is
// taken (httpapi.CodeReferenceExists; the Fiber peer answers the same).
const codeReferenceExists = "order_reference_exists"

// crashParty is one side of the crash test.
type crashParty struct {
	name string
	path string
	// start starts a process of the party, crashing at its crash point when
	// crash is set, and returns it with its base URL.
	start func(ctx context.Context, crash bool) (*harness.Process, string, error)
	// key mints a fresh Idempotency-Key the party accepts.
	key func() string
}

// crashResult is one party's trials.
type crashResult struct {
	trials     int
	replays    int // the retry got the first answer back
	duplicates int // the retry ran the handler again
	extraRows  int // orders past one per key
	answers    map[string]int
}

func crashParties(env *environment, l *load) []crashParty {
	api := func(name, failpoint string) func(context.Context, bool) (*harness.Process, string, error) {
		return func(ctx context.Context, crash bool) (*harness.Process, string, error) {
			vars := append([]string{"DATABASE_URL=" + env.apiDBURL, "COMPLETER_INTERVAL=0", "REAPER_INTERVAL=0", "EVENT_WORKERS=false"}, env.apiEnv...)
			if crash {
				vars = append(vars, "FAILPOINTS="+failpoint+"=kill")
			}
			p, addr, err := harness.StartProcess(ctx, env.workDir, "crash-"+name, env.crashAPIBin, []string{"serve"}, vars, "listening")
			return p, "http://" + addr, err
		}
	}
	fresh := func() string { return l.fresh("crash") }
	return []crashParty{
		{name: "ours", path: "/v1/orders", start: api("ours", "idem-after-commit"), key: fresh},
		{name: peerFiber, path: "/idem/orders", key: uuid.NewString,
			start: func(ctx context.Context, crash bool) (*harness.Process, string, error) {
				fp := ""
				if crash {
					fp = "after-commit"
				}
				p, addr, err := harness.StartProcess(ctx, env.workDir, "crash-fiber", env.fiberBin, nil, fiberEnv(env, fp), "listening")
				return p, "http://" + addr, err
			}},
		{name: peerClaimFirst, path: "/v1/_claimfirst/orders", start: api("claim-first", "claim-first-after-commit"), key: fresh},
	}
}

// crashTest runs trials crashes per party.
func crashTest(ctx context.Context, env *environment, l *load, trials int) (map[string]*crashResult, error) {
	out := map[string]*crashResult{}
	for _, party := range crashParties(env, l) {
		r := &crashResult{answers: map[string]int{}}
		out[party.name] = r
		for range trials {
			if err := crashOnce(ctx, l, party, r); err != nil {
				return out, fmt.Errorf("crash test, %s: %w", party.name, err)
			}
		}
	}
	// Ours must replay every time (T1): anything else fails the run. The
	// peers' figures are what they are.
	if r := out["ours"]; r.duplicates != 0 || r.extraRows != 0 || r.replays != r.trials {
		return out, fmt.Errorf("crash test, ours: %d of %d retries replayed, %d executed again, %d orders past one per key (%s); want every retry replayed",
			r.replays, r.trials, r.duplicates, r.extraRows, r.describe())
	}
	return out, nil
}

func crashOnce(ctx context.Context, l *load, party crashParty, r *crashResult) error {
	key, ref := party.key(), l.fresh("crash-ref")
	body := orderBody(ref)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	// send returns the answer's status, whether it was marked replayed,
	// and its body.
	send := func(base string) (int, bool, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+party.path, bytes.NewReader(body))
		if err != nil {
			return 0, false, nil, err
		}
		req.Header = l.headers(key)
		res, err := client.Do(req)
		if err != nil {
			return 0, false, nil, err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return res.StatusCode, res.Header.Get(replayedHeader) == "true", b, err
	}
	rows := func() (int, error) {
		return l.count(ctx, `SELECT count(*) FROM orders WHERE reference = $1`, ref)
	}

	crashing, base, err := party.start(ctx, true)
	if err != nil {
		return err
	}
	if code, _, b, err := send(base); err == nil {
		crashing.Kill()
		return fmt.Errorf("the first attempt was answered (%d %s): the crash point did not fire", code, truncate(b))
	}
	select {
	case <-crashing.Exited():
	case <-time.After(10 * time.Second):
		crashing.Kill()
		return fmt.Errorf("the process did not die at its crash point")
	}
	if n, err := rows(); err != nil {
		return err
	} else if n != 1 {
		return fmt.Errorf("%d orders after the crash, want 1: the crash was not after the commit", n)
	}

	restarted, base, err := party.start(ctx, false)
	if err != nil {
		return err
	}
	defer restarted.Stop()
	code, replayed, b, err := send(base)
	if err != nil {
		return fmt.Errorf("the retry: %w", err)
	}
	n, err := rows()
	if err != nil {
		return err
	}
	var problem struct{ Code string }
	_ = json.Unmarshal(b, &problem)
	answer := strconv.Itoa(code)
	switch {
	case code == http.StatusCreated && replayed:
		answer += " replayed"
		r.replays++
	case code == http.StatusCreated:
		answer += " executed again"
		r.duplicates++
	case code == http.StatusConflict && problem.Code == codeReferenceExists:
		answer += " " + problem.Code
		r.duplicates++ // the handler ran again and met the natural key
	default:
		return fmt.Errorf("the retry was answered %d %s", code, truncate(b))
	}
	r.answers[answer]++
	r.extraRows += n - 1
	r.trials++
	return nil
}
