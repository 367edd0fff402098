package fenceproof_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"

	"github.com/tenure-io/tenure/fenceproof"
)

// cluster is a signing key and the verifier of its public half.
type cluster struct {
	id    []byte
	key   ed25519.PrivateKey
	keyID string
	v     *fenceproof.Verifier
}

func newCluster(t *testing.T) cluster {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id := make([]byte, 16)
	rand.Read(id)
	c := cluster{id: id, key: priv, keyID: fenceproof.KeyID(pub)}
	if c.v, err = fenceproof.NewVerifier(hex.EncodeToString(id), fenceproof.Key{ID: c.keyID, Public: pub}); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c cluster) sign(t *testing.T, lock string, token, session uint64) string {
	t.Helper()
	p, err := fenceproof.Sign(c.key, c.keyID, c.id, lock, token, session, token)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestVerify: a proof verifies for its lock and token only; a made-up
// proof, one of another lock, another token, another cluster or a changed
// byte is ErrForged.
func TestVerify(t *testing.T) {
	a, b := newCluster(t), newCluster(t)
	good := a.sign(t, "shard-7", 42, 9)
	if err := a.v.Verify("shard-7", 42, good); err != nil {
		t.Fatalf("a valid proof: %v", err)
	}
	p, err := fenceproof.Decode(good)
	if err != nil || p.Session != 9 || p.GrantRevision != 42 || p.KeyID != a.keyID {
		t.Fatalf("Decode = %+v, %v", p, err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(good)
	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)-1] ^= 1
	otherSession := append([]byte(nil), raw...)
	otherSession[1+8+7] ^= 1 // the session: the signature covers it
	random := make([]byte, len(raw))
	rand.Read(random)
	random[0] = 1
	copy(random[1:9], raw[1:9]) // a known key id, a made-up signature
	for name, c := range map[string]struct {
		lock  string
		token uint64
		proof string
	}{
		"no proof":            {"shard-7", 42, ""},
		"not base64":          {"shard-7", 42, "!!!"},
		"too short":           {"shard-7", 42, good[:50]},
		"another lock":        {"shard-8", 42, good},
		"a larger token":      {"shard-7", 999999999, good},
		"another cluster":     {"shard-7", 42, b.sign(t, "shard-7", 42, 9)},
		"a changed signature": {"shard-7", 42, base64.RawURLEncoding.EncodeToString(flipped)},
		"a changed session":   {"shard-7", 42, base64.RawURLEncoding.EncodeToString(otherSession)},
		"a made-up signature": {"shard-7", 42, base64.RawURLEncoding.EncodeToString(random)},
	} {
		if err := a.v.Verify(c.lock, c.token, c.proof); !errors.Is(err, fenceproof.ErrForged) {
			t.Errorf("%s: %v, want ErrForged", name, err)
		}
	}
}

// TestParseKeyset: the JSON of `tenure cluster keys` gives a verifier of
// every key listed; a key whose id is not its public key's is refused.
func TestParseKeyset(t *testing.T) {
	a := newCluster(t)
	pub := a.key.Public().(ed25519.PublicKey)
	ks := fenceproof.Keyset{ClusterID: hex.EncodeToString(a.id), Keys: []fenceproof.KeysetKey{{ID: a.keyID, PublicKey: base64.RawURLEncoding.EncodeToString(pub), Active: true}}}
	data, _ := json.Marshal(ks)
	v, err := fenceproof.ParseKeyset(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify("L", 5, a.sign(t, "L", 5, 1)); err != nil {
		t.Fatalf("verifier from the keyset: %v", err)
	}
	ks.Keys[0].ID = "0000000000000000"
	data, _ = json.Marshal(ks)
	if _, err := fenceproof.ParseKeyset(data); err == nil {
		t.Fatal("a key id that is not its key's was accepted")
	}
}
