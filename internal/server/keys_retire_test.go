package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestRetiredKeyStopsVerifying: the only (active) key cannot be retired;
// after a rotation the old key, retired with a grace, is listed as
// retired and still verifies, on the server and at a guard; retired --now
// it is gone at once: a fenced write with a proof it signed is forged on
// the server, and a guard's verifier refuses it once its keyset is
// refreshed. A key retired with a grace is removed by the leader once the
// grace has passed, and a refreshing verifier drops it by itself.
func TestRetiredKeyStopsVerifying(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testutil.Dial(t, srv.Addr(), client.WithFenceProofs())
	ks, err := c.ClusterKeys(ctx)
	if err != nil || len(ks.Keys) != 1 {
		t.Fatalf("keys %+v %v", ks, err)
	}
	a := ks.Keys[0].ID
	guard := testutil.Verifier(t, ctx, c)
	ha := testutil.Lock(t, ctx, c, "A")
	putA := func() error {
		_, err := c.FencedPut(ctx, "A", []byte("v"), ha.Token(), "", client.WithProof(ha.Proof()))
		return err
	}

	for _, after := range []time.Duration{0, time.Hour} {
		if _, err := c.RetireClusterKey(ctx, a, after); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "rotate first") {
			t.Fatalf("retiring the only key (after %v): %v", after, err)
		}
	}
	rotated, err := c.RotateClusterKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := rotated.Keys[1].ID
	if _, err := c.RetireClusterKey(ctx, b, time.Hour); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("retiring the active key: %v", err)
	}
	retired, err := c.RetireClusterKey(ctx, a, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(retired.Keys) != 2 || !retired.Keys[0].Retired || retired.Keys[0].Active || !retired.Keys[1].Active || retired.Keys[1].Retired {
		t.Fatalf("keys after retiring %s with a grace: %+v", a, retired.Keys)
	}
	if err := putA(); err != nil {
		t.Fatalf("a proof of a key in its grace: %v", err)
	}
	if err := guard.Replace(retired); err != nil {
		t.Fatal(err)
	}
	if err := guard.Verify("A", ha.Token(), ha.Proof()); err != nil {
		t.Fatalf("a guard refused a key in its grace: %v", err)
	}

	gone, err := c.RetireClusterKey(ctx, a, 0) // --now
	if err != nil {
		t.Fatal(err)
	}
	if len(gone.Keys) != 1 || gone.Keys[0].ID != b {
		t.Fatalf("keys after removing %s: %+v", a, gone.Keys)
	}
	if err := putA(); !errors.Is(err, client.ErrForged) {
		t.Fatalf("a write with a removed key's proof: %v, want forged", err)
	}
	if err := guard.Verify("A", ha.Token(), ha.Proof()); err != nil {
		t.Fatalf("a guard refused the key before its keyset was refreshed: %v", err)
	}
	if err := guard.Replace(gone); err != nil {
		t.Fatal(err)
	}
	if err := guard.Verify("A", ha.Token(), ha.Proof()); !errors.Is(err, fenceproof.ErrForged) {
		t.Fatalf("a refreshed guard accepted a removed key's proof: %v", err)
	}

	// A grace that passes: the leader removes the key, and a refreshing
	// verifier drops it.
	hb := testutil.Lock(t, ctx, c, "B")
	if _, err := c.RotateClusterKey(ctx); err != nil {
		t.Fatal(err)
	}
	refreshing := testutil.Verifier(t, ctx, c)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- refreshing.Refresh(rctx, 50*time.Millisecond, c.ClusterKeys, nil) }()
	defer func() { stop(); <-done }()
	if _, err := c.RetireClusterKey(ctx, b, time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the leader removes the retired key and the verifier drops it", 15*time.Second, func() bool {
		return errors.Is(refreshing.Verify("B", hb.Token(), hb.Proof()), fenceproof.ErrForged)
	})
	if ks, err := c.ClusterKeys(ctx); err != nil || len(ks.Keys) != 1 || ks.Keys[0].ID == b {
		t.Fatalf("keys after the grace: %+v %v", ks, err)
	}
}
