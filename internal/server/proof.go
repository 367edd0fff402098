package server

import (
	"crypto/ed25519"
	"sync/atomic"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/internal/fsm"
)

// Fence proofs (package fenceproof) are signed where a grant is answered:
// on the node that serves the session stream, which is the leader, once
// the grant is committed. Not in Apply: every replica would sign every
// grant, under the state's lock, for answers only one of them sends.
// Ed25519 signing is deterministic, so a grant answered again (a resumed
// acquire) gets the same proof. Signing costs about 27 µs of CPU on the
// machine of docs/benchmarks.md; the answer of an immediate grant is
// therefore signed and sent by a worker, never on the node's answering
// goroutine.

// signer is the active signing key, its private half expanded once.
type signer struct {
	sec       *fsm.Security // the Security it was made from
	keyID     string
	clusterID []byte
	key       ed25519.PrivateKey
}

// signerCache holds the signer of the newest Security seen.
type signerCache struct{ p atomic.Pointer[signer] }

// get returns the signer for sec, or nil while the cluster has no key.
func (c *signerCache) get(sec *fsm.Security) *signer {
	if s := c.p.Load(); s != nil && s.sec == sec {
		return s
	}
	k, ok := sec.ActiveKey()
	if !ok {
		return nil
	}
	if s := c.p.Load(); s != nil && s.keyID == k.ID {
		s2 := *s // same key, newer Security (an ACL change)
		s2.sec = sec
		c.p.Store(&s2)
		return &s2
	}
	s := &signer{sec: sec, keyID: k.ID, clusterID: sec.ClusterID, key: ed25519.NewKeyFromSeed(k.Seed)}
	c.p.Store(s)
	return s
}

// proof is the fence proof of a grant of lock name with token to session
// ("" while the cluster has no signing key). The grant revision is the
// token: a token is the revision of its grant.
func (s *Server) proof(name string, token, session uint64) string {
	sg := s.signers.get(s.node.Security())
	if sg == nil {
		return ""
	}
	p, err := fenceproof.Sign(sg.key, sg.keyID, sg.clusterID, name, token, session, token)
	if err != nil {
		return "" // a key id the state machine validated is always well formed
	}
	return p
}

// granted is the answer to acquire request id: a grant of lock name with
// token, with its proof.
func (ss *sessionStream) granted(id uint64, name string, token uint64) *pb.SessionResponse {
	return &pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Granted{Granted: &pb.LockGranted{Name: name, Token: token, Proof: ss.srv.proof(name, token, ss.id)}}}
}
