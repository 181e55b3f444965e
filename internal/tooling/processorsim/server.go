package processorsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Server is a Simulator listening on TCP inside the calling process: the
// API's development mode and tests start one on 127.0.0.1:0 and call it
// over real HTTP.
type Server struct {
	// Simulator is the served simulator, for driving faults and reading
	// the call record directly.
	Simulator *Simulator

	srv  *http.Server
	ln   net.Listener
	done chan struct{}
	err  error // set before done is closed
}

// Start listens on addr synchronously, so a port already in use is an
// error here rather than a log line later, then serves a new Simulator in
// the background until Shutdown.
func Start(addr string, cfg Config) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("processorsim: listen on %s: %w", addr, err)
	}
	// Shutdown waits for calls in flight, but a call held by a fault would
	// only end at its delay or MaxExecution. Cancelling the context every
	// request derives from lets such calls drop their connection at once,
	// without executing, as a processor going away would. Late executions
	// ignore their request's context, so they wait on base directly.
	base, cancel := context.WithCancel(context.Background())
	sim := New(cfg)
	sim.lifetime = base
	srv := &http.Server{
		Handler:           sim.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(sim.logger.Handler(), slog.LevelWarn),
	}
	srv.RegisterOnShutdown(cancel)
	s := &Server{Simulator: sim, srv: srv, ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer cancel()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	sim.logger.Info("processor simulator listening", slog.String("addr", ln.Addr().String()))
	return s, nil
}

// URL returns the base URL to give simproc.NewClient, such as
// http://127.0.0.1:41234.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Done is closed when the server has stopped serving, after Shutdown or
// because the listener failed; Err then says which.
func (s *Server) Done() <-chan struct{} { return s.done }

// Err returns the error that stopped the server, or nil after a clean
// Shutdown. It is meaningful once Done is closed.
func (s *Server) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Shutdown stops accepting calls and waits for those in flight, bounded by
// ctx. Calls held by a fault (timeout, latency, late_execution) are
// dropped at once without executing: a late execution still waiting does
// not land, so shutdown never waits out a delay. When ctx ends first the
// remaining connections are closed and ctx's error is returned.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	<-s.done
	if err != nil {
		return fmt.Errorf("processorsim: shutdown: %w", err)
	}
	s.Simulator.logger.Info("processor simulator stopped")
	return s.err
}
