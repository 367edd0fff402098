package server

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
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

// granted is the answer to pending acquire p, granted with token: with
// its proof if p asked for one.
func (ss *sessionStream) granted(p *pendingAcquire, token uint64) *pb.SessionResponse {
	ss.conn.srv.hub.metrics.ObserveLockWait(fsm.LockKind(p.permits, p.shared, p.election), time.Since(p.start))
	g := &pb.LockGranted{Name: p.name, Token: token}
	if p.proof {
		g.Proof = ss.conn.srv.proof(p.name, token, ss.id)
	}
	return &pb.SessionResponse{Id: p.id, Result: &pb.SessionResponse_Granted{Granted: g}}
}

// verifierCache holds a verifier of the newest Security seen.
type verifierCache struct {
	p atomic.Pointer[verifierFor]
}

type verifierFor struct {
	sec *fsm.Security
	v   *fenceproof.Verifier // nil: the cluster has no key
}

// get returns a verifier of sec's keys, or nil if it has none.
func (c *verifierCache) get(sec *fsm.Security) *fenceproof.Verifier {
	if vf := c.p.Load(); vf != nil && vf.sec == sec {
		return vf.v
	}
	vf := &verifierFor{sec: sec}
	if len(sec.Keys) > 0 {
		keys := make([]fenceproof.Key, 0, len(sec.Keys))
		for _, k := range sec.Keys {
			keys = append(keys, fenceproof.Key{ID: k.ID, Public: k.Public()})
		}
		vf.v, _ = fenceproof.NewVerifier(hex.EncodeToString(sec.ClusterID), keys...) // validated by the state machine
	}
	c.p.Store(vf)
	return vf.v
}

// ForgedProofError: a fenced write's proof did not verify (see
// checkProof). The server answers INVALID_ARGUMENT with a ForgedProof
// detail.
type ForgedProofError struct {
	Token  uint64
	Lock   string
	Reason string
}

func (e *ForgedProofError) Error() string {
	return fmt.Sprintf("%v: forged fence proof for token %d of lock %q: %s", fsm.ErrInvalid, e.Token, e.Lock, e.Reason)
}

// Unwrap makes it match fsm.ErrInvalid.
func (e *ForgedProofError) Unwrap() error { return fsm.ErrInvalid }

// checkProof verifies a fenced write's proof, if it has one, for token and
// lock (or, without a lock, a lock named like key).
func (s *Server) checkProof(key, lock, proof string, token uint64) error {
	if proof == "" {
		return nil
	}
	if lock == "" {
		lock = key
	}
	v := s.verifiers.get(s.node.Security())
	if v == nil {
		return &ForgedProofError{Token: token, Lock: lock, Reason: "the cluster has no signing key yet"}
	}
	if err := v.Verify(lock, token, proof); err != nil {
		return &ForgedProofError{Token: token, Lock: lock, Reason: strings.TrimPrefix(strings.TrimPrefix(err.Error(), fenceproof.ErrForged.Error()), ": ")}
	}
	return nil
}

// ClusterKeys implements pb.TenureServer.
func (s *Server) ClusterKeys(ctx context.Context, _ *pb.ClusterKeysRequest) (*pb.ClusterKeysResponse, error) {
	if err := s.node.LinearizableRead(ctx); err != nil {
		return nil, toStatus(err)
	}
	return keysOf(s.node.Security()), nil
}

// ClusterKeyRotate implements pb.TenureServer.
func (s *Server) ClusterKeyRotate(ctx context.Context, _ *pb.ClusterKeyRotateRequest) (*pb.ClusterKeysResponse, error) {
	add, err := node.NewSigningKey(false)
	if err != nil {
		return nil, toStatus(err)
	}
	if _, err := s.proposeACL(ctx, add); err != nil {
		return nil, err
	}
	return keysOf(s.node.Security()), nil
}

// ClusterKeyRetire implements pb.TenureServer: with now it proposes the
// key's removal, otherwise its retirement with the grace after_ms (the
// leader removes it once that has passed, node.retireKeys). Either is
// refused for the active key.
func (s *Server) ClusterKeyRetire(ctx context.Context, req *pb.ClusterKeyRetireRequest) (*pb.ClusterKeysResponse, error) {
	var op any = &fsmpb.RetireSigningKey{Id: req.GetId(), GraceMs: req.GetAfterMs()}
	switch {
	case req.GetNow() && req.GetAfterMs() != 0:
		return nil, toStatus(fmt.Errorf("%w: give a grace (--after) or --now, not both", fsm.ErrInvalid))
	case req.GetNow():
		op = &fsmpb.RemoveSigningKey{Id: req.GetId()}
	}
	if _, err := s.proposeACL(ctx, op); err != nil {
		return nil, err
	}
	s.log.Info("signing key retired", "key", req.GetId(), "now", req.GetNow(), "after_ms", req.GetAfterMs())
	return keysOf(s.node.Security()), nil
}

func keysOf(sec *fsm.Security) *pb.ClusterKeysResponse {
	out := &pb.ClusterKeysResponse{ClusterId: sec.ClusterID}
	for i, k := range sec.Keys {
		out.Keys = append(out.Keys, &pb.ClusterKey{Id: k.ID, PublicKey: k.Public(), Active: i == len(sec.Keys)-1, CreateRevision: k.CreateRevision,
			Retired: k.RetiredRevision != 0, RetiredRevision: k.RetiredRevision, RetireGraceMs: k.RetireGrace.Milliseconds()})
	}
	return out
}
