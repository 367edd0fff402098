package clienttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestGivenUpAcquireIsWithdrawn: a Lock given up while it waits in line is
// withdrawn on the server, and the session may ask for the name again
// soon after (ErrLocked, not ErrAlreadyHeld). The server's "cancelled"
// answer settles the withdrawal: taking it for a node that cannot serve
// would withdraw again forever, breaking the session's stream each time
// (its other holds flapping to suspect) and keeping the name reserved.
func TestGivenUpAcquireIsWithdrawn(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dial(t, srv.Addr())
	a := testutil.Session(t, ctx, c, client.WithOwner("a"))
	b := testutil.Session(t, ctx, c, client.WithOwner("b"))
	ma, _ := a.Mutex("res")
	held, err := ma.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mo, _ := b.Mutex("other")
	other, err := mo.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	otherChanges := other.Changes()

	mb, _ := b.Mutex("res")
	wctx, giveUp := context.WithCancel(ctx)
	queued := make(chan int, 1)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := mb.Lock(wctx, client.OnQueued(func(p int) { queued <- p }))
		gaveUp <- err
	}()
	<-queued
	giveUp()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock given up: %v", err)
	}
	testutil.WaitFor(t, "the given-up acquire to be withdrawn (TryLock: ErrLocked, not ErrAlreadyHeld)", 10*time.Second, func() bool {
		_, err := mb.TryLock(ctx)
		return errors.Is(err, client.ErrLocked)
	})
	select {
	case st := <-otherChanges:
		t.Fatalf("the session's other hold moved to %v while the acquire was withdrawn", st)
	default:
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := mb.TryLock(ctx)
	if err != nil {
		t.Fatalf("after the holder let go: %v (the withdrawn waiter was granted?)", err)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
