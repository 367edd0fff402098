package fsm

import (
	"crypto/ed25519"
	"fmt"
	"slices"
	"time"

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

// ActiveKey is the key that signs new grants (the newest, which is never
// retired); false before the first.
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

// Retiring a key
//
// A key other than the active one is retired in two steps, so that time
// never enters Apply: RetireSigningKey marks it retired with a grace (it
// keeps verifying, and the keyset lists it as retired), and once the grace
// has passed on the leader's clock the leader proposes RemoveSigningKey,
// which takes it out of the keyset: proofs it signed no longer verify, on
// the server at once and at a guard once its keyset is refreshed. An
// operator who must cut a leaked key off at once proposes
// RemoveSigningKey directly (`tenure cluster keys retire KID --now`). The
// active key is never retired or removed: rotate first.

// MaxRetireGrace bounds the grace of a retired key.
const MaxRetireGrace = 365 * 24 * time.Hour

// keyIndex returns the index of key id in sec.Keys, or -1.
func (sec *Security) keyIndex(id string) int {
	return slices.IndexFunc(sec.Keys, func(k SigningKey) bool { return k.ID == id })
}

// checkRetirable refuses an unknown key and the active one.
func (sec *Security) checkRetirable(id, what string) error {
	i := sec.keyIndex(id)
	switch {
	case i < 0:
		return fmt.Errorf("%w: no signing key %q (tenure cluster keys lists them)", ErrInvalid, id)
	case i == len(sec.Keys)-1 && len(sec.Keys) == 1:
		return fmt.Errorf("%w: signing key %s is the cluster's only key and signs every grant: rotate first (tenure cluster keys rotate), then %s it", ErrInvalid, id, what)
	case i == len(sec.Keys)-1:
		return fmt.Errorf("%w: signing key %s is the active key and signs every grant: rotate first (tenure cluster keys rotate), then %s it", ErrInvalid, id, what)
	}
	return nil
}

func (s *State) retireSigningKey(c *fsmpb.RetireSigningKey) Result {
	if err := s.sec.checkRetirable(c.GetId(), "retire"); err != nil {
		return Result{Err: err}
	}
	grace := time.Duration(c.GetGraceMs()) * time.Millisecond
	if c.GetGraceMs() <= 0 || grace > MaxRetireGrace {
		return Result{Err: fmt.Errorf("%w: a retired key's grace must be above 0 and at most %v (to remove it at once: --now)", ErrInvalid, MaxRetireGrace)}
	}
	rev := s.bump()
	sec := s.sec.clone()
	k := &sec.Keys[sec.keyIndex(c.GetId())]
	k.RetiredRevision, k.RetireGrace = rev, grace
	s.sec = sec
	return Result{}
}

func (s *State) removeSigningKey(c *fsmpb.RemoveSigningKey) Result {
	if err := s.sec.checkRetirable(c.GetId(), "remove"); err != nil {
		return Result{Err: err}
	}
	s.bump()
	sec := s.sec.clone()
	sec.Keys = slices.Delete(sec.Keys, sec.keyIndex(c.GetId()), sec.keyIndex(c.GetId())+1)
	s.sec = sec
	return Result{}
}

// ExportSecurity returns sec as a snapshot holds it (nil when empty): a
// restore that keeps the running cluster's ACLs and keys puts it into the
// restored snapshot.
func ExportSecurity(sec *Security) *fsmpb.Security { return exportSecurity(sec) }
