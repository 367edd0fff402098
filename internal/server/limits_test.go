package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestLimitsRefuseClearlyAndKeepServing: past a limit a request gets
// ErrLimit naming the limit; everything within the limits still works.
func TestLimitsRefuseClearlyAndKeepServing(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{MaxSessions: 3, MaxWaiters: 1}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	s1 := testutil.Session(t, ctx, c)
	s2 := testutil.Session(t, ctx, c)
	s3 := testutil.Session(t, ctx, c)
	if _, err := c.NewSession(ctx); !errors.Is(err, client.ErrLimit) || !strings.Contains(err.Error(), "--max-sessions") {
		t.Fatalf("fourth session: %v, want ErrLimit naming --max-sessions", err)
	}
	m1, _ := s1.Mutex("l")
	h, err := m1.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m2, _ := s2.Mutex("l")
	queued := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		_, err := m2.Lock(ctx, client.OnQueued(func(int) { close(queued) }))
		got <- err
	}()
	<-queued
	m3, _ := s3.Mutex("l")
	if _, err := m3.Lock(ctx); !errors.Is(err, client.ErrLimit) || !strings.Contains(err.Error(), "--max-waiters") {
		t.Fatalf("second waiter: %v, want ErrLimit naming --max-waiters", err)
	}
	// Within the limits everything goes on.
	other, _ := s3.Mutex("other")
	if _, err := other.Lock(ctx); err != nil {
		t.Fatalf("lock within the limits: %v", err)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("queued waiter: %v", err)
	}
}

// TestSizeLimits: names and fenced values past the configured sizes are
// refused as invalid with a message naming the flag; a limit above what
// the state machine stores is refused at start.
func TestSizeLimits(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{MaxNameBytes: 8, MaxRegisterValueBytes: 4}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	s := testutil.Session(t, ctx, c)
	long, _ := s.Mutex("123456789")
	if _, err := long.Lock(ctx); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "--max-name-len") {
		t.Fatalf("9-byte lock name: %v, want ErrInvalid naming --max-name-len", err)
	}
	ok, _ := s.Mutex("12345678")
	if _, err := ok.Lock(ctx); err != nil {
		t.Fatalf("8-byte lock name: %v", err)
	}
	if _, err := c.FencedPut(ctx, "k", []byte("12345"), 1, ""); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "--max-register-value-len") {
		t.Fatalf("5-byte value: %v, want ErrInvalid naming --max-register-value-len", err)
	}
	if _, err := c.FencedPut(ctx, "123456789", []byte("1"), 1, ""); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("9-byte register key: %v, want ErrInvalid", err)
	}
	if _, err := c.FencedPut(ctx, "k", []byte("1234"), 1, ""); err != nil {
		t.Fatalf("4-byte value: %v", err)
	}
	if _, err := daemon.Start(daemon.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Limits: server.Limits{MaxNameBytes: 100_000}}); err == nil || !strings.Contains(err.Error(), "--max-name-len") {
		t.Fatalf("start with --max-name-len 100000: %v", err)
	}
}
