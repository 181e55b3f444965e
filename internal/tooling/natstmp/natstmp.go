// Package natstmp runs a NATS server with JetStream inside this process,
// for make run (api dev), the tests and the load benchmark: what
// internal/tooling/pgtmp is for PostgreSQL. A deployment runs NATS
// servers of its own; nothing api serve runs imports this, so a binary
// built with -tags nodev links no NATS server (docs/deployment.md).
package natstmp

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is a NATS server with JetStream running in this process.
type Server struct{ srv *server.Server }

// Start starts a NATS server with JetStream storing in dir, on a free
// loopback port.
func Start(dir string) (*Server, error) { return StartOn(dir, 0) }

// StartOn is Start on a given loopback port, so that a development server
// keeps the URL its earlier runs printed; port 0 picks a free one (NATS
// itself reads 0 as its default port, 4222).
func StartOn(dir string, port int) (*Server, error) {
	if port == 0 {
		port = -1
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	if err != nil {
		return nil, fmt.Errorf("natstmp: embedded NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("natstmp: embedded NATS did not start within 10s")
	}
	return &Server{srv: srv}, nil
}

// Port is the TCP port the server listens on.
func (s *Server) Port() int { return s.srv.Addr().(*net.TCPAddr).Port }

// URL is the client URL, for NATS_URL or broker.Connect.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Shutdown stops the server and waits until it has stopped.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}
