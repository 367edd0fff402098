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
	testutil.Slow(t)
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

	sessions := make([]*client.Session, n)
	for i := range sessions {
		s, err := c.NewSession(ctx, client.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	granted, errs := testutil.QueueWaiters(t, ctx, sessions, "herd")
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFIFO(t, ctx, granted, errs, n, first.Token())
	for _, s := range sessions {
		s.Close(ctx)
	}
	holder.Close(ctx)
}
