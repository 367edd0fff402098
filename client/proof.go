package client

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/fenceproof"
)

// ErrForged: a fenced write's fence proof (WithProof) did not verify for
// its token and lock; nothing was stored. It is also ErrInvalid.
var ErrForged = errors.New("tenure: forged fence proof")

// ForgedProofError is the error of a fenced write whose proof did not
// verify; it matches ErrForged and ErrInvalid.
type ForgedProofError struct {
	// Token and Lock are what the proof was checked for.
	Token uint64
	Lock  string
	// Reason says why it did not verify.
	Reason string
	msg    string
}

func (e *ForgedProofError) Error() string { return e.msg }

// Is makes errors.Is(err, ErrForged) and errors.Is(err, ErrInvalid) hold.
func (e *ForgedProofError) Is(target error) bool { return target == ErrForged || target == ErrInvalid }

// WithProof sends the grant's fence proof (Hold.Proof) with a fenced
// write: the service then refuses the write, with a *ForgedProofError,
// unless the proof verifies for the token and the lock (WithLock's, or
// else a lock named like the register's key). An empty proof is an error.
func WithProof(proof string) FenceOption {
	return func(o *fenceOptions) error {
		if proof == "" {
			return fmt.Errorf("%w: WithProof: the proof is empty", ErrInvalid)
		}
		o.proof = proof
		return nil
	}
}

// WithFenceProofs asks the server to sign a fence proof for every grant of
// this client's sessions (Hold.Proof): a resource that verifies proofs
// (pgguard, httpguard and epoch with a verifier) refuses a token without
// one as forged. Without it Hold.Proof is empty. Signing costs the server
// about 27 µs of CPU per grant (docs/benchmarks.md), which is why it is
// asked for. tenure lock, sem, rwlock and elect always ask.
func WithFenceProofs() Option {
	return func(o *dialOptions) error {
		o.proofs = true
		return nil
	}
}

// ClusterKeys returns the cluster's id and the public keys of its fence
// proofs, as a resource's verifier needs them (fenceproof.ParseKeyset
// reads their JSON; `tenure cluster keys -o json` prints it).
func (c *Client) ClusterKeys(ctx context.Context) (fenceproof.Keyset, error) {
	var resp *pb.ClusterKeysResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.ClusterKeys(ctx, &pb.ClusterKeysRequest{})
		return err
	})
	return keyset(resp), err
}

// RotateClusterKey adds a new signing key, which signs every grant from
// then on, and returns the keys. Older keys stay listed (at most 16):
// give the new keyset to every verifier before the old key is dropped.
func (c *Client) RotateClusterKey(ctx context.Context) (fenceproof.Keyset, error) {
	var resp *pb.ClusterKeysResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.ClusterKeyRotate(ctx, &pb.ClusterKeyRotateRequest{})
		return err
	})
	return keyset(resp), err
}

// RetireClusterKey retires signing key id, which must not be the active
// one (rotate first): it keeps verifying proofs for the grace after, and
// the cluster then removes it from its keys; with after 0 it is removed at
// once. Proofs it signed stop verifying on the server at its removal, and
// at a resource once its verifier's keyset is refreshed
// (fenceproof.Verifier.Refresh). It returns the keys.
func (c *Client) RetireClusterKey(ctx context.Context, id string, after time.Duration) (fenceproof.Keyset, error) {
	if after < 0 {
		return fenceproof.Keyset{}, fmt.Errorf("%w: RetireClusterKey: a negative grace", ErrInvalid)
	}
	req := &pb.ClusterKeyRetireRequest{Id: id, AfterMs: after.Milliseconds(), Now: after == 0}
	if after > 0 && req.AfterMs == 0 {
		req.AfterMs = 1
	}
	var resp *pb.ClusterKeysResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.ClusterKeyRetire(ctx, req)
		return err
	})
	return keyset(resp), err
}

func keyset(resp *pb.ClusterKeysResponse) fenceproof.Keyset {
	ks := fenceproof.Keyset{ClusterID: hex.EncodeToString(resp.GetClusterId()), Keys: []fenceproof.KeysetKey{}}
	for _, k := range resp.GetKeys() {
		ks.Keys = append(ks.Keys, fenceproof.KeysetKey{ID: k.GetId(), PublicKey: base64.RawURLEncoding.EncodeToString(k.GetPublicKey()), Active: k.GetActive(), Retired: k.GetRetired()})
	}
	return ks
}
