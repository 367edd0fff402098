package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/internal/testutil"
)

// verifierOf builds a verifier from the cluster's keys, through the JSON
// a resource would be configured with.
func verifierOf(t *testing.T, ctx context.Context, c *client.Client) (*fenceproof.Verifier, fenceproof.Keyset) {
	t.Helper()
	ks, err := c.ClusterKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(ks)
	if err != nil {
		t.Fatal(err)
	}
	v, err := fenceproof.ParseKeyset(data)
	if err != nil {
		t.Fatalf("keyset %s: %v", data, err)
	}
	return v, ks
}

// TestGrantsCarryProofs: every grant of a client that asks for proofs (at
// once or after a wait, a mutex or a semaphore, on a shared or an own
// stream) carries a proof that the
// cluster's public keys verify for its lock and token, and for nothing
// else; after a key rotation new grants are signed by the new key and old
// proofs still verify.
func TestGrantsCarryProofs(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr(), client.WithFenceProofs())
	v, ks := verifierOf(t, ctx, c)
	if len(ks.Keys) != 1 || !ks.Keys[0].Active || len(ks.ClusterID) != 32 {
		t.Fatalf("a new cluster's keys: %+v", ks)
	}
	check := func(what string, h *client.Hold) {
		t.Helper()
		if err := v.Verify(h.Name(), h.Token(), h.Proof()); err != nil {
			t.Fatalf("%s: the proof %q does not verify: %v", what, h.Proof(), err)
		}
		if err := v.Verify(h.Name()+"x", h.Token(), h.Proof()); !errors.Is(err, fenceproof.ErrForged) {
			t.Fatalf("%s: the proof verifies for another lock: %v", what, err)
		}
		if err := v.Verify(h.Name(), h.Token()+1, h.Proof()); !errors.Is(err, fenceproof.ErrForged) {
			t.Fatalf("%s: the proof verifies for another token: %v", what, err)
		}
		p, _ := fenceproof.Decode(h.Proof())
		if p.Session != h.SessionID() {
			t.Fatalf("%s: the proof names session %d, the grant is %d's", what, p.Session, h.SessionID())
		}
	}
	a := testutil.Session(t, ctx, c, client.WithTTL(5*time.Second))
	b := testutil.Session(t, ctx, c, client.WithTTL(5*time.Second))
	ma, _ := a.Mutex("L")
	ha, err := ma.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("an immediate grant", ha)
	mb, _ := b.Mutex("L")
	got := make(chan *client.Hold, 1)
	go func() {
		h, err := mb.Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	testutilPoll(t, func() bool { st, _ := c.LockStatus(ctx, "L"); return len(st.GetWaiters()) == 1 })
	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	hb := <-got
	check("a grant after a wait", hb)

	sem, _ := a.Mutex("S", client.WithPermits(3))
	hs, err := sem.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("a semaphore's grant", hs)

	bare := testutil.Dial(t, srv.Addr())
	if hx := testutil.Lock(t, ctx, bare, "X"); hx.Proof() != "" {
		t.Fatalf("a client that did not ask for proofs got one: %q", hx.Proof())
	}

	rotated, err := c.RotateClusterKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rotated.Keys) != 2 || rotated.Keys[0].Active || !rotated.Keys[1].Active || rotated.ClusterID != ks.ClusterID {
		t.Fatalf("after a rotation: %+v", rotated)
	}
	v2, _ := verifierOf(t, ctx, c)
	mn, _ := a.Mutex("N")
	hn, err := mn.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := fenceproof.Decode(hn.Proof()); p.KeyID != rotated.Keys[1].ID {
		t.Fatalf("a grant after the rotation is signed by %s, not the new key %s", p.KeyID, rotated.Keys[1].ID)
	}
	if err := v.Verify("N", hn.Token(), hn.Proof()); !errors.Is(err, fenceproof.ErrForged) {
		t.Fatalf("a verifier of the old keys accepted the new key's proof: %v", err)
	}
	v = v2
	check("a grant after the rotation", hn)
	check("an old grant, with the new keyset", hb)
}

// TestFencedPutProof: a fenced write with a proof is stored only if the
// proof verifies for its token and lock; a forged one is a
// ForgedProofError (ErrForged, ErrInvalid) and stores nothing.
func TestFencedPutProof(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr(), client.WithFenceProofs())
	s := testutil.Session(t, ctx, c, client.WithTTL(5*time.Second))
	m, _ := s.Mutex("L")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := s.Mutex("M")
	hm, err := other.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, try := range map[string]func() (client.PutResult, error){
		"a made-up proof": func() (client.PutResult, error) {
			return c.FencedPut(ctx, "reg", []byte("x"), h.Token(), "", client.WithLock("L"), client.WithProof(flip(h.Proof(), 80)))
		},
		"another lock's proof": func() (client.PutResult, error) {
			return c.FencedPut(ctx, "reg", []byte("x"), hm.Token(), "", client.WithLock("L"), client.WithProof(hm.Proof()))
		},
		"a larger token with a real proof": func() (client.PutResult, error) {
			return c.FencedPut(ctx, "L", []byte("x"), hm.Token(), "", client.WithProof(h.Proof()))
		},
	} {
		_, err := try()
		var fe *client.ForgedProofError
		if !errors.As(err, &fe) || !errors.Is(err, client.ErrForged) || !errors.Is(err, client.ErrInvalid) {
			t.Fatalf("%s: %v, want a ForgedProofError", name, err)
		}
	}
	if r, _ := c.FencedGet(ctx, "reg"); r.Found {
		t.Fatal("a forged write stored something")
	}
	if _, err := c.FencedPut(ctx, "reg", []byte("v"), h.Token(), "", client.WithLock("L"), client.WithProof(h.Proof())); err != nil {
		t.Fatalf("a write with its grant's proof: %v", err)
	}
	if _, err := c.FencedPut(ctx, "L", []byte("v"), h.Token(), "", client.WithProof(h.Proof())); err != nil {
		t.Fatalf("a write to the lock's own key with its proof: %v", err)
	}
}

func testutilPoll(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// flip changes the character at i of a base64url string (to another
// character of the alphabet).
func flip(s string, i int) string {
	b := []byte(s)
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
