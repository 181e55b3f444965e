package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idemref/payments/internal/tooling/pgwire"
)

// probe measures what single requests cost at the wire: it talks to its
// own API process, whose pool goes through the counting proxy, one request
// at a time, so every round trip the proxy sees belongs to that request.
// The load API does not go through the proxy: an extra hop per round trip
// would tax the chattier path more and bend the ratios.
type probe struct {
	base   string
	apiKey string
	proxy  *pgwire.Proxy
	load   *load // for fresh names and headers
	client *http.Client
}

// cost is one kind of request's round trips and statements over samples.
type cost struct {
	roundTrips, statements series
	// recorded is the statement list of the last sample.
	recorded []pgwire.Statement
}

func (c *cost) add(n pgwire.Counts, recorded []pgwire.Statement) {
	c.roundTrips = append(c.roundTrips, float64(n.RoundTrips))
	c.statements = append(c.statements, float64(n.Statements))
	c.recorded = recorded
}

type probeCosts struct {
	create, replay, baseline, get, payment cost
	paymentBaseline                        cost
	// authMiss is the extra cost of a request whose API key is not in the
	// authentication cache.
	authMiss pgwire.Counts
}

// do sends one request and checks its status and replayed header; it
// returns the body.
func (p *probe) do(ctx context.Context, method, path, apiKey, idemKey string, body []byte, want int, replayed bool) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	res, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	if got := res.Header.Get(replayedHeader) == "true"; res.StatusCode != want || got != replayed {
		return nil, fmt.Errorf("probe %s %s: %d %s=%t %s, want %d replayed=%t", method, path, res.StatusCode, replayedHeader, got, truncate(b), want, replayed)
	}
	return b, nil
}

// measure runs one request alone and returns what it cost.
func (p *probe) measure(ctx context.Context, c *cost, fn func() error) error {
	p.proxy.Reset()
	n, err := p.proxy.Measure(ctx, fn)
	if err != nil {
		return err
	}
	c.add(n, p.proxy.Statements())
	return nil
}

// run measures warmup unrecorded iterations and then samples recorded ones
// of: a create under a fresh key, its replay, a GET of the order, a
// baseline create, and a payment of the order. The warm-up lets pgx
// prepare every statement on the connections the samples use (a first
// use costs an extra round trip) and fills the authentication cache.
// unusedKeys are two API keys no request has used yet, to measure a miss
// of that cache.
func (p *probe) run(ctx context.Context, warmup, samples int, unusedKeys [2]string) (probeCosts, error) {
	var out probeCosts
	var scratch probeCosts
	p.proxy.Record(true)
	defer p.proxy.Record(false)
	for i := range warmup + samples {
		costs := &out
		if i < warmup {
			costs = &scratch
		}
		if err := p.sample(ctx, costs); err != nil {
			return out, err
		}
	}
	var err error
	out.authMiss, err = p.authMiss(ctx, unusedKeys)
	return out, err
}

// sample measures each request of the probe once, into costs: an order's
// create, replay and read, the baseline's create, a payment, and the
// baseline's payment.
func (p *probe) sample(ctx context.Context, costs *probeCosts) error {
	createKey, ref := p.load.fresh("probe-create"), p.load.fresh("probe-ref")
	var created []byte
	err := p.measure(ctx, &costs.create, func() (err error) {
		created, err = p.do(ctx, http.MethodPost, "/v1/orders", p.apiKey, createKey, orderBody(ref), http.StatusCreated, false)
		return err
	})
	if err != nil {
		return err
	}
	var order struct{ ID string }
	if err := json.Unmarshal(created, &order); err != nil {
		return err
	}
	if err := p.measure(ctx, &costs.replay, func() error {
		replayed, err := p.do(ctx, http.MethodPost, "/v1/orders", p.apiKey, createKey, orderBody(ref), http.StatusCreated, true)
		if err == nil && !bytes.Equal(replayed, created) {
			err = fmt.Errorf("probe: the replay's body differs from the original's")
		}
		return err
	}); err != nil {
		return err
	}
	if err := p.measure(ctx, &costs.get, func() error {
		_, err := p.do(ctx, http.MethodGet, "/v1/orders/"+order.ID, p.apiKey, "", nil, http.StatusOK, false)
		return err
	}); err != nil {
		return err
	}
	var baselineOrder []byte
	if err := p.measure(ctx, &costs.baseline, func() (err error) {
		baselineOrder, err = p.do(ctx, http.MethodPost, "/v1/_baseline/orders", p.apiKey, "", orderBody(p.load.fresh("probe-ref")), http.StatusCreated, false)
		return err
	}); err != nil {
		return err
	}
	pay := fmt.Appendf(nil, `{"order_id":%q,"amount":%d,"currency":"EUR","payment_method":"pm_card_visa"}`, order.ID, orderAmount)
	if err := p.measure(ctx, &costs.payment, func() error {
		_, err := p.do(ctx, http.MethodPost, "/v1/payments", p.apiKey, p.load.fresh("probe-pay"), pay, http.StatusCreated, false)
		return err
	}); err != nil {
		return err
	}
	// The payment baseline pays the baseline's order.
	var other struct{ ID string }
	if err := json.Unmarshal(baselineOrder, &other); err != nil {
		return err
	}
	payOther := fmt.Appendf(nil, `{"order_id":%q,"amount":%d,"currency":"EUR","payment_method":"pm_card_visa"}`, other.ID, orderAmount)
	if err := p.measure(ctx, &costs.paymentBaseline, func() error {
		_, err := p.do(ctx, http.MethodPost, "/v1/_baseline/payments", p.apiKey, "", payOther, http.StatusCreated, false)
		return err
	}); err != nil {
		return err
	}
	return nil
}

// authMiss measures the extra cost of an API key that is not in the
// authentication cache.
func (p *probe) authMiss(ctx context.Context, unusedKeys [2]string) (pgwire.Counts, error) {
	// The authentication cache: the first request under a key looks it up,
	// the next one within AUTH_CACHE_TTL does not. The first key's miss
	// may also prepare the lookup on this connection; the second key's is
	// the steady state.
	list := func(key string) func() error {
		return func() error {
			_, err := p.do(ctx, http.MethodGet, "/v1/orders?limit=1", key, "", nil, http.StatusOK, false)
			return err
		}
	}
	for _, fn := range []func() error{list(p.apiKey), list(p.apiKey), list(unusedKeys[0])} {
		if _, err := p.proxy.Measure(ctx, fn); err != nil {
			return pgwire.Counts{}, err
		}
	}
	miss, err := p.proxy.Measure(ctx, list(unusedKeys[1]))
	if err != nil {
		return pgwire.Counts{}, err
	}
	hit, err := p.proxy.Measure(ctx, list(unusedKeys[1]))
	if err != nil {
		return pgwire.Counts{}, err
	}
	return miss.Sub(hit), nil
}

// formatStatements lists statements by round trip, one line per round
// trip, statements pipelined together joined by " ⏎ ".
func formatStatements(stmts []pgwire.Statement) []string {
	type key struct {
		conn int
		rt   int64
	}
	var lines []string
	var last key
	for i, s := range stmts {
		k := key{s.Conn, s.RoundTrip}
		text := strings.Join(strings.Fields(s.SQL), " ")
		if len(text) > 110 {
			text = text[:110] + "…"
		}
		if i > 0 && k == last {
			lines[len(lines)-1] += " ⏎ " + text
			continue
		}
		lines = append(lines, text)
		last = k
	}
	return lines
}
