package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestHerd queues 1,000 waiters on one lock over real sessions and checks
// that every hand-off grants the next waiter in arrival order, with a
// larger token. (That a grant wakes only the request it is for is
// TestHubRoutesAGrantToItsRequestOnly.)
func TestHerd(t *testing.T) {
	const n = 1000
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	holder, err := c.NewSession(ctx, client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	hm, _ := holder.Mutex("herd")
	first, err := hm.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	type grant struct {
		i     int
		token uint64
	}
	granted := make(chan grant, n)
	errs := make(chan error, n)
	sessions := make([]*client.Session, n)
	for i := range sessions {
		s, err := c.NewSession(ctx, client.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	for i, s := range sessions {
		m, _ := s.Mutex("herd")
		queued := make(chan int, 1)
		go func() {
			h, err := m.Lock(ctx, client.OnQueued(func(p int) { queued <- p }))
			if err != nil {
				errs <- err
				return
			}
			granted <- grant{i, h.Token()}
			if err := h.Unlock(ctx); err != nil {
				errs <- err
			}
		}()
		select {
		case p := <-queued: // arrival order is the order of queueing
			if p != i+1 {
				t.Fatalf("waiter %d queued at position %d", i, p)
			}
		case err := <-errs:
			t.Fatal(err)
		}
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	last := first.Token()
	for k := 0; k < n; k++ {
		select {
		case g := <-granted:
			if g.i != k {
				t.Fatalf("grant %d went to waiter %d: not FIFO", k, g.i)
			}
			if g.token <= last {
				t.Fatalf("token %d not above %d", g.token, last)
			}
			last = g.token
		case err := <-errs:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatalf("only %d of %d grants", k, n)
		}
	}
	for _, s := range sessions {
		s.Close(ctx)
	}
	holder.Close(ctx)
}
