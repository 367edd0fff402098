package client

import (
	"context"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// ACLs (a server that runs with --auth; see docs/security.md). Changes
// need cluster write, listings cluster read; a request without the right
// fails with ErrPermissionDenied, naming it.

// TokenSecret is a new auth token: ID is public (listings, revocation),
// Secret is what a client presents (WithAuthToken). The service keeps
// only the secret's hash: it is shown this once.
type TokenSecret struct {
	ID       string   `json:"id"`
	Secret   string   `json:"secret"`
	Policies []string `json:"policies"`
}

func tokenSecret(t *pb.AclTokenSecret) TokenSecret {
	return TokenSecret{ID: t.GetId(), Secret: t.GetSecret(), Policies: t.GetPolicies()}
}

// BootstrapACL runs once per cluster, with no token: it creates the policy
// "management" (write on everything) and a token with it, and returns the
// token. A second call fails with ErrPermissionDenied.
func (c *Client) BootstrapACL(ctx context.Context) (TokenSecret, error) {
	var resp *pb.AclTokenSecret
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.AclBootstrap(ctx, &pb.AclBootstrapRequest{})
		return err
	})
	if err != nil {
		return TokenSecret{}, err
	}
	return tokenSecret(resp), nil
}

// EnableACL makes every member of the cluster enforce the ACLs from now
// on, whether or not it was started with --auth; nothing turns that off.
// changed is false when they were enforced already (the call then needs
// cluster write). Bootstrapping the ACLs (BootstrapACL) enforces them too.
func (c *Client) EnableACL(ctx context.Context) (changed bool, revision uint64, err error) {
	var resp *pb.AclEnableResponse
	err = c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.AclEnable(ctx, &pb.AclEnableRequest{})
		return err
	})
	return resp.GetChanged(), resp.GetRevision(), err
}

// CreatePolicy creates a policy (with replace, replaces the policy of that
// name). Each rule is kind (lock, fence, queue, kv, session, cluster),
// name prefix ("" is every name) and access (read, write, deny).
func (c *Client) CreatePolicy(ctx context.Context, p *pb.AclPolicy, replace bool) error {
	return c.unary(ctx, func(api pb.TenureClient) error {
		_, err := api.AclPolicyCreate(ctx, &pb.AclPolicyCreateRequest{Policy: p, Replace: replace})
		return err
	})
}

// Policies lists the policies by name.
func (c *Client) Policies(ctx context.Context) ([]*pb.AclPolicy, error) {
	var resp *pb.AclPolicyListResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.AclPolicyList(ctx, &pb.AclPolicyListRequest{})
		return err
	})
	return resp.GetPolicies(), err
}

// DeletePolicy deletes a policy that no token or identity uses.
func (c *Client) DeletePolicy(ctx context.Context, name string) error {
	return c.unary(ctx, func(api pb.TenureClient) error {
		_, err := api.AclPolicyDelete(ctx, &pb.AclPolicyDeleteRequest{Name: name})
		return err
	})
}

// CreateToken creates an auth token carrying policies.
func (c *Client) CreateToken(ctx context.Context, policies []string, description string) (TokenSecret, error) {
	var resp *pb.AclTokenSecret
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.AclTokenCreate(ctx, &pb.AclTokenCreateRequest{Policies: policies, Description: description})
		return err
	})
	if err != nil {
		return TokenSecret{}, err
	}
	return tokenSecret(resp), nil
}

// Tokens lists the auth tokens by id (never their secrets).
func (c *Client) Tokens(ctx context.Context) ([]*pb.AclToken, error) {
	var resp *pb.AclTokenListResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.AclTokenList(ctx, &pb.AclTokenListRequest{})
		return err
	})
	return resp.GetTokens(), err
}

// RevokeToken revokes the token id: every request with it is refused from
// then on, also on streams already open.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	return c.unary(ctx, func(api pb.TenureClient) error {
		_, err := api.AclTokenRevoke(ctx, &pb.AclTokenRevokeRequest{Id: id})
		return err
	})
}

// BindIdentity gives the certificate identity name (the common name or a
// subject alternative name of a client certificate the server verifies)
// policies, replacing those it had.
func (c *Client) BindIdentity(ctx context.Context, name string, policies []string) error {
	return c.unary(ctx, func(api pb.TenureClient) error {
		_, err := api.AclIdentityBind(ctx, &pb.AclIdentityBindRequest{Identity: &pb.AclIdentity{Name: name, Policies: policies}})
		return err
	})
}

// Identities lists the bound certificate identities by name.
func (c *Client) Identities(ctx context.Context) ([]*pb.AclIdentity, error) {
	var resp *pb.AclIdentityListResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.AclIdentityList(ctx, &pb.AclIdentityListRequest{})
		return err
	})
	return resp.GetIdentities(), err
}

// UnbindIdentity removes a certificate identity's policies.
func (c *Client) UnbindIdentity(ctx context.Context, name string) error {
	return c.unary(ctx, func(api pb.TenureClient) error {
		_, err := api.AclIdentityUnbind(ctx, &pb.AclIdentityUnbindRequest{Name: name})
		return err
	})
}

// WhoAmI says who the server takes the client for, with which policies,
// and whether it enforces ACLs.
func (c *Client) WhoAmI(ctx context.Context) (*pb.AclWhoAmIResponse, error) {
	var resp *pb.AclWhoAmIResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.AclWhoAmI(ctx, &pb.AclWhoAmIRequest{})
		return err
	})
	return resp, err
}
