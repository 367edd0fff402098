package fsm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// aclTokenUpdate creates or changes a token in one step (etcd's user
// RPCs, internal/etcdapi): a read-modify-write applied here, so that two
// concurrent changes of one user's roles cannot lose one another. A token
// so made or changed holds 0..MaxPoliciesPerRef policies (an etcd user
// may have no role: it is then allowed nothing).
func (s *State) aclTokenUpdate(c *fsmpb.AclTokenUpdate) Result {
	id := c.GetId()
	if err := ValidateACLName("token id", id); err != nil {
		return Result{Err: err}
	}
	old := s.sec.tokens[id]
	switch {
	case c.GetCreate() && old != nil:
		return Result{Err: fmt.Errorf("%w: token id %q exists", ErrInvalid, id)}
	case !c.GetCreate() && old == nil:
		return Result{Err: fmt.Errorf("%w: no token %q", ErrInvalid, id)}
	case c.GetCreate() && len(c.GetSecretHash()) == 0:
		return Result{Err: fmt.Errorf("%w: a new token needs a secret", ErrInvalid)}
	case len(c.GetSecretHash()) != 0 && len(c.GetSecretHash()) != sha256.Size:
		return Result{Err: fmt.Errorf("%w: a token's secret hash is %d bytes, not %d", ErrInvalid, len(c.GetSecretHash()), sha256.Size)}
	case len(c.GetDescription()) > maxDescription || !utf8.ValidString(c.GetDescription()):
		return Result{Err: fmt.Errorf("%w: a token's description must be at most %d bytes of UTF-8", ErrInvalid, maxDescription)}
	case len(c.GetGrant()) > MaxPoliciesPerRef || len(c.GetRevoke()) > MaxPoliciesPerRef:
		return Result{Err: fmt.Errorf("%w: grant or revoke at most %d policies at once", ErrInvalid, MaxPoliciesPerRef)}
	}
	tok := &Token{ID: id}
	if old != nil {
		*tok = *old
		tok.Policies = slices.Clone(old.Policies)
	}
	if h := c.GetSecretHash(); len(h) != 0 {
		if other := s.sec.byHash[hex.EncodeToString(h)]; other != nil && other.ID != id {
			return Result{Err: fmt.Errorf("%w: a token with this secret exists", ErrInvalid)}
		}
		tok.SecretHash = slices.Clone(h)
	}
	if c.GetDescription() != "" || old == nil {
		tok.Description = c.GetDescription()
	}
	for _, p := range c.GetGrant() {
		if s.sec.policies[p] == nil {
			return Result{Err: fmt.Errorf("%w: no policy %q", ErrInvalid, p)}
		}
		if !contains(tok.Policies, p) {
			tok.Policies = append(tok.Policies, p)
		}
	}
	for _, p := range c.GetRevoke() {
		if !contains(tok.Policies, p) {
			return Result{Err: fmt.Errorf("%w: token %q does not hold policy %q", ErrInvalid, id, p)}
		}
		tok.Policies = slices.DeleteFunc(tok.Policies, func(x string) bool { return x == p })
	}
	if len(tok.Policies) > MaxPoliciesPerRef {
		return Result{Err: fmt.Errorf("%w: a token holds at most %d policies", ErrInvalid, MaxPoliciesPerRef)}
	}
	if old == nil && len(s.sec.tokens) >= MaxTokens {
		return Result{Err: fmt.Errorf("%w: tokens: %d, the limit is %d (revoke unused ones: tenure acl token revoke)", ErrLimit, len(s.sec.tokens), MaxTokens)}
	}
	rev := s.bump()
	if old == nil {
		tok.CreateRevision = rev
	}
	sec := s.sec.clone()
	if old != nil {
		delete(sec.byHash, hex.EncodeToString(old.SecretHash))
	}
	sec.tokens[id] = tok
	sec.byHash[hex.EncodeToString(tok.SecretHash)] = tok
	s.sec = sec
	return Result{}
}

// Token returns the token whose id is id.
func (sec *Security) Token(id string) (*Token, bool) {
	t, ok := sec.tokens[id]
	return t, ok
}

// Policy returns the policy called name.
func (sec *Security) Policy(name string) (*Policy, bool) {
	p, ok := sec.policies[name]
	return p, ok
}
