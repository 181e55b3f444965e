package db

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"
)

// A connection whose peer went silent must end, and not only at the
// request's deadline. A COMMIT runs under context.WithoutCancel
// (primary.go), so nothing but the server's answer or the connection's loss
// ends its wait; across a partition that drops packets without a reset
// (a firewall's state lost, a network cut between the API and the
// database) the kernel retransmits for tcp_retries2, about 15 minutes,
// and the request and its pool connection are held that long. Two socket
// settings bound it, on every connection the pool opens:
//
//   - TCP_USER_TIMEOUT: data sent and not acknowledged for this long (a
//     COMMIT the server never received) fails the connection with
//     ETIMEDOUT.
//   - TCP keepalive, idle deadPeerKeepAliveIdle then a probe every
//     deadPeerKeepAliveInterval: a connection waiting for an answer with
//     nothing unacknowledged (a COMMIT received, the server then cut off)
//     is probed, and TCP_USER_TIMEOUT ends it when the probes go
//     unanswered that long.
//
// A server that is alive answers the probes, so a long legitimate wait (a
// COMMIT waiting for the synchronous standby, a lock wait) is not cut.
// The connection's loss is an unknown outcome, as any lost connection
// during COMMIT (IsTransient: 503, and the client's retry with the same
// key replays the record if the COMMIT landed or runs the request if it
// did not).
//
// The bound is the URL's tcp_user_timeout (libpq's name and unit:
// milliseconds; 0 leaves the kernel's default), DefaultTCPUserTimeout when
// the URL does not set it.
const (
	// DefaultTCPUserTimeout bounds the wait on a silent peer when
	// DATABASE_URL sets no tcp_user_timeout.
	DefaultTCPUserTimeout     = 30 * time.Second
	deadPeerKeepAliveIdle     = 10 * time.Second
	deadPeerKeepAliveInterval = 5 * time.Second
	// deadPeerKeepAliveCount: Linux ends the connection on
	// TCP_USER_TIMEOUT when it is set, whatever the count.
	deadPeerKeepAliveCount = 6
)

// tcpUserTimeoutParam is libpq's connection parameter. pgx does not know
// it and would send it to the server as a setting (PgBouncer refuses
// unknown ones), so it is taken out of the startup parameters here.
const tcpUserTimeoutParam = "tcp_user_timeout"

// detectDeadPeers makes cfg's connections end on a silent peer (see
// above), keeping cfg's connect timeout.
func detectDeadPeers(cfg *pgconn.Config) error {
	timeout := DefaultTCPUserTimeout
	if v, ok := cfg.RuntimeParams[tcpUserTimeoutParam]; ok {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 {
			return fmt.Errorf("%s=%q: want milliseconds, a whole number of at least 0", tcpUserTimeoutParam, v)
		}
		timeout = time.Duration(ms) * time.Millisecond
		delete(cfg.RuntimeParams, tcpUserTimeoutParam)
	}
	dialer := &net.Dialer{
		Timeout: cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: deadPeerKeepAliveIdle, Interval: deadPeerKeepAliveInterval, Count: deadPeerKeepAliveCount,
		},
		Control: func(network, _ string, c syscall.RawConn) error {
			if timeout == 0 || (network != "tcp" && network != "tcp4" && network != "tcp6") {
				return nil
			}
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(timeout.Milliseconds()))
			})
			if err != nil {
				return err
			}
			return serr
		},
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialer.DialContext(ctx, network, addr)
	}
	return nil
}
