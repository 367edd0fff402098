package etcdapi

// etcd's Auth service on Tenure's ACLs (docs/etcd.md, "Authentication").
//
// A user is a Tenure token whose id is the user name and whose secret is
// the password; Authenticate checks the pair and answers the secret
// itself as etcd's auth token, which every later request carries and
// which is looked up again each time: it stops working the moment the
// token is revoked or its secret changed, on every member, and the node
// keeps no table of tokens handed out. A role is a policy: its etcd
// permissions are kv rules by prefix (READ: read; WRITE and READWRITE:
// write, which includes read); the role root is the built-in management
// policy. Changing users and roles needs cluster write, reading them
// cluster read, as Tenure's own acl commands do.

import (
	"bytes"
	"context"
	"slices"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	tpb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

// rootRole is etcd's administrator role: Tenure's management policy.
const rootRole = "root"

// policyOf is the policy of role; roleOf the role of policy.
func policyOf(role string) string {
	if role == rootRole {
		return fsm.ManagementPolicy
	}
	return role
}

func roleOf(policy string) string {
	if policy == fsm.ManagementPolicy {
		return rootRole
	}
	return policy
}

// authServer is etcd's Auth service.
type authServer struct {
	pb.UnimplementedAuthServer
	s *Server
}

// leaderCall serves a request of the Auth service: it authorizes it,
// forwards it to the leader from a follower (the leader's answer, or
// error, is the answer), and on the leader waits until the node's state
// has caught up, so that what local reads of the ACLs is current, before
// it answers with local.
func leaderCall[Req any, Resp headered](ctx context.Context, s *Server, method string, r Req, right server.Right,
	call func(pb.AuthClient, context.Context, Req, ...grpc.CallOption) (Resp, error), local func() (Resp, error)) (resp Resp, err error) {
	if err := s.authorize(ctx, "Auth/"+method, right); err != nil {
		return resp, err
	}
	fw, err := s.forward(ctx)
	if err != nil {
		return resp, err
	}
	if fw != nil {
		resp, err = call(pb.NewAuthClient(fw.conn), fw.ctx, r)
		return relay(s, resp, err)
	}
	if err := s.linearizable(ctx); err != nil {
		return resp, toGRPC(err)
	}
	return local()
}

// user is etcd user name's token, or etcd's "user not found".
func (s *Server) user(name string) (*fsm.Token, error) {
	t, ok := s.front.Security().Token(name)
	if !ok {
		return nil, rpctypes.ErrGRPCUserNotFound
	}
	return t, nil
}

// role is the policy of etcd role name (root: the management policy), or
// etcd's "role not found".
func (s *Server) role(name string) (*fsm.Policy, error) {
	p, ok := s.front.Security().Policy(policyOf(name))
	if !ok {
		return nil, rpctypes.ErrGRPCRoleNotFound
	}
	return p, nil
}

// AuthEnable implements etcd's Auth.AuthEnable as `tenure acl enable`:
// on a cluster that does not enforce its ACLs yet it makes every member
// enforce them for good (anyone who reaches such a cluster may); where
// they are enforced it needs cluster write and changes nothing.
func (a *authServer) AuthEnable(ctx context.Context, r *pb.AuthEnableRequest) (*pb.AuthEnableResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "AuthEnable", r, server.ClusterWrite, pb.AuthClient.AuthEnable, func() (*pb.AuthEnableResponse, error) {
		if s.srv.AuthEnforced() {
			return &pb.AuthEnableResponse{Header: s.header(0)}, nil
		}
		out, err := s.srv.AclEnable(ctx, &tpb.AclEnableRequest{})
		if err != nil {
			return nil, toGRPC(err)
		}
		return &pb.AuthEnableResponse{Header: s.header(out.GetRevision())}, nil
	})
}

// AuthDisable implements etcd's Auth.AuthDisable: refused; the etcd API
// cannot turn Tenure's ACLs off.
func (a *authServer) AuthDisable(ctx context.Context, r *pb.AuthDisableRequest) (*pb.AuthDisableResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, "etcdserver: Tenure's ACLs cannot be turned off through the etcd API (see docs/etcd.md)")
}

// AuthStatus implements etcd's Auth.AuthStatus: whether the ACLs are
// enforced, and the revision.
func (a *authServer) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	s := a.s
	rev := s.revision()
	return &pb.AuthStatusResponse{Header: s.header(rev), Enabled: s.srv.AuthEnforced(), AuthRevision: rev}, nil
}

// Authenticate implements etcd's Auth.Authenticate: name is a token's id,
// password its secret; the answer's token is the secret (see above).
func (a *authServer) Authenticate(ctx context.Context, r *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	s := a.s
	if !s.srv.AuthEnforced() {
		return nil, rpctypes.ErrGRPCAuthNotEnabled
	}
	if r.Name == "" {
		return nil, rpctypes.ErrGRPCUserEmpty
	}
	matches := func() bool {
		t, ok := s.front.Security().TokenBySecret(r.Password)
		return ok && r.Password != "" && t.ID == r.Name
	}
	ok := matches()
	if !ok && !s.front.CaughtUpLeader() {
		// A token created a moment ago may not have reached this node.
		if err := s.catchUp(ctx); err != nil {
			return nil, err
		}
		ok = matches()
	}
	if !ok {
		return nil, rpctypes.ErrGRPCAuthFailed
	}
	return &pb.AuthenticateResponse{Header: s.header(0), Token: r.Password}, nil
}

// tokenUpdate commits an AclTokenUpdate.
func (s *Server) tokenUpdate(ctx context.Context, u *fsmpb.AclTokenUpdate) (uint64, error) {
	res, err := s.propose(ctx, u)
	if err != nil {
		return 0, toGRPC(err)
	}
	return res.Revision, nil
}

func checkName(what, name string) error {
	if err := fsm.ValidateACLName(what, name); err != nil {
		return status.Error(codes.InvalidArgument, "etcdserver: "+err.Error())
	}
	return nil
}

// UserAdd implements etcd's Auth.UserAdd: a token with the user name as
// id, the password as secret, and no policy (an etcd user starts with no
// role). A user without a password (a certificate's) is not supported:
// bind the certificate's name with tenure acl identity.
func (a *authServer) UserAdd(ctx context.Context, r *pb.AuthUserAddRequest) (*pb.AuthUserAddResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "UserAdd", r, server.ClusterWrite, pb.AuthClient.UserAdd, func() (*pb.AuthUserAddResponse, error) {
		switch {
		case r.Name == "":
			return nil, rpctypes.ErrGRPCUserEmpty
		case r.GetOptions().GetNoPassword() || r.Password == "":
			return nil, status.Error(codes.InvalidArgument, "etcdserver: a user without a password is not supported by Tenure's etcd API: bind a certificate's name to policies with `tenure acl identity bind` (see docs/etcd.md)")
		}
		if err := checkName("user name", r.Name); err != nil {
			return nil, err
		}
		if _, ok := s.front.Security().Token(r.Name); ok {
			return nil, rpctypes.ErrGRPCUserAlreadyExist
		}
		rev, err := s.tokenUpdate(ctx, &fsmpb.AclTokenUpdate{Id: r.Name, Create: true, SecretHash: fsm.HashToken(r.Password), Description: "etcd user"})
		if err != nil {
			return nil, err
		}
		return &pb.AuthUserAddResponse{Header: s.header(rev)}, nil
	})
}

// UserGet implements etcd's Auth.UserGet: the user's roles.
func (a *authServer) UserGet(ctx context.Context, r *pb.AuthUserGetRequest) (*pb.AuthUserGetResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "UserGet", r, server.ClusterRead, pb.AuthClient.UserGet, func() (*pb.AuthUserGetResponse, error) {
		t, err := s.user(r.Name)
		if err != nil {
			return nil, err
		}
		out := &pb.AuthUserGetResponse{Header: s.header(0)}
		for _, p := range t.Policies {
			out.Roles = append(out.Roles, roleOf(p))
		}
		slices.Sort(out.Roles)
		return out, nil
	})
}

// UserList implements etcd's Auth.UserList: every token's id.
func (a *authServer) UserList(ctx context.Context, r *pb.AuthUserListRequest) (*pb.AuthUserListResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "UserList", r, server.ClusterRead, pb.AuthClient.UserList, func() (*pb.AuthUserListResponse, error) {
		out := &pb.AuthUserListResponse{Header: s.header(0)}
		for _, t := range s.front.Security().Tokens() {
			out.Users = append(out.Users, t.ID)
		}
		return out, nil
	})
}

// UserDelete implements etcd's Auth.UserDelete: the token is revoked.
func (a *authServer) UserDelete(ctx context.Context, r *pb.AuthUserDeleteRequest) (*pb.AuthUserDeleteResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "UserDelete", r, server.ClusterWrite, pb.AuthClient.UserDelete, func() (*pb.AuthUserDeleteResponse, error) {
		if _, err := s.user(r.Name); err != nil {
			return nil, err
		}
		d, err := s.srv.AclTokenRevoke(ctx, &tpb.AclTokenRevokeRequest{Id: r.Name})
		if err != nil {
			return nil, err
		}
		return &pb.AuthUserDeleteResponse{Header: s.header(d.GetRevision())}, nil
	})
}

// UserChangePassword implements etcd's Auth.UserChangePassword: the
// token's secret is replaced; the old one (and every etcd auth token
// handed out for it) stops working.
func (a *authServer) UserChangePassword(ctx context.Context, r *pb.AuthUserChangePasswordRequest) (*pb.AuthUserChangePasswordResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "UserChangePassword", r, server.ClusterWrite, pb.AuthClient.UserChangePassword, func() (*pb.AuthUserChangePasswordResponse, error) {
		if r.Password == "" {
			return nil, status.Error(codes.InvalidArgument, "etcdserver: the new password is empty")
		}
		if _, err := s.user(r.Name); err != nil {
			return nil, err
		}
		rev, err := s.tokenUpdate(ctx, &fsmpb.AclTokenUpdate{Id: r.Name, SecretHash: fsm.HashToken(r.Password)})
		if err != nil {
			return nil, err
		}
		return &pb.AuthUserChangePasswordResponse{Header: s.header(rev)}, nil
	})
}

// UserGrantRole implements etcd's Auth.UserGrantRole: the role's policy
// is added to the token's.
func (a *authServer) UserGrantRole(ctx context.Context, r *pb.AuthUserGrantRoleRequest) (*pb.AuthUserGrantRoleResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "UserGrantRole", r, server.ClusterWrite, pb.AuthClient.UserGrantRole, func() (*pb.AuthUserGrantRoleResponse, error) {
		t, err := s.user(r.User)
		if err != nil {
			return nil, err
		}
		if _, err := s.role(r.Role); err != nil {
			return nil, err
		}
		policy := policyOf(r.Role)
		rev := uint64(0)
		if !slices.Contains(t.Policies, policy) {
			if rev, err = s.tokenUpdate(ctx, &fsmpb.AclTokenUpdate{Id: r.User, Grant: []string{policy}}); err != nil {
				return nil, err
			}
		}
		return &pb.AuthUserGrantRoleResponse{Header: s.header(rev)}, nil
	})
}

// UserRevokeRole implements etcd's Auth.UserRevokeRole.
func (a *authServer) UserRevokeRole(ctx context.Context, r *pb.AuthUserRevokeRoleRequest) (*pb.AuthUserRevokeRoleResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "UserRevokeRole", r, server.ClusterWrite, pb.AuthClient.UserRevokeRole, func() (*pb.AuthUserRevokeRoleResponse, error) {
		t, err := s.user(r.Name)
		if err != nil {
			return nil, err
		}
		policy := policyOf(r.Role)
		if !slices.Contains(t.Policies, policy) {
			return nil, rpctypes.ErrGRPCRoleNotGranted
		}
		rev, err := s.tokenUpdate(ctx, &fsmpb.AclTokenUpdate{Id: r.Name, Revoke: []string{policy}})
		if err != nil {
			return nil, err
		}
		return &pb.AuthUserRevokeRoleResponse{Header: s.header(rev)}, nil
	})
}

// RoleAdd implements etcd's Auth.RoleAdd: a policy with no rules. root
// exists already (the management policy): adding it succeeds and changes
// nothing, so that etcd's setup scripts run.
func (a *authServer) RoleAdd(ctx context.Context, r *pb.AuthRoleAddRequest) (*pb.AuthRoleAddResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "RoleAdd", r, server.ClusterWrite, pb.AuthClient.RoleAdd, func() (*pb.AuthRoleAddResponse, error) {
		if r.Name == "" {
			return nil, rpctypes.ErrGRPCRoleEmpty
		}
		if r.Name == rootRole {
			return &pb.AuthRoleAddResponse{Header: s.header(0)}, nil
		}
		if err := checkName("role name", r.Name); err != nil {
			return nil, err
		}
		if _, ok := s.front.Security().Policy(r.Name); ok {
			return nil, rpctypes.ErrGRPCRoleAlreadyExist
		}
		if _, err := s.srv.AclPolicyCreate(ctx, &tpb.AclPolicyCreateRequest{Policy: &tpb.AclPolicy{Name: r.Name}}); err != nil {
			return nil, err
		}
		return &pb.AuthRoleAddResponse{Header: s.header(0)}, nil
	})
}

// permissionOf is the etcd permission of a kv rule (ok false: the rule
// has none, such as a deny).
func permissionOf(r fsm.Rule) (*authpb.Permission, bool) {
	if r.Kind != fsm.KindKV || r.Access == fsm.AccessDeny {
		return nil, false
	}
	p := &authpb.Permission{PermType: authpb.Permission_READ, Key: []byte(r.Prefix), RangeEnd: fsm.PrefixEnd([]byte(r.Prefix))}
	if r.Prefix == "" {
		p.Key = []byte{0}
	}
	if r.Access == fsm.AccessWrite {
		p.PermType = authpb.Permission_READWRITE
	}
	return p, true
}

// prefixOf is the kv rule prefix of an etcd permission's span: a prefix's
// span, or every key. A single key or any other span is refused: Tenure's
// rules are prefixes, and a prefix rule would grant more than etcd's
// permission did.
func prefixOf(key, end []byte) (string, error) {
	switch {
	case len(end) == 1 && end[0] == 0 && (len(key) == 0 || (len(key) == 1 && key[0] == 0)):
		return "", nil
	case len(end) > 0 && bytes.Equal(end, fsm.PrefixEnd(key)):
		if !utf8.Valid(key) {
			return "", status.Error(codes.InvalidArgument, "etcdserver: Tenure's ACL rules are UTF-8 text: a permission's prefix must be valid UTF-8")
		}
		return string(key), nil
	}
	return "", status.Error(codes.InvalidArgument, "etcdserver: Tenure's ACL rules are key prefixes: grant a permission with --prefix (or on every key), not on a single key or another range (see docs/etcd.md)")
}

// RoleGet implements etcd's Auth.RoleGet: the policy's kv rules as
// permissions.
func (a *authServer) RoleGet(ctx context.Context, r *pb.AuthRoleGetRequest) (*pb.AuthRoleGetResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "RoleGet", r, server.ClusterRead, pb.AuthClient.RoleGet, func() (*pb.AuthRoleGetResponse, error) {
		p, err := s.role(r.Role)
		if err != nil {
			return nil, err
		}
		out := &pb.AuthRoleGetResponse{Header: s.header(0)}
		for _, rule := range p.Rules {
			if perm, ok := permissionOf(rule); ok {
				out.Perm = append(out.Perm, perm)
			}
		}
		return out, nil
	})
}

// RoleList implements etcd's Auth.RoleList: every policy, management as
// root.
func (a *authServer) RoleList(ctx context.Context, r *pb.AuthRoleListRequest) (*pb.AuthRoleListResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "RoleList", r, server.ClusterRead, pb.AuthClient.RoleList, func() (*pb.AuthRoleListResponse, error) {
		out := &pb.AuthRoleListResponse{Header: s.header(0)}
		for _, p := range s.front.Security().Policies() {
			out.Roles = append(out.Roles, roleOf(p.Name))
		}
		slices.Sort(out.Roles)
		return out, nil
	})
}

// RoleDelete implements etcd's Auth.RoleDelete. Unlike etcd's, a role
// some user still holds is refused (Tenure never drops a policy from
// tokens silently), and root cannot be deleted.
func (a *authServer) RoleDelete(ctx context.Context, r *pb.AuthRoleDeleteRequest) (*pb.AuthRoleDeleteResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "RoleDelete", r, server.ClusterWrite, pb.AuthClient.RoleDelete, func() (*pb.AuthRoleDeleteResponse, error) {
		if r.Role == rootRole {
			return nil, status.Error(codes.FailedPrecondition, "etcdserver: the role root is Tenure's built-in management policy and cannot be deleted")
		}
		if _, err := s.role(r.Role); err != nil {
			return nil, err
		}
		d, err := s.srv.AclPolicyDelete(ctx, &tpb.AclPolicyDeleteRequest{Name: r.Role})
		if err != nil {
			return nil, err
		}
		return &pb.AuthRoleDeleteResponse{Header: s.header(d.GetRevision())}, nil
	})
}

// editRole replaces role's policy with edit applied to its rules, one
// change at a time on this node (roleMu).
func (s *Server) editRole(ctx context.Context, role string, edit func([]fsm.Rule) ([]fsm.Rule, error)) error {
	if role == rootRole {
		return status.Error(codes.FailedPrecondition, "etcdserver: the role root is Tenure's built-in management policy and cannot be changed")
	}
	s.roleMu.Lock()
	defer s.roleMu.Unlock()
	if err := s.linearizable(ctx); err != nil { // the last change under the lock is read
		return toGRPC(err)
	}
	p, err := s.role(role)
	if err != nil {
		return err
	}
	rules, err := edit(slices.Clone(p.Rules))
	if err != nil {
		return err
	}
	req := &tpb.AclPolicyCreateRequest{Policy: &tpb.AclPolicy{Name: role}, Replace: true}
	for _, r := range rules {
		req.Policy.Rules = append(req.Policy.Rules, &tpb.AclRule{Kind: string(r.Kind), Prefix: r.Prefix, Access: r.Access.String()})
	}
	_, err = s.srv.AclPolicyCreate(ctx, req)
	return err
}

// RoleGrantPermission implements etcd's Auth.RoleGrantPermission: a kv
// rule on the permission's prefix, replacing the role's rule on the same
// prefix.
func (a *authServer) RoleGrantPermission(ctx context.Context, r *pb.AuthRoleGrantPermissionRequest) (*pb.AuthRoleGrantPermissionResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "RoleGrantPermission", r, server.ClusterWrite, pb.AuthClient.RoleGrantPermission, func() (*pb.AuthRoleGrantPermissionResponse, error) {
		if r.Perm == nil {
			return nil, rpctypes.ErrGRPCPermissionNotGiven
		}
		prefix, err := prefixOf(r.Perm.Key, r.Perm.RangeEnd)
		if err != nil {
			return nil, err
		}
		access := fsm.AccessWrite
		switch r.Perm.PermType {
		case authpb.Permission_READ:
			access = fsm.AccessRead
		case authpb.Permission_WRITE, authpb.Permission_READWRITE:
		default:
			return nil, status.Errorf(codes.InvalidArgument, "etcdserver: unknown permission type %d", r.Perm.PermType)
		}
		err = s.editRole(ctx, r.Name, func(rules []fsm.Rule) ([]fsm.Rule, error) {
			rules = slices.DeleteFunc(rules, func(x fsm.Rule) bool { return x.Kind == fsm.KindKV && x.Prefix == prefix })
			return append(rules, fsm.Rule{Kind: fsm.KindKV, Prefix: prefix, Access: access}), nil
		})
		if err != nil {
			return nil, err
		}
		return &pb.AuthRoleGrantPermissionResponse{Header: s.header(0)}, nil
	})
}

// RoleRevokePermission implements etcd's Auth.RoleRevokePermission: the
// role's kv rule on the span's prefix is removed.
func (a *authServer) RoleRevokePermission(ctx context.Context, r *pb.AuthRoleRevokePermissionRequest) (*pb.AuthRoleRevokePermissionResponse, error) {
	s := a.s
	return leaderCall(ctx, s, "RoleRevokePermission", r, server.ClusterWrite, pb.AuthClient.RoleRevokePermission, func() (*pb.AuthRoleRevokePermissionResponse, error) {
		prefix, err := prefixOf(r.Key, r.RangeEnd)
		if err != nil {
			return nil, err
		}
		err = s.editRole(ctx, r.Role, func(rules []fsm.Rule) ([]fsm.Rule, error) {
			n := len(rules)
			rules = slices.DeleteFunc(rules, func(x fsm.Rule) bool { return x.Kind == fsm.KindKV && x.Prefix == prefix })
			if len(rules) == n {
				return nil, rpctypes.ErrGRPCPermissionNotGranted
			}
			return rules, nil
		})
		if err != nil {
			return nil, err
		}
		return &pb.AuthRoleRevokePermissionResponse{Header: s.header(0)}, nil
	})
}
