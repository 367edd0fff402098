package testutil

import (
	"context"
	"fmt"
	"testing"

	"github.com/tenure-io/tenure/client"
)

// Grant is a lock grant a test's waiter reports: which waiter (its index
// in arrival order) and the token it was granted.
type Grant struct {
	Waiter int
	Token  uint64
}

// QueueWaiters queues one waiter per session on the mutex name, in the
// order of sessions: it starts the next only once the previous has been
// queued at its position (i+1, behind a holder the caller keeps), and fails
// the test otherwise. Each waiter, once granted, sends its Grant and
// unlocks; errors (from Lock or Unlock) go to the second channel. Both
// channels are buffered for every waiter. Call it from the test's goroutine.
func QueueWaiters(t testing.TB, ctx context.Context, sessions []*client.Session, name string) (<-chan Grant, <-chan error) {
	t.Helper()
	granted := make(chan Grant, len(sessions))
	errs := make(chan error, len(sessions))
	for i, s := range sessions {
		m, err := s.Mutex(name)
		if err != nil {
			t.Fatal(err)
		}
		queued := make(chan int, 1)
		go func() {
			h, err := m.Lock(ctx, client.OnQueued(func(p int) {
				select {
				case queued <- p: // later reports (after a fail-over) are not checked
				default:
				}
			}))
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			granted <- Grant{Waiter: i, Token: h.Token()}
			if err := h.Unlock(ctx); err != nil {
				errs <- fmt.Errorf("waiter %d unlock: %w", i, err)
			}
		}()
		select {
		case p := <-queued:
			if p != i+1 {
				t.Fatalf("waiter %d queued at position %d, want %d", i, p, i+1)
			}
		case err := <-errs:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatalf("waiter %d not queued: %v", i, ctx.Err())
		}
	}
	return granted, errs
}

// CheckFIFO receives n grants from granted and fails the test unless the
// k-th went to waiter k with a token above every earlier one, the first
// above after. It fails on the first error from errs, or when ctx ends
// before all n have arrived. Call it from the test's goroutine.
func CheckFIFO(t testing.TB, ctx context.Context, granted <-chan Grant, errs <-chan error, n int, after uint64) {
	t.Helper()
	last := after
	for k := 0; k < n; k++ {
		select {
		case g := <-granted:
			if g.Waiter != k {
				t.Fatalf("grant %d went to waiter %d: not in arrival order", k, g.Waiter)
			}
			if g.Token <= last {
				t.Fatalf("grant %d: token %d not above %d", k, g.Token, last)
			}
			last = g.Token
		case err := <-errs:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatalf("only %d of %d waiters granted", k, n)
		}
	}
}
