package fenceproof_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-io/tenure/fenceproof"
)

func keysetOf(id []byte, pubs ...[]byte) fenceproof.Keyset {
	ks := fenceproof.Keyset{ClusterID: hex.EncodeToString(id)}
	for _, p := range pubs {
		ks.Keys = append(ks.Keys, fenceproof.KeysetKey{ID: fenceproof.KeyID(p), PublicKey: base64.RawURLEncoding.EncodeToString(p)})
	}
	return ks
}

// TestVerifierReplace: a keyset without a key drops it (its proofs are
// forged from then on); a keyset of another cluster, an empty one and a
// malformed one are refused and the keys stay.
func TestVerifierReplace(t *testing.T) {
	a, b := newCluster(t), newCluster(t)
	pubA := []byte(a.key.Public().(ed25519.PublicKey))
	pubB := []byte(b.key.Public().(ed25519.PublicKey))
	v := a.v
	proof := a.sign(t, "L", 7, 1)
	both := keysetOf(a.id, pubA, pubB)
	if err := v.Replace(both); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify("L", 7, proof); err != nil {
		t.Fatal(err)
	}
	bad := keysetOf(a.id, pubA)
	bad.Keys[0].PublicKey = "!"
	for name, ks := range map[string]fenceproof.Keyset{
		"another cluster": keysetOf(b.id, pubB),
		"no keys":         keysetOf(a.id),
		"malformed":       bad,
	} {
		if err := v.Replace(ks); err == nil {
			t.Fatalf("%s: accepted", name)
		}
		if err := v.Verify("L", 7, proof); err != nil {
			t.Fatalf("after a refused keyset (%s): %v", name, err)
		}
	}
	if err := v.Replace(keysetOf(a.id, pubB)); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify("L", 7, proof); !errors.Is(err, fenceproof.ErrForged) {
		t.Fatalf("a dropped key's proof: %v, want forged", err)
	}
}

// TestVerifierRefresh: Refresh replaces the keys at once and every
// interval, hands a failed fetch to onErr and keeps the keys, and returns
// when its context ends.
func TestVerifierRefresh(t *testing.T) {
	a := newCluster(t)
	pubA := []byte(a.key.Public().(ed25519.PublicKey))
	other := newCluster(t)
	proof := a.sign(t, "L", 7, 1)
	var fetches atomic.Int64
	var failed atomic.Int64
	fetch := func(context.Context) (fenceproof.Keyset, error) {
		switch fetches.Add(1) {
		case 1:
			return fenceproof.Keyset{}, errors.New("unreachable")
		case 2:
			return keysetOf(a.id, pubA), nil
		}
		return keysetOf(a.id, []byte(other.key.Public().(ed25519.PublicKey))), nil // a rotated, a retired
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.v.Refresh(ctx, time.Millisecond, fetch, func(error) { failed.Add(1) }) }()
	deadline := time.Now().Add(10 * time.Second)
	for !errors.Is(a.v.Verify("L", 7, proof), fenceproof.ErrForged) {
		if time.Now().After(deadline) {
			t.Fatal("the refreshed keyset was never used")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Refresh returned %v", err)
	}
	if failed.Load() != 1 {
		t.Fatalf("onErr called %d times, want 1", failed.Load())
	}
}
