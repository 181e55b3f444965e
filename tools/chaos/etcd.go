package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemref/payments/internal/tooling/harness"
)

// etcdMembers is the size of the etcd cluster Patroni keeps its state in:
// three, so that it keeps a quorum when one member is lost (scenario 12).
const etcdMembers = 3

// etcdCluster is etcd, three real processes on this machine: the
// configuration store Patroni holds its leader key in.
type etcdCluster struct {
	members [etcdMembers]*etcdMember
}

// etcdMember is one etcd process.
type etcdMember struct {
	name       string
	clientAddr string
	peerAddr   string
	dir        string
	logPath    string
	cmd        *exec.Cmd
	exited     chan struct{}
	killed     bool
}

// etcdBinary finds etcd on PATH, as Debian's etcd-server installs it.
func etcdBinary() (string, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return "", errors.New("etcd not found: install it (Debian/Ubuntu: apt-get install etcd-server)")
	}
	return bin, nil
}

// startEtcd starts a three-member etcd cluster with its data under dir
// and waits until every member answers healthy. etcd runs as this
// process's user: unlike PostgreSQL it does not refuse root.
func startEtcd(ctx context.Context, dir string) (_ *etcdCluster, err error) {
	bin, err := etcdBinary()
	if err != nil {
		return nil, err
	}
	c := &etcdCluster{}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	var initial []string
	for i := range c.members {
		m := &etcdMember{name: "etcd" + strconv.Itoa(i), dir: filepath.Join(dir, "etcd"+strconv.Itoa(i))}
		if m.clientAddr, err = freeAddr(); err != nil {
			return nil, err
		}
		if m.peerAddr, err = freeAddr(); err != nil {
			return nil, err
		}
		c.members[i] = m
		initial = append(initial, m.name+"=http://"+m.peerAddr)
	}
	for _, m := range c.members {
		if err := m.start(bin, strings.Join(initial, ",")); err != nil {
			return nil, err
		}
	}
	for _, m := range c.members {
		if err := m.waitHealthy(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (m *etcdMember) start(bin, initialCluster string) error {
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return err
	}
	m.logPath = m.dir + ".log"
	logFile, err := os.Create(m.logPath)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child keeps its own descriptor
	m.cmd = exec.Command(bin,
		"--name", m.name,
		"--data-dir", filepath.Join(m.dir, "data"),
		"--listen-client-urls", "http://"+m.clientAddr,
		"--advertise-client-urls", "http://"+m.clientAddr,
		"--listen-peer-urls", "http://"+m.peerAddr,
		"--initial-advertise-peer-urls", "http://"+m.peerAddr,
		"--initial-cluster", initialCluster,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "chaos",
	)
	m.cmd.Stdout, m.cmd.Stderr = logFile, logFile
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", m.name, err)
	}
	m.exited = make(chan struct{})
	go func() {
		_ = m.cmd.Wait()
		close(m.exited)
	}()
	return nil
}

// waitHealthy polls the member's /health until it reports true: it has a
// leader and serves reads.
func (m *etcdMember) waitHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pgWaitTimeout)
	defer cancel()
	var last error
	for {
		var h struct {
			Health string `json:"health"`
		}
		last = getJSON(ctx, "http://"+m.clientAddr+"/health", &h)
		if last == nil && h.Health == "true" {
			return nil
		}
		if last == nil {
			last = fmt.Errorf("health %q", h.Health)
		}
		select {
		case <-m.exited:
			return fmt.Errorf("%s exited during startup\n--- %s ---\n%s", m.name, m.logPath, harness.Tail(m.logPath))
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy within %s: %w\n--- %s ---\n%s", m.name, pgWaitTimeout, last, m.logPath, harness.Tail(m.logPath))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ClientAddrs returns each member's client address (host:port).
func (c *etcdCluster) ClientAddrs() [etcdMembers]string {
	var addrs [etcdMembers]string
	for i, m := range c.members {
		addrs[i] = m.clientAddr
	}
	return addrs
}

// Leader returns the index of the member that leads the raft group now,
// from the members' own status (POST /v3/maintenance/status).
func (c *etcdCluster) Leader(ctx context.Context) (int, error) {
	for i, m := range c.members {
		if m.killed {
			continue
		}
		var st struct {
			Header struct {
				MemberID string `json:"member_id"`
			} `json:"header"`
			Leader string `json:"leader"`
		}
		if err := postJSON(ctx, "http://"+m.clientAddr+"/v3/maintenance/status", &st); err != nil {
			return 0, fmt.Errorf("%s: %w", m.name, err)
		}
		if st.Leader != "" && st.Leader == st.Header.MemberID {
			return i, nil
		}
	}
	return 0, errors.New("no etcd member says it leads")
}

// Kill ends member i by SIGKILL, as a crashed machine would, and returns
// once it has exited.
func (c *etcdCluster) Kill(i int) {
	m := c.members[i]
	_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	<-m.exited
	m.killed = true
}

// Stop ends every member still running.
func (c *etcdCluster) Stop() {
	for _, m := range c.members {
		if m == nil || m.cmd == nil || m.killed {
			continue
		}
		_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
			<-m.exited
		}
	}
}

// getJSON decodes the JSON answer to GET url into v; any status but 200
// is an error.
func getJSON(ctx context.Context, url string, v any) error {
	return doJSON(ctx, http.MethodGet, url, "", v)
}

// postJSON posts an empty JSON object to url and decodes the answer.
func postJSON(ctx context.Context, url string, v any) error {
	return doJSON(ctx, http.MethodPost, url, "{}", v)
}

func doJSON(ctx context.Context, method, url, body string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s", method, url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
