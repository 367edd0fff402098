// Package testutil starts in-process Tenure servers for tests.
package testutil

import (
	"context"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/daemon"
)

// tLogWriter routes server logs to t.Log.
type tLogWriter struct{ t testing.TB }

func (w tLogWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// Server is an in-process server with its data in a temp dir.
type Server struct {
	*daemon.Daemon
	DataDir string
	cancel  context.CancelFunc
	done    chan error
}

// Start starts a single-node server on a free loopback port, with data in
// dataDir ("" for a fresh temp dir) and clk (nil for the real clock). It is
// stopped when the test ends.
func Start(t testing.TB, dataDir string, clk clock.Clock) *Server {
	t.Helper()
	return StartConfig(t, daemon.Config{DataDir: dataDir, Clock: clk})
}

// StartConfig is Start with more of the daemon's configuration; NodeID,
// Listen and LogOutput are filled in.
func StartConfig(t testing.TB, cfg daemon.Config) *Server {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	dataDir := cfg.DataDir
	cfg.NodeID, cfg.Listen, cfg.LogOutput = "n1", "127.0.0.1:0", tLogWriter{t}
	d, err := daemon.Start(cfg)
	if err != nil {
		t.Fatalf("start server: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Daemon: d, DataDir: dataDir, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- d.Run(ctx) }()
	select {
	case <-d.Ready():
	case err := <-s.done:
		t.Fatalf("server stopped before ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("server not ready after 20s")
	}
	t.Cleanup(func() { s.Stop(t) })
	return s
}

// Stop stops the server and waits for it; it is idempotent.
func (s *Server) Stop(t testing.TB) {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	if err := <-s.done; err != nil {
		t.Errorf("server stopped with: %v", err)
	}
}
