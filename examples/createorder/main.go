// Command createorder creates one order through the Go client, the way a
// job that must survive a crash does it: the Idempotency-Key is minted and
// written to a state file together with the request before the first send,
// so a second run after a crash (or after an unknown outcome) resumes the
// same operation with the same key instead of creating a second order.
//
//	export API=http://localhost:8080 API_KEY=...   # from `make run`'s banner
//	go run ./examples/createorder -reference order-2001 -amount 2500
//
// Run it twice: the second run prints the same order, replayed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/idemref/payments/client"
	"github.com/idemref/payments/client/api"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "createorder:", err)
		os.Exit(1)
	}
}

// resolveWait bounds how long an unknown outcome is looked up for.
const resolveWait = 5 * time.Second

// pending is the operation as persisted before it is sent.
type pending struct {
	Key     string                 `json:"key"`
	Request api.CreateOrderRequest `json:"request"`
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("createorder", flag.ContinueOnError)
	ref := fs.String("reference", "order-2001", "the order's reference (its natural key)")
	amount := fs.Int64("amount", 2500, "amount in minor units")
	currency := fs.String("currency", "EUR", "ISO 4217 currency")
	stateDir := fs.String("state", filepath.Join(os.TempDir(), "createorder"), "directory of pending operations")
	if err := fs.Parse(args); err != nil {
		return err
	}
	base, apiKey := getenv("API"), getenv("API_KEY")
	if base == "" || apiKey == "" {
		return errors.New("set API and API_KEY (make run prints them)")
	}

	// Resume the pending operation for this reference, or start one: its
	// key is on disk before anything is sent.
	path := filepath.Join(*stateDir, *ref+".json")
	op, err := load(path)
	if errors.Is(err, os.ErrNotExist) {
		op = pending{Key: client.NewKey(), Request: api.CreateOrderRequest{
			Reference: *ref, CustomerId: "cus_42", Amount: *amount, Currency: *currency,
		}}
		err = save(path, op)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "operation %s, Idempotency-Key %s\n", *ref, op.Key)

	c, err := client.New(base, apiKey, client.WithPolicy(client.Policy{
		OnAttempt: func(a client.Attempt) {
			if a.Retry {
				fmt.Fprintf(stdout, "attempt %d: status %d %v; retrying in %v\n", a.N, a.Status, a.Err, a.Delay)
			}
		},
	}))
	if err != nil {
		return err
	}
	res, err := c.CreateOrder(ctx, op.Key, op.Request)
	var unknown *client.OutcomeUnknownError
	switch {
	case errors.As(err, &unknown):
		// Keep the state file: the next run resumes with the same key.
		// Resolve waits out the server's commit window when the key has no
		// record yet; a few seconds is all this program gives it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveWait)
		defer cancel()
		st, rerr := c.Resolve(rctx, unknown)
		var notYet *client.NotRecordedError
		switch {
		case errors.Is(rerr, client.ErrKeyUnknown):
			return fmt.Errorf("not created yet (run again to resume): %w", err)
		case errors.As(rerr, &notYet):
			return fmt.Errorf("no record yet, and an attempt may still be running until %s (run again to resume: the same key, so at most one order): %w",
				notYet.FinalAt.Format(time.RFC3339), err)
		}
		if rerr != nil {
			return fmt.Errorf("outcome unknown, and the key status lookup failed (run again to resume): %w", errors.Join(err, rerr))
		}
		return fmt.Errorf("outcome unknown; the server says the key is %s (run again to get the result): %w", st.State, err)
	case err != nil:
		// A final answer: nothing to resume.
		_ = os.Remove(path)
		return err
	}
	fmt.Fprintf(stdout, "order %s: status %d, replayed %v, %d attempts\n", res.Value.Id, res.Status, res.Replayed, res.Attempts)
	// Keep the state file after success too: running again shows the
	// replay. A real job would delete it, or keep it for the key's
	// retention only.
	return nil
}

func load(path string) (pending, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return pending{}, err
	}
	var op pending
	if err := json.Unmarshal(b, &op); err != nil {
		return pending{}, fmt.Errorf("%s: %w", path, err)
	}
	return op, nil
}

// save writes the state file atomically (temporary file, then rename), so
// a crash never leaves half a key behind.
func save(path string, op pending) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(op)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
