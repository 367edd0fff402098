package server_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestFencedPutNamingAnotherLock: a holder of res/A, with A's token and
// A's fence proof, writes register res/B naming --lock res/A. res/B was
// first written by res/B's holder naming res/B, so the register is bound
// to res/B: the write is refused invalid (a *client.WrongLockError naming
// both locks) and the register keeps res/B's value. Before, the sender
// chose the lock its token was checked against, and the write was
// accepted (A's token is newer than B's).
func TestFencedPutNamingAnotherLock(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr(), client.WithFenceProofs())
	hb := testutil.Lock(t, ctx, c, "res/B")
	if _, err := c.FencedPut(ctx, "res/B", []byte("b1"), hb.Token(), "", client.WithLock("res/B"), client.WithProof(hb.Proof())); err != nil {
		t.Fatal(err)
	}
	ha := testutil.Lock(t, ctx, c, "res/A")
	if ha.Token() <= hb.Token() || ha.Proof() == "" {
		t.Fatalf("A's grant: token %d (B's %d), proof %q", ha.Token(), hb.Token(), ha.Proof())
	}
	_, err := c.FencedPut(ctx, "res/B", []byte("evil"), ha.Token(), "", client.WithLock("res/A"), client.WithProof(ha.Proof()))
	var wl *client.WrongLockError
	if !errors.As(err, &wl) || !errors.Is(err, client.ErrInvalid) || wl.Key != "res/B" || wl.Bound != "res/B" || wl.Lock != "res/A" {
		t.Fatalf("fenced put at res/B naming res/A with A's token and proof: %v, want invalid (wrong lock)", err)
	}
	_, err = c.FencedDelete(ctx, "res/B", ha.Token(), "", client.WithLock("res/A"), client.WithProof(ha.Proof()))
	if !errors.As(err, &wl) {
		t.Fatalf("fenced delete at res/B naming res/A: %v, want invalid (wrong lock)", err)
	}
	// Naming no lock, the register's own lock checks the token: stale.
	if _, err := c.FencedPut(ctx, "res/B", []byte("evil"), ha.Token(), ""); !errors.Is(err, client.ErrStale) {
		t.Fatalf("fenced put at res/B naming no lock with A's token: %v, want stale", err)
	}
	got, err := c.FencedGet(ctx, "res/B")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Value) != "b1" || got.Token != hb.Token() {
		t.Fatalf("res/B after the refused writes: %q at token %d, want b1 at %d", got.Value, got.Token, hb.Token())
	}
	// res/B's holder still writes.
	if _, err := c.FencedPut(ctx, "res/B", []byte("b2"), hb.Token(), "", client.WithLock("res/B"), client.WithProof(hb.Proof())); err != nil {
		t.Fatal(err)
	}
}
