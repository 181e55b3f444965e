package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

const (
	// natsNodes is the cluster's size: the smallest that keeps a quorum
	// with one node killed or partitioned, as production runs it.
	natsNodes = 3
	// natsClusterName names the cluster; every node must agree on it.
	natsClusterName = "chaos"
	// natsAccount is the account the API processes use: they connect
	// without credentials, which puts them in the global account.
	natsAccount = server.DEFAULT_GLOBAL_ACCOUNT
	// natsHost is where every listener of the cluster binds.
	natsHost = "127.0.0.1"
	// natsSettle bounds the waits of the fault operations. It covers a
	// raft election (4–9 s) and a leader's step-down after it lost its
	// quorum (10 s), the slowest things a kill or partition sets off.
	natsSettle = 30 * time.Second
	// natsPoll is how often a wait looks again.
	natsPoll = 50 * time.Millisecond
)

// natsDebugEnv, when set to anything, makes each node write its debug
// log to nats-<node>.log in the work directory: a file a node, since
// three servers in one process would interleave on stderr. It is read
// from the environment because the command line belongs to main, while
// startNATSCluster is also what this package's tests start.
const natsDebugEnv = "CHAOS_NATS_DEBUG"

// natsCluster is a 3-node NATS JetStream cluster inside this process,
// built so that scenarios can kill, restart and partition single nodes.
//
// Every route between two nodes goes through a Toxiproxy link of its
// own, one for each direction (links[{i, j}] carries the routes node i
// solicits to node j), so cutting the links to and from a node isolates
// it from the others while it and its clients keep running. A node that
// gains a route tells its other peers the new node's route address, and
// a peer without a route to that node yet dials the address directly,
// bypassing the links, which a partition then would not cut. Every node
// therefore advertises an address that refuses connections, so that the
// only routes are those the nodes' configured routes open through the
// links.
type natsCluster struct {
	nodes []*natsNode
	links map[[2]int]*link
	// nowhere is the route address every node advertises; nowhereFD
	// holds its port so that nothing else listens there.
	nowhere   string
	nowhereFD int

	// mu guards each node's srv and cut, the links' state and nowhereFD.
	mu sync.Mutex
}

// natsNode is one server of the cluster and what it needs to come back
// as the same JetStream peer after a kill.
type natsNode struct {
	// name is the server name, by which JetStream knows the peer; the
	// server's ID changes on every start, the name must not.
	name        string
	store       string
	logFile     string
	clientPort  int
	clusterPort int
	routes      []*url.URL

	srv *server.Server // nil while the node is killed
	cut bool           // partitioned from the other nodes
}

// startNATSCluster starts 3 nodes with store dirs under work, routes
// through f's links, and waits until the cluster has formed and
// JetStream has a meta leader (every node sees it).
func startNATSCluster(work string, f *faults) (*natsCluster, error) {
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	fd, nowhere, err := reserveRefusingAddr()
	if err != nil {
		return nil, fmt.Errorf("nats: reserve the advertised route address: %w", err)
	}
	c := &natsCluster{links: map[[2]int]*link{}, nowhere: nowhere, nowhereFD: fd}
	if err := c.build(work, f); err != nil {
		c.Stop()
		return nil, err
	}
	for i := range c.nodes {
		if err := c.boot(i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := settleNATS("cluster start", c.meshErr, c.metaErr); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// build picks each node's ports and store and creates the links its
// routes go through.
func (c *natsCluster) build(work string, f *faults) error {
	for i := range natsNodes {
		n := &natsNode{
			name:    fmt.Sprintf("%s-%d", natsClusterName, i),
			store:   filepath.Join(work, fmt.Sprintf("nats-%d", i)),
			logFile: filepath.Join(work, fmt.Sprintf("nats-%d.log", i)),
		}
		var err error
		if n.clientPort, err = natsFreePort(); err != nil {
			return err
		}
		if n.clusterPort, err = natsFreePort(); err != nil {
			return err
		}
		c.nodes = append(c.nodes, n)
	}
	for i, n := range c.nodes {
		for j, peer := range c.nodes {
			if i == j {
				continue
			}
			l, err := f.Link(fmt.Sprintf("nats-route-%d-%d", i, j), net.JoinHostPort(natsHost, strconv.Itoa(peer.clusterPort)))
			if err != nil {
				return err
			}
			c.links[[2]int{i, j}] = l
			n.routes = append(n.routes, &url.URL{Scheme: "nats-route", Host: l.Addr()})
		}
	}
	return nil
}

// natsFreePort returns a loopback port free right now.
func natsFreePort() (int, error) {
	addr, err := freeAddr()
	if err != nil {
		return 0, err
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(port)
}

// reserveRefusingAddr binds a loopback TCP port without listening on
// it: connections to it are refused at once, and while fd stays open no
// other listener can take the port over.
func reserveRefusingAddr() (fd int, addr string, err error) {
	// Held like the net package does, so that no process the harness
	// starts meanwhile inherits the socket.
	syscall.ForkLock.RLock()
	fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return -1, "", err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return -1, "", err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return -1, "", err
	}
	port := sa.(*syscall.SockaddrInet4).Port
	return fd, net.JoinHostPort(natsHost, strconv.Itoa(port)), nil
}

// options is node n's configuration; each start needs a fresh copy,
// since the server writes into it.
func (c *natsCluster) options(n *natsNode) *server.Options {
	debug := os.Getenv(natsDebugEnv) != ""
	return &server.Options{
		ServerName: n.name,
		Host:       natsHost,
		Port:       n.clientPort,
		NoSigs:     true,
		NoLog:      !debug,
		Debug:      debug,
		Logtime:    true,
		LogFile:    n.logFile,
		JetStream:  true,
		StoreDir:   n.store,
		Cluster: server.ClusterOpts{
			Name: natsClusterName,
			Host: natsHost,
			Port: n.clusterPort,
			// Clients get no other node's address from the server, so
			// they use only the addresses they were given: the proxies
			// the caller puts in front of ClientAddrs.
			NoAdvertise: true,
			Advertise:   c.nowhere,
		},
		Routes: n.routes,
	}
}

// boot starts node i on its ports and store and waits until it accepts
// clients; its links come up for every peer it may reach.
func (c *natsCluster) boot(i int) error {
	n := c.nodes[i]
	srv, err := server.NewServer(c.options(n))
	if err != nil {
		return fmt.Errorf("nats: node %d: %w", i, err)
	}
	srv.ConfigureLogger()
	c.mu.Lock()
	n.srv = srv
	err = c.setLinks(i)
	c.mu.Unlock()
	if err == nil {
		srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			err = fmt.Errorf("nats: node %d did not accept clients within 10s", i)
		}
	}
	if err != nil {
		c.Kill(i)
	}
	return err
}

// linked reports whether nodes a and b may route to each other: both run
// and neither is partitioned. c.mu is held.
func (c *natsCluster) linked(a, b int) bool {
	na, nb := c.nodes[a], c.nodes[b]
	return na.srv != nil && nb.srv != nil && !na.cut && !nb.cut
}

// setLinks brings the links to and from node i up or down as linked
// says. c.mu is held.
func (c *natsCluster) setLinks(i int) error {
	for j := range c.nodes {
		if j == i {
			continue
		}
		for _, l := range []*link{c.links[[2]int{i, j}], c.links[[2]int{j, i}]} {
			set := l.Down
			if c.linked(i, j) {
				set = l.Up
			}
			if err := set(); err != nil {
				return fmt.Errorf("nats: link %s: %w", l.name, err)
			}
		}
	}
	return nil
}

// ClientAddrs returns the host:port of each node's client listener,
// indexed by node.
func (c *natsCluster) ClientAddrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = net.JoinHostPort(natsHost, strconv.Itoa(n.clientPort))
	}
	return addrs
}

// StreamLeader returns the index of the node leading stream. Only nodes
// that run and are not partitioned count: a partitioned leader cannot
// commit, and believes it leads until it notices its lost quorum. It
// fails while no node leads (an election) and while two still claim to
// (the old leader has yet to hear of the new term).
func (c *natsCluster) StreamLeader(stream string) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var leaders []int
	for i, n := range c.nodes {
		if n.srv != nil && !n.cut && n.srv.JetStreamIsStreamLeader(natsAccount, stream) {
			leaders = append(leaders, i)
		}
	}
	switch len(leaders) {
	case 1:
		return leaders[0], nil
	case 0:
		return -1, fmt.Errorf("nats: stream %s has no leader", stream)
	default:
		return -1, fmt.Errorf("nats: nodes %v all claim to lead stream %s", leaders, stream)
	}
}

// Kill shuts node i down abruptly. Its links are cut first: Shutdown
// hands the node's raft leaderships to a peer on the way out, which a
// crashed process never does, and without routes no peer hears it, so
// the others notice the loss only by missed heartbeats and elect a new
// leader as after a crash. Should cutting fail, the node is shut down
// anyway, and only that hand-over differs.
func (c *natsCluster) Kill(i int) {
	c.mu.Lock()
	srv := c.nodes[i].srv
	c.nodes[i].srv = nil
	err := c.setLinks(i)
	c.mu.Unlock()
	if srv == nil {
		return
	}
	if err == nil {
		_ = settleNATS(fmt.Sprintf("isolate node %d", i), func() error { return natsNoRoutes(srv) })
	}
	srv.Shutdown()
	srv.WaitForShutdown()
}

// natsNoRoutes fails while srv still has a route connection.
func natsNoRoutes(srv *server.Server) error {
	if n := srv.NumRoutes(); n > 0 {
		return fmt.Errorf("%d route connections still open", n)
	}
	return nil
}

// Restart starts the killed node i again on the same ports and store
// (JetStream recovers its state from disk) and waits until it has its
// routes back and its JetStream meta state is current. A node killed
// while partitioned comes back partitioned.
func (c *natsCluster) Restart(i int) error {
	c.mu.Lock()
	running := c.nodes[i].srv != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("nats: restart node %d: it is running", i)
	}
	if err := c.boot(i); err != nil {
		return err
	}
	return settleNATS(fmt.Sprintf("restart node %d", i), c.meshErr, c.metaErr)
}

// RestartEmpty kills every node, removes its store and starts it again
// on the same ports: the whole cluster lost its storage (D7), and comes
// back with no stream, no consumer and no message. It waits until the
// new cluster has formed and JetStream has a meta leader.
func (c *natsCluster) RestartEmpty() error {
	for i := range c.nodes {
		c.Kill(i)
	}
	for i, n := range c.nodes {
		if err := os.RemoveAll(n.store); err != nil {
			return fmt.Errorf("nats: empty the store of node %d: %w", i, err)
		}
	}
	for i := range c.nodes {
		if err := c.boot(i); err != nil {
			return err
		}
	}
	return settleNATS("restart empty", c.meshErr, c.metaErr)
}

// Partition cuts node i's routes both ways and waits until every route
// connection to and from it has closed; the node and its clients keep
// running.
func (c *natsCluster) Partition(i int) error {
	return c.setCut(i, true)
}

// Heal restores node i's routes and waits until they have re-formed and
// the node's JetStream meta state is current again.
func (c *natsCluster) Heal(i int) error {
	return c.setCut(i, false)
}

// setCut partitions or heals node i and waits until the routes match.
func (c *natsCluster) setCut(i int, cut bool) error {
	c.mu.Lock()
	c.nodes[i].cut = cut
	err := c.setLinks(i)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if cut {
		return settleNATS(fmt.Sprintf("partition node %d", i), c.meshErr)
	}
	return settleNATS(fmt.Sprintf("heal node %d", i), c.meshErr, c.metaErr)
}

// WaitStreamHealthy waits until stream has a leader and all 3 replicas
// are current: the leader sees every follower holding all it committed,
// and each follower has applied what it knows to be committed, has no
// catch-up running and stored the leader's last sequence.
func (c *natsCluster) WaitStreamHealthy(ctx context.Context, stream string) error {
	return awaitNATS(ctx, "stream "+stream+" healthy", func() error { return c.streamErr(stream) })
}

// WaitStreamMessages waits until stream is healthy and holds messages,
// and returns how many it holds.
func (c *natsCluster) WaitStreamMessages(ctx context.Context, stream string) (uint64, error) {
	var msgs uint64
	err := awaitNATS(ctx, "stream "+stream+" holding messages", func() error {
		if err := c.streamErr(stream); err != nil {
			return err
		}
		leader, err := c.StreamLeader(stream)
		if err != nil {
			return err
		}
		c.mu.Lock()
		detail, err := natsLocalStream(c.nodes[leader].srv, stream)
		c.mu.Unlock()
		if err != nil {
			return err
		}
		if msgs = detail.State.Msgs; msgs == 0 {
			return fmt.Errorf("stream %s holds no message yet", stream)
		}
		return nil
	})
	return msgs, err
}

// streamErr says why stream is not healthy yet, or returns nil.
func (c *natsCluster) streamErr(stream string) error {
	leader, err := c.StreamLeader(stream)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	want, err := natsLocalStream(c.nodes[leader].srv, stream)
	if err != nil {
		return fmt.Errorf("leader node %d: %w", leader, err)
	}
	var followers []string
	for i, n := range c.nodes {
		switch {
		case n.srv == nil:
			return fmt.Errorf("node %d is killed", i)
		case n.cut:
			return fmt.Errorf("node %d is partitioned", i)
		case !n.srv.JetStreamIsStreamCurrent(natsAccount, stream):
			return fmt.Errorf("node %d: replica of %s not current", i, stream)
		}
		got, err := natsLocalStream(n.srv, stream)
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		if got.State.LastSeq != want.State.LastSeq {
			return fmt.Errorf("node %d: replica of %s at sequence %d, leader at %d", i, stream, got.State.LastSeq, want.State.LastSeq)
		}
		if i != leader {
			followers = append(followers, n.name)
		}
	}
	if want.Cluster == nil {
		return fmt.Errorf("leader node %d reports no replicas of %s", leader, stream)
	}
	return natsPeersCurrent(want.Cluster.Replicas, followers)
}

// natsLocalStream returns srv's own replica of stream: its state and,
// on the leader, how far each follower is.
func natsLocalStream(srv *server.Server, stream string) (server.StreamDetail, error) {
	acc, err := srv.JszAccount(&server.JSzOptions{Account: natsAccount, Streams: true})
	if err != nil {
		return server.StreamDetail{}, err
	}
	for _, s := range acc.Streams {
		if s.Name == stream {
			return s, nil
		}
	}
	return server.StreamDetail{}, fmt.Errorf("no replica of stream %s", stream)
}

// natsPeersCurrent fails unless a raft leader's view of its followers,
// replicas, shows each server named in names online and holding every
// entry the leader committed.
func natsPeersCurrent(replicas []*server.PeerInfo, names []string) error {
	for _, name := range names {
		i := slices.IndexFunc(replicas, func(p *server.PeerInfo) bool { return p.Name == name })
		if i < 0 || !replicas[i].Current || replicas[i].Offline {
			return fmt.Errorf("the leader does not see %s current", name)
		}
	}
	return nil
}

// Stop shuts every node down.
func (c *natsCluster) Stop() {
	c.mu.Lock()
	var srvs []*server.Server
	for _, n := range c.nodes {
		if n.srv != nil {
			srvs = append(srvs, n.srv)
			n.srv = nil
		}
	}
	c.mu.Unlock()
	for _, srv := range srvs {
		srv.Shutdown()
	}
	for _, srv := range srvs {
		srv.WaitForShutdown()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nowhereFD >= 0 {
		syscall.Close(c.nowhereFD)
		c.nowhereFD = -1
	}
}

// meshErr says which running node's routes differ from what the kills
// and partitions leave (every pair of running, unpartitioned nodes
// routed, and no other pair), or returns nil.
func (c *natsCluster) meshErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, n := range c.nodes {
		if n.srv == nil {
			continue
		}
		want := map[string]bool{}
		for b, peer := range c.nodes {
			if b != a && c.linked(a, b) {
				want[peer.name] = true
			}
		}
		got, err := natsRoutePeers(n.srv)
		if err != nil {
			return fmt.Errorf("node %d: %w", a, err)
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("node %d routes to %v, want %v", a, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		}
	}
	return nil
}

// natsRoutePeers returns the names of the servers srv has a route to. With
// route pooling a pair has several connections; one is enough to count.
func natsRoutePeers(srv *server.Server) (map[string]bool, error) {
	rz, err := srv.Routez(&server.RoutezOptions{})
	if err != nil {
		return nil, err
	}
	peers := map[string]bool{}
	for _, r := range rz.Routes {
		peers[r.RemoteName] = true
	}
	return peers, nil
}

// metaErr says why JetStream's meta group is not settled yet, or returns
// nil: among the running, unpartitioned nodes exactly one leads it, all
// name it leader and are current, and it sees every other one holding
// all it committed. (A node's own view alone does not do: one that has
// just started is current before it has heard from any leader.)
func (c *natsCluster) metaErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	views := map[string]*server.MetaClusterInfo{}
	var leaders []string
	for i, n := range c.nodes {
		if n.srv == nil || n.cut {
			continue
		}
		info, err := n.srv.Jsz(nil)
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		if info.Meta == nil || !n.srv.JetStreamIsCurrent() {
			return fmt.Errorf("node %d: JetStream meta state not current", i)
		}
		views[n.name] = info.Meta
		if n.srv.JetStreamIsLeader() {
			leaders = append(leaders, n.name)
		}
	}
	if len(leaders) != 1 {
		return fmt.Errorf("JetStream meta leaders %v, want one", leaders)
	}
	var followers []string
	for name, view := range views {
		if view.Leader != leaders[0] {
			return fmt.Errorf("%s names %q as JetStream meta leader, not %s", name, view.Leader, leaders[0])
		}
		if name != leaders[0] {
			followers = append(followers, name)
		}
	}
	return natsPeersCurrent(views[leaders[0]].Replicas, followers)
}

// settleNATS waits up to natsSettle until every check passes.
func settleNATS(what string, checks ...func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), natsSettle)
	defer cancel()
	return awaitNATS(ctx, what, func() error {
		for _, check := range checks {
			if err := check(); err != nil {
				return err
			}
		}
		return nil
	})
}

// awaitNATS polls ready until it returns nil or ctx ends; the error then
// says what was still missing.
func awaitNATS(ctx context.Context, what string, ready func() error) error {
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nats: %s: %w (%w)", what, err, ctx.Err())
		case <-time.After(natsPoll):
		}
	}
}
