package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	natsTestStream  = "CHAOS_TEST"
	natsTestSubject = "chaos.test.msg"
)

// TestNATSCluster drives the cluster through what the scenarios do to it
// — the stream's leader killed and restarted, a follower and then the
// leader partitioned and healed — and checks after each that a stream at
// 3 replicas keeps every acknowledged message exactly once: publishes
// retried under the same Nats-Msg-Id are stored once, and every replica
// ends with all of them.
func TestNATSCluster(t *testing.T) {
	f, err := startFaults()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	began := time.Now()
	c, err := startNATSCluster(t.TempDir(), f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	t.Logf("cluster formed in %v", time.Since(began).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js := dialNATSTest(t, c.ClientAddrs()...)
	createStreamNATSTest(ctx, t, js)
	publishNATSTest(ctx, t, js, 0, 20)

	t.Run("KillLeader", func(t *testing.T) {
		leader := streamLeaderNATSTest(ctx, t, c)
		killed := time.Now()
		c.Kill(leader)
		publishNATSTest(ctx, t, js, 20, 40)
		t.Logf("killed node %d; node %d leads, publishes acknowledged again after %v",
			leader, streamLeaderNATSTest(ctx, t, c), time.Since(killed).Round(time.Millisecond))
		republishNATSTest(ctx, t, js, 0, 10)
		republishNATSTest(ctx, t, js, 30, 40)
		restarted := time.Now()
		if err := c.Restart(leader); err != nil {
			t.Fatal(err)
		}
		t.Logf("node %d restarted and rejoined in %v", leader, time.Since(restarted).Round(time.Millisecond))
		wantReplicasNATSTest(ctx, t, c, 40)
	})

	t.Run("PartitionFollower", func(t *testing.T) {
		leader := streamLeaderNATSTest(ctx, t, c)
		follower := (leader + 1) % natsNodes
		partitionNATSTest(t, c, follower)
		publishNATSTest(ctx, t, dialNATSTest(t, c.ClientAddrs()[leader]), 40, 60)
		healNATSTest(t, c, follower)
		wantReplicasNATSTest(ctx, t, c, 60)
	})

	t.Run("PartitionLeader", func(t *testing.T) {
		leader := streamLeaderNATSTest(ctx, t, c)
		majority := (leader + 1) % natsNodes
		cut := time.Now()
		partitionNATSTest(t, c, leader)
		publishNATSTest(ctx, t, dialNATSTest(t, c.ClientAddrs()[majority]), 60, 80)
		t.Logf("partitioned node %d; the majority acknowledged publishes again after %v", leader, time.Since(cut).Round(time.Millisecond))
		healNATSTest(t, c, leader)
		wantReplicasNATSTest(ctx, t, c, 80)
		republishNATSTest(ctx, t, js, 60, 80)
		wantReplicasNATSTest(ctx, t, c, 80)
	})

	t.Run("RestartEmpty", func(t *testing.T) {
		restarted := time.Now()
		if err := c.RestartEmpty(); err != nil {
			t.Fatal(err)
		}
		t.Logf("every node restarted on empty storage in %v", time.Since(restarted).Round(time.Millisecond))
		// The stream went with the storage; only a client creates it again.
		if err := awaitNATS(ctx, "the stream reported missing", func() error {
			if _, err := js.Stream(ctx, natsTestStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("stream lookup: %w", err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		createStreamNATSTest(ctx, t, js)
		publishNATSTest(ctx, t, js, 0, 10)
		wantReplicasNATSTest(ctx, t, c, 10)
	})
}

// createStreamNATSTest creates the test stream at 3 replicas.
func createStreamNATSTest(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       natsTestStream,
		Subjects:   []string{natsTestSubject},
		Storage:    jetstream.FileStorage,
		Replicas:   3,
		Duplicates: time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
}

// dialNATSTest connects to the nodes at addrs, reconnecting quickly and
// for ever, as the APIs do.
func dialNATSTest(t *testing.T, addrs ...string) jetstream.JetStream {
	t.Helper()
	urls := make([]string, len(addrs))
	for i, addr := range addrs {
		urls[i] = "nats://" + addr
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// publishNATSTest publishes messages from to to-1, each under its own
// Nats-Msg-Id, retrying each until it is acknowledged, as the outbox
// relay does.
func publishNATSTest(ctx context.Context, t *testing.T, js jetstream.JetStream, from, to int) {
	t.Helper()
	failed := 0
	for n := from; n < to; n++ {
		for {
			_, err := publishOnceNATSTest(ctx, js, n)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("publish %d: %v", n, err)
			}
			failed++
			time.Sleep(50 * time.Millisecond)
		}
	}
	if failed > 0 {
		t.Logf("publishes %d–%d: %d attempts failed before acknowledged", from, to-1, failed)
	}
}

// republishNATSTest publishes messages from to to-1 again and checks the
// stream reports each as a duplicate.
func republishNATSTest(ctx context.Context, t *testing.T, js jetstream.JetStream, from, to int) {
	t.Helper()
	for n := from; n < to; n++ {
		ack, err := publishOnceNATSTest(ctx, js, n)
		if err != nil {
			t.Fatalf("republish %d: %v", n, err)
		}
		if !ack.Duplicate {
			t.Errorf("republish %d: stored again at sequence %d", n, ack.Sequence)
		}
	}
}

// publishOnceNATSTest makes one attempt at publishing message n.
func publishOnceNATSTest(ctx context.Context, js jetstream.JetStream, n int) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	id := fmt.Sprintf("msg-%d", n)
	return js.Publish(ctx, natsTestSubject, []byte(id), jetstream.WithMsgID(id))
}

// streamLeaderNATSTest waits until the test stream has a leader.
func streamLeaderNATSTest(ctx context.Context, t *testing.T, c *natsCluster) int {
	t.Helper()
	for {
		leader, err := c.StreamLeader(natsTestStream)
		if err == nil {
			return leader
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(natsPoll)
	}
}

// partitionNATSTest partitions node i and checks, apart from what
// Partition waits for, that no route connection to or from it is left.
func partitionNATSTest(t *testing.T, c *natsCluster, i int) {
	t.Helper()
	if err := c.Partition(i); err != nil {
		t.Fatal(err)
	}
	for j, n := range c.nodes {
		if j == i {
			if routes := n.srv.NumRoutes(); routes != 0 {
				t.Fatalf("partitioned node %d has %d route connections", i, routes)
			}
			continue
		}
		peers, err := natsRoutePeers(n.srv)
		if err != nil {
			t.Fatal(err)
		}
		if peers[c.nodes[i].name] {
			t.Fatalf("node %d still routes to partitioned node %d", j, i)
		}
	}
}

// healNATSTest heals node i and checks that every node routes to both
// others again.
func healNATSTest(t *testing.T, c *natsCluster, i int) {
	t.Helper()
	healed := time.Now()
	if err := c.Heal(i); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d healed, routes and JetStream meta back in %v", i, time.Since(healed).Round(time.Millisecond))
	for j, n := range c.nodes {
		peers, err := natsRoutePeers(n.srv)
		if err != nil {
			t.Fatal(err)
		}
		if len(peers) != natsNodes-1 {
			t.Fatalf("node %d routes to %d nodes after heal, want %d", j, len(peers), natsNodes-1)
		}
	}
}

// wantReplicasNATSTest waits until the test stream is healthy and checks
// that every replica holds exactly want messages, one for each distinct
// id published.
func wantReplicasNATSTest(ctx context.Context, t *testing.T, c *natsCluster, want uint64) {
	t.Helper()
	began := time.Now()
	if err := c.WaitStreamHealthy(ctx, natsTestStream); err != nil {
		t.Fatal(err)
	}
	t.Logf("stream healthy after %v", time.Since(began).Round(time.Millisecond))
	for i, n := range c.nodes {
		replica, err := natsLocalStream(n.srv, natsTestStream)
		if err != nil {
			t.Fatal(err)
		}
		if replica.State.Msgs != want {
			t.Errorf("node %d holds %d messages, want %d", i, replica.State.Msgs, want)
		}
	}
}
