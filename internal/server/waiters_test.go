package server_test

import (
	"bytes"
	"context"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// streamGoroutines counts the goroutines working for a session stream of
// the server (a frame of a session stream or of one of its acquires).
func streamGoroutines(t *testing.T) int {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "internal/server.(*sessionStream)") || strings.Contains(g, "internal/server.(*pendingAcquire)") {
			n++
		}
	}
	return n
}

// TestQueuedAcquiresParkNoGoroutine: waiters in line cost the server no
// goroutine each (the hub's grant answers them), and they are still
// granted in order once the holder lets go.
func TestQueuedAcquiresParkNoGoroutine(t *testing.T) {
	const n = 300
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	holder, err := c.NewSession(ctx, client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	hm, _ := holder.Mutex("line")
	first, err := hm.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sessions := make([]*client.Session, n)
	for i := range sessions {
		if sessions[i], err = c.NewSession(ctx, client.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	granted, errs := testutil.QueueWaiters(t, ctx, sessions, "line")
	if g := streamGoroutines(t); g > n/10 {
		t.Fatalf("%d goroutines work for session streams with %d waiters in line", g, n)
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFIFO(t, ctx, granted, errs, n, first.Token())
}
