package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestLimitsRefuseClearlyAndKeepServing: past a limit a request gets
// ErrLimit naming the limit; everything within the limits still works.
func TestLimitsRefuseClearlyAndKeepServing(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{ClusterLimits: fsm.Limits{MaxSessions: 3, MaxWaiters: 1}})
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

// TestLimitsHoldUnderConcurrentRequests: many clients ask for the last
// sessions, waiter places and keys at once; the limits are checked where
// the commands are applied, so exactly the limit is admitted.
func TestLimitsHoldUnderConcurrentRequests(t *testing.T) {
	const maxSessions, maxWaiters, maxKeys = 12, 5, 7
	srv := testutil.StartConfig(t, daemon.Config{ClusterLimits: fsm.Limits{MaxSessions: maxSessions, MaxWaiters: maxWaiters, MaxKeys: maxKeys}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())

	race := func(n int, fn func(i int) error) (ok int) {
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs <- fn(i) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, client.ErrLimit):
				t.Errorf("refused with %v, want ErrLimit", err)
			}
		}
		return ok
	}
	var mu sync.Mutex
	var sessions []*client.Session
	if got := race(3*maxSessions, func(int) error {
		s, err := c.NewSession(ctx)
		if err == nil {
			mu.Lock()
			sessions = append(sessions, s)
			mu.Unlock()
		}
		return err
	}); got != maxSessions {
		t.Fatalf("%d sessions admitted, want %d", got, maxSessions)
	}
	t.Cleanup(func() {
		for _, s := range sessions {
			_ = s.Close(context.Background())
		}
	})
	holder, _ := sessions[0].Mutex("l")
	if _, err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := race(len(sessions)-1, func(i int) error {
		m, _ := sessions[i+1].Mutex("l")
		queued := make(chan struct{}, 1)
		lctx, lcancel := context.WithCancel(ctx)
		defer lcancel()
		errc := make(chan error, 1)
		go func() {
			_, err := m.Lock(lctx, client.OnQueued(func(int) { queued <- struct{}{} }))
			errc <- err
		}()
		select {
		case err := <-errc:
			return err
		case <-queued:
			return nil // admitted as a waiter; the wait is withdrawn when we return
		}
	}); got != maxWaiters {
		t.Fatalf("%d waiters admitted, want %d", got, maxWaiters)
	}
	if got := race(3*maxKeys, func(i int) error {
		_, err := c.Put(ctx, fmt.Sprint("k", i), []byte("v"))
		return err
	}); got != maxKeys {
		t.Fatalf("%d keys admitted, want %d", got, maxKeys)
	}
}

// TestWatchLimits: watch streams (KVWatch and Observe) are bounded per
// connection and per node; a refused one names its limit, and a closed
// one frees its slot.
func TestWatchLimits(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{KV: server.KVLimits{MaxWatches: 3, MaxWatchesPerConnection: 2}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c1, c2, c3 := testutil.Dial(t, srv.Addr()), testutil.Dial(t, srv.Addr()), testutil.Dial(t, srv.Addr())
	wctx, wcancel := context.WithCancel(ctx)
	if _, err := c1.Watch(wctx, "a"); err != nil {
		t.Fatal(err)
	}
	o, err := c1.Observe(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	<-o.C // the server has taken the observation's slot once it answers
	if _, err := c1.Watch(ctx, "b"); !errors.Is(err, client.ErrLimit) || !strings.Contains(err.Error(), "--max-watches-per-connection") {
		t.Fatalf("third watch on one connection: %v", err)
	}
	if _, err := c2.Watch(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.Watch(ctx, "d"); !errors.Is(err, client.ErrLimit) || !strings.Contains(err.Error(), "--max-watches") {
		t.Fatalf("fourth watch on the node: %v", err)
	}
	wcancel() // frees c1's first slot once the server sees the stream end
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c3.Watch(ctx, "d")
		if err == nil {
			break
		}
		if !errors.Is(err, client.ErrLimit) || time.Now().After(deadline) {
			t.Fatalf("watch after a slot was freed: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // poll: the server learns of the cancel asynchronously
	}
}
