package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// ACL requests. The rights they need are in auth.go (rightsOf); listings
// are read linearizably.

// tokenSecretBytes: a token secret holds 192 random bits.
const tokenSecretBytes = 24

// tokenSecretPrefix starts every token secret, so that one is easy to
// recognise (in a log, a leaked file).
const tokenSecretPrefix = "tnr_"

// newToken draws a token's id and secret: randomness is the proposer's.
func newToken(policies []string, description string) (*fsmpb.AclToken, string, error) {
	id := make([]byte, 8)
	secret := make([]byte, tokenSecretBytes)
	if _, err := rand.Read(id); err != nil {
		return nil, "", fmt.Errorf("drawing a token id: %w", err)
	}
	if _, err := rand.Read(secret); err != nil {
		return nil, "", fmt.Errorf("drawing a token secret: %w", err)
	}
	s := tokenSecretPrefix + base64.RawURLEncoding.EncodeToString(secret)
	return &fsmpb.AclToken{Id: hex.EncodeToString(id), SecretHash: fsm.HashToken(s), Policies: policies, Description: description}, s, nil
}

// proposeACL commits an ACL change.
func (s *Server) proposeACL(ctx context.Context, op any) (uint64, error) {
	res, err := s.proposeOp(ctx, op)
	if err != nil {
		return 0, toStatus(err)
	}
	return res.Revision, nil
}

// AclBootstrap implements pb.TenureServer.
func (s *Server) AclBootstrap(ctx context.Context, _ *pb.AclBootstrapRequest) (*pb.AclTokenSecret, error) {
	tok, secret, err := newToken(nil, "bootstrap management token")
	if err != nil {
		return nil, toStatus(err)
	}
	if _, err := s.proposeACL(ctx, &fsmpb.AclBootstrap{Token: tok}); err != nil {
		return nil, err
	}
	return &pb.AclTokenSecret{Id: tok.GetId(), Secret: secret, Policies: []string{fsm.ManagementPolicy}}, nil
}

// AclPolicyCreate implements pb.TenureServer.
func (s *Server) AclPolicyCreate(ctx context.Context, req *pb.AclPolicyCreateRequest) (*pb.AclPolicy, error) {
	p := &fsmpb.AclPolicy{Name: req.GetPolicy().GetName()}
	for _, r := range req.GetPolicy().GetRules() {
		p.Rules = append(p.Rules, &fsmpb.AclRule{Kind: r.GetKind(), Prefix: r.GetPrefix(), Access: r.GetAccess()})
	}
	if _, err := s.proposeACL(ctx, &fsmpb.AclPolicySet{Policy: p, Replace: req.GetReplace()}); err != nil {
		return nil, err
	}
	return req.GetPolicy(), nil
}

// AclPolicyList implements pb.TenureServer.
func (s *Server) AclPolicyList(ctx context.Context, _ *pb.AclPolicyListRequest) (*pb.AclPolicyListResponse, error) {
	if err := s.node.LinearizableRead(ctx); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.AclPolicyListResponse{}
	for _, p := range s.node.Security().Policies() {
		pp := &pb.AclPolicy{Name: p.Name}
		for _, r := range p.Rules {
			pp.Rules = append(pp.Rules, &pb.AclRule{Kind: string(r.Kind), Prefix: r.Prefix, Access: r.Access.String()})
		}
		out.Policies = append(out.Policies, pp)
	}
	return out, nil
}

// AclPolicyDelete implements pb.TenureServer.
func (s *Server) AclPolicyDelete(ctx context.Context, req *pb.AclPolicyDeleteRequest) (*pb.AclDeleteResponse, error) {
	rev, err := s.proposeACL(ctx, &fsmpb.AclPolicyDelete{Name: req.GetName()})
	if err != nil {
		return nil, err
	}
	return &pb.AclDeleteResponse{Revision: rev}, nil
}

// AclTokenCreate implements pb.TenureServer.
func (s *Server) AclTokenCreate(ctx context.Context, req *pb.AclTokenCreateRequest) (*pb.AclTokenSecret, error) {
	tok, secret, err := newToken(req.GetPolicies(), req.GetDescription())
	if err != nil {
		return nil, toStatus(err)
	}
	if _, err := s.proposeACL(ctx, &fsmpb.AclTokenCreate{Token: tok}); err != nil {
		return nil, err
	}
	return &pb.AclTokenSecret{Id: tok.GetId(), Secret: secret, Policies: tok.GetPolicies()}, nil
}

// AclTokenList implements pb.TenureServer. Secrets are never listed: the
// service does not have them.
func (s *Server) AclTokenList(ctx context.Context, _ *pb.AclTokenListRequest) (*pb.AclTokenListResponse, error) {
	if err := s.node.LinearizableRead(ctx); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.AclTokenListResponse{}
	for _, t := range s.node.Security().Tokens() {
		out.Tokens = append(out.Tokens, &pb.AclToken{Id: t.ID, Policies: t.Policies, Description: t.Description, CreateRevision: t.CreateRevision})
	}
	return out, nil
}

// AclTokenRevoke implements pb.TenureServer. Requests with the token are
// refused from the moment the revocation is applied, also on streams
// already open.
func (s *Server) AclTokenRevoke(ctx context.Context, req *pb.AclTokenRevokeRequest) (*pb.AclDeleteResponse, error) {
	rev, err := s.proposeACL(ctx, &fsmpb.AclTokenRevoke{Id: req.GetId()})
	if err != nil {
		return nil, err
	}
	return &pb.AclDeleteResponse{Revision: rev}, nil
}

// AclIdentityBind implements pb.TenureServer.
func (s *Server) AclIdentityBind(ctx context.Context, req *pb.AclIdentityBindRequest) (*pb.AclIdentity, error) {
	id := req.GetIdentity()
	if _, err := s.proposeACL(ctx, &fsmpb.AclBindingSet{Binding: &fsmpb.AclBinding{Name: id.GetName(), Policies: id.GetPolicies()}}); err != nil {
		return nil, err
	}
	return id, nil
}

// AclIdentityList implements pb.TenureServer.
func (s *Server) AclIdentityList(ctx context.Context, _ *pb.AclIdentityListRequest) (*pb.AclIdentityListResponse, error) {
	if err := s.node.LinearizableRead(ctx); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.AclIdentityListResponse{}
	for _, b := range s.node.Security().Bindings() {
		out.Identities = append(out.Identities, &pb.AclIdentity{Name: b.Name, Policies: b.Policies})
	}
	return out, nil
}

// AclIdentityUnbind implements pb.TenureServer.
func (s *Server) AclIdentityUnbind(ctx context.Context, req *pb.AclIdentityUnbindRequest) (*pb.AclDeleteResponse, error) {
	rev, err := s.proposeACL(ctx, &fsmpb.AclBindingDelete{Name: req.GetName()})
	if err != nil {
		return nil, err
	}
	return &pb.AclDeleteResponse{Revision: rev}, nil
}

// AclEnable implements pb.TenureServer: every member enforces the ACLs
// from the answer on. Its right (cluster write) is checked only where they
// are enforced already (auth.go), and then it changes nothing: turning
// enforcement on needs no more than what a cluster without it allows
// anyone, and nothing turns it off.
func (s *Server) AclEnable(ctx context.Context, _ *pb.AclEnableRequest) (*pb.AclEnableResponse, error) {
	was := s.node.Security().Enforced
	rev, err := s.proposeACL(ctx, &fsmpb.AclEnable{})
	if err != nil {
		return nil, err
	}
	return &pb.AclEnableResponse{Changed: !was, Revision: rev}, nil
}

// AclWhoAmI implements pb.TenureServer.
func (s *Server) AclWhoAmI(ctx context.Context, _ *pb.AclWhoAmIRequest) (*pb.AclWhoAmIResponse, error) {
	sec := s.node.Security()
	c := callerOf(ctx, sec)
	out := &pb.AclWhoAmIResponse{Auth: s.enforcedBy(sec), Policies: c.policies}
	switch {
	case c.badToken:
		out.Identity = "unknown token"
	case c.kind == "":
		out.Identity = "anonymous"
	case c.kind == "cert":
		out.Identity = "certificate " + c.name
	default:
		out.Identity = "token " + c.name
	}
	return out, nil
}
