package fsm

import (
	"crypto/ed25519"
	"fmt"

	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// The cluster's identity and signing keys. The first key, and the
// cluster's id with it, is added by the first leader (which draws both):
// every grant's fence proof is signed with the newest key, on the node
// that answers the grant (see the server), never in Apply. Keys are part
// of the replicated state and its snapshots, so every leader signs with
// the same key; the state holds the private seeds, and so a snapshot file
// is as secret as the keys.

// ClusterIDBytes is the size of a cluster id.
const ClusterIDBytes = 16

func validateKey(k *fsmpb.SigningKey) error {
	if len(k.GetSeed()) != ed25519.SeedSize {
		return fmt.Errorf("%w: a signing key's seed is %d bytes, not %d", ErrInvalid, len(k.GetSeed()), ed25519.SeedSize)
	}
	pub := ed25519.NewKeyFromSeed(k.GetSeed()).Public().(ed25519.PublicKey)
	if id := fenceproof.KeyID(pub); id != k.GetId() {
		return fmt.Errorf("%w: signing key id %q is not its public key's (%s)", ErrInvalid, k.GetId(), id)
	}
	return nil
}

// Public is the key's public half.
func (k SigningKey) Public() ed25519.PublicKey {
	return ed25519.NewKeyFromSeed(k.Seed).Public().(ed25519.PublicKey)
}

// ActiveKey is the key that signs new grants; false before the first.
func (sec *Security) ActiveKey() (SigningKey, bool) {
	if len(sec.Keys) == 0 {
		return SigningKey{}, false
	}
	return sec.Keys[len(sec.Keys)-1], true
}

func (s *State) addSigningKey(c *fsmpb.AddSigningKey) Result {
	if c.GetOnlyIfNone() && len(s.sec.Keys) > 0 {
		return Result{} // another leader made one first
	}
	if err := validateKey(c.GetKey()); err != nil {
		return Result{Err: err}
	}
	if len(s.sec.ClusterID) == 0 && len(c.GetClusterId()) != ClusterIDBytes {
		return Result{Err: fmt.Errorf("%w: the first signing key needs a cluster id of %d bytes", ErrInvalid, ClusterIDBytes)}
	}
	for _, k := range s.sec.Keys {
		if k.ID == c.GetKey().GetId() {
			return Result{Err: fmt.Errorf("%w: signing key %s exists", ErrInvalid, k.ID)}
		}
	}
	rev := s.bump()
	sec := s.sec.clone()
	if len(sec.ClusterID) == 0 {
		sec.ClusterID = append([]byte(nil), c.GetClusterId()...)
	}
	sec.Keys = append(sec.Keys, SigningKey{ID: c.GetKey().GetId(), Seed: append([]byte(nil), c.GetKey().GetSeed()...), CreateRevision: rev})
	if len(sec.Keys) > MaxSigningKeys { // the oldest goes: its proofs stop verifying
		sec.Keys = append([]SigningKey(nil), sec.Keys[len(sec.Keys)-MaxSigningKeys:]...)
	}
	s.sec = sec
	return Result{}
}
