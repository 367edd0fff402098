// Package fenceproof signs and verifies fence proofs: a Tenure cluster's
// Ed25519 signature over one grant of one lock, which a resource checks
// offline, with the cluster's public keys, before it accepts a fencing
// token.
//
// A fencing token alone is a number: a resource that keeps the highest
// token it has accepted rejects lower ones, but it cannot tell a token
// Tenure issued from one a buggy or hostile writer made up, and a made-up
// large token makes every honest holder stale there. A proof closes that
// hole. Every grant carries one (client.Hold.Proof, TENURE_FENCE_PROOF
// under `tenure lock`): a signature by the cluster over
//
//	(cluster id, lock name, token, session, grant revision)
//
// with the key named by its key id. A resource given a Verifier (the
// cluster's id and public keys, as `tenure cluster keys -o json` prints
// them) accepts a token only with a proof that verifies for its own lock:
// a token never issued, a proof of another lock's grant, or one signed by
// another cluster is ErrForged, before any effect and with no round trip
// to Tenure.
//
// A proof says that the grant was issued, not that it is still held:
// ordering owners stays the resource's job (the highest accepted token
// wins), exactly as without proofs.
//
// # Format
//
// A proof is the URL-safe base64 (no padding) of
//
//	version (1 byte, 1) | key id (8 bytes) | session (8) | grant revision (8) | signature (64)
//
// integers big-endian. The signature is Ed25519 over Message. A key id is
// the first 8 bytes of the SHA-256 of the public key, written in hex.
package fenceproof

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ErrForged: a proof is missing, malformed, signed by a key the verifier
// does not know, or does not verify for the lock and token it came with.
var ErrForged = errors.New("fenceproof: forged or missing fence proof")

const (
	version   = 1
	keyIDLen  = 8
	proofLen  = 1 + keyIDLen + 8 + 8 + ed25519.SignatureSize
	msgDomain = "tenure fence proof v1\x00"
)

// Proof is a decoded proof.
type Proof struct {
	// KeyID names the key that signed it.
	KeyID string
	// Session is the grant's session id.
	Session uint64
	// GrantRevision is the revision at which the grant was made.
	GrantRevision uint64
	// Signature is the Ed25519 signature over Message.
	Signature []byte
}

// Message is what a proof's signature covers.
func Message(clusterID []byte, lock string, token, session, grantRevision uint64) []byte {
	b := make([]byte, 0, len(msgDomain)+1+len(clusterID)+2+len(lock)+24)
	b = append(b, msgDomain...)
	b = append(b, byte(len(clusterID)))
	b = append(b, clusterID...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(lock)))
	b = append(b, lock...)
	b = binary.BigEndian.AppendUint64(b, token)
	b = binary.BigEndian.AppendUint64(b, session)
	b = binary.BigEndian.AppendUint64(b, grantRevision)
	return b
}

// KeyID is the id of a public key.
func KeyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:keyIDLen])
}

// Sign returns the proof of a grant, signed by key (whose id is KeyID of
// its public key, computed by the caller once).
func Sign(key ed25519.PrivateKey, keyID string, clusterID []byte, lock string, token, session, grantRevision uint64) (string, error) {
	id, err := hex.DecodeString(keyID)
	if err != nil || len(id) != keyIDLen {
		return "", fmt.Errorf("fenceproof: key id %q is not %d hex bytes", keyID, keyIDLen)
	}
	b := make([]byte, 0, proofLen)
	b = append(b, version)
	b = append(b, id...)
	b = binary.BigEndian.AppendUint64(b, session)
	b = binary.BigEndian.AppendUint64(b, grantRevision)
	b = append(b, ed25519.Sign(key, Message(clusterID, lock, token, session, grantRevision))...)
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// Decode parses a proof without verifying it.
func Decode(s string) (Proof, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	switch {
	case s == "":
		return Proof{}, fmt.Errorf("%w: no proof given", ErrForged)
	case err != nil:
		return Proof{}, fmt.Errorf("%w: the proof is not URL-safe base64: %v", ErrForged, err)
	case len(b) != proofLen || b[0] != version:
		return Proof{}, fmt.Errorf("%w: the proof is not a version %d proof of %d bytes", ErrForged, version, proofLen)
	}
	return Proof{
		KeyID:         hex.EncodeToString(b[1 : 1+keyIDLen]),
		Session:       binary.BigEndian.Uint64(b[1+keyIDLen:]),
		GrantRevision: binary.BigEndian.Uint64(b[1+keyIDLen+8:]),
		Signature:     b[1+keyIDLen+16:],
	}, nil
}

// Key is one public key of a cluster.
type Key struct {
	ID     string
	Public ed25519.PublicKey
}

// Verifier checks proofs against one cluster's public keys. It is safe
// for concurrent use; Replace and Refresh swap its keys atomically (a
// check uses either the old keys or the new ones), and the cluster it
// verifies for never changes.
type Verifier struct {
	clusterID []byte
	keys      atomic.Pointer[map[string]ed25519.PublicKey]
}

// NewVerifier returns a verifier for the cluster with id clusterID (hex,
// as `tenure cluster keys` prints it) and its public keys; a key's ID must
// be KeyID of its public key.
func NewVerifier(clusterID string, keys ...Key) (*Verifier, error) {
	id, err := hex.DecodeString(clusterID)
	if err != nil || len(id) == 0 || len(id) > 255 {
		return nil, fmt.Errorf("fenceproof: cluster id %q is not hex", clusterID)
	}
	table, err := keyTable(keys)
	if err != nil {
		return nil, err
	}
	v := &Verifier{clusterID: id}
	v.keys.Store(&table)
	return v, nil
}

func keyTable(keys []Key) (map[string]ed25519.PublicKey, error) {
	if len(keys) == 0 {
		return nil, errors.New("fenceproof: a verifier needs at least one public key")
	}
	table := make(map[string]ed25519.PublicKey, len(keys))
	for _, k := range keys {
		if len(k.Public) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("fenceproof: key %s is %d bytes, not an Ed25519 public key", k.ID, len(k.Public))
		}
		if KeyID(k.Public) != k.ID {
			return nil, fmt.Errorf("fenceproof: key id %s does not match its public key (%s)", k.ID, KeyID(k.Public))
		}
		table[k.ID] = bytes.Clone(k.Public)
	}
	return table, nil
}

// Replace makes v verify with the keys of ks, a newer keyset of the same
// cluster, from now on: a key ks no longer lists (one the cluster retired
// and removed) stops verifying at once. A keyset of another cluster, one
// with no keys, or a malformed one is refused, and v keeps its keys.
func (v *Verifier) Replace(ks Keyset) error {
	id, err := hex.DecodeString(ks.ClusterID)
	if err != nil || !bytes.Equal(id, v.clusterID) {
		return fmt.Errorf("fenceproof: the keyset is of cluster %q, the verifier's is %x", ks.ClusterID, v.clusterID)
	}
	keys, err := ks.keys()
	if err != nil {
		return err
	}
	table, err := keyTable(keys)
	if err != nil {
		return err
	}
	v.keys.Store(&table)
	return nil
}

// Refresh replaces v's keys (Replace) with what fetch answers, at once
// and then every interval, until ctx ends, and returns ctx's error. A
// failed fetch or a refused keyset is handed to onErr (if not nil) and v
// keeps the keys it had. With a Tenure client:
//
//	go v.Refresh(ctx, time.Minute, c.ClusterKeys, nil)
//
// so that a key the cluster retires stops verifying here within interval
// of its removal.
func (v *Verifier) Refresh(ctx context.Context, interval time.Duration, fetch func(context.Context) (Keyset, error), onErr func(error)) error {
	if interval <= 0 {
		return errors.New("fenceproof: Refresh needs an interval above 0")
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ks, err := fetch(ctx)
		if err == nil {
			err = v.Replace(ks)
		}
		if err != nil && onErr != nil && ctx.Err() == nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Keyset is the JSON form of a cluster's public keys: what `tenure
// cluster keys -o json` prints.
type Keyset struct {
	ClusterID string      `json:"cluster_id"`
	Keys      []KeysetKey `json:"keys"`
}

// KeysetKey is one key of a Keyset; PublicKey is URL-safe base64 without
// padding.
type KeysetKey struct {
	ID        string `json:"id"`
	PublicKey string `json:"public_key"`
	// Active: the key that signs new grants.
	Active bool `json:"active"`
	// Retired: the cluster retired the key; it still verifies until the
	// cluster removes it, after a grace (it is then no longer listed).
	Retired bool `json:"retired,omitempty"`
}

// ParseKeyset returns a verifier for the keys in data, a Keyset in JSON
// (the output of `tenure cluster keys -o json`, stored with the resource).
func ParseKeyset(data []byte) (*Verifier, error) {
	var ks Keyset
	if err := json.Unmarshal(data, &ks); err != nil {
		return nil, fmt.Errorf("fenceproof: keyset: %w", err)
	}
	keys, err := ks.keys()
	if err != nil {
		return nil, err
	}
	return NewVerifier(ks.ClusterID, keys...)
}

// keys decodes the keyset's public keys.
func (ks Keyset) keys() ([]Key, error) {
	keys := make([]Key, 0, len(ks.Keys))
	for _, k := range ks.Keys {
		pub, err := base64.RawURLEncoding.DecodeString(k.PublicKey)
		if err != nil {
			return nil, fmt.Errorf("fenceproof: key %s: %w", k.ID, err)
		}
		keys = append(keys, Key{ID: k.ID, Public: pub})
	}
	return keys, nil
}

// Verify checks that proof is the cluster's proof of a grant of lock with
// token; any failure matches ErrForged and says why.
func (v *Verifier) Verify(lock string, token uint64, proof string) error {
	p, err := Decode(proof)
	if err != nil {
		return err
	}
	pub, ok := (*v.keys.Load())[p.KeyID]
	if !ok {
		return fmt.Errorf("%w: signed by key %s, which is not one of the cluster's keys given to this verifier", ErrForged, p.KeyID)
	}
	if !ed25519.Verify(pub, Message(v.clusterID, lock, token, p.Session, p.GrantRevision), p.Signature) {
		return fmt.Errorf("%w: the proof does not verify for token %d of lock %q", ErrForged, token, lock)
	}
	return nil
}
