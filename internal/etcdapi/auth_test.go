package etcdapi_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	tpb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// withToken is ctx carrying an etcd auth token, as etcd's clients send it.
func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, token)
}

// native is the management caller of a node's own API under auth.
type native struct {
	api  tpb.TenureClient
	root string // the management token's secret
}

func (n native) ctx(t *testing.T) context.Context {
	return metadata.AppendToOutgoingContext(ctxT(t), server.AuthTokenHeader, n.root)
}

// bootstrap bootstraps the ACLs through Tenure's own API at addr.
func bootstrap(t *testing.T, api tpb.TenureClient) native {
	t.Helper()
	boot, err := api.AclBootstrap(ctxT(t), &tpb.AclBootstrapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return native{api: api, root: boot.GetSecret()}
}

// token creates a policy of rules and a token holding it.
func (n native) token(t *testing.T, policy string, rules ...string) *tpb.AclTokenSecret {
	t.Helper()
	p := &tpb.AclPolicy{Name: policy}
	for _, r := range rules {
		rule, err := fsm.ParseRule(r)
		if err != nil {
			t.Fatal(err)
		}
		p.Rules = append(p.Rules, &tpb.AclRule{Kind: string(rule.Kind), Prefix: rule.Prefix, Access: rule.Access.String()})
	}
	if _, err := n.api.AclPolicyCreate(n.ctx(t), &tpb.AclPolicyCreateRequest{Policy: p}); err != nil {
		t.Fatal(err)
	}
	tok, err := n.api.AclTokenCreate(n.ctx(t), &tpb.AclTokenCreateRequest{Policies: []string{policy}})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func startAuth(t *testing.T) (*etcd, native, pb.AuthClient) {
	t.Helper()
	e := start(t, daemon.Config{Auth: true})
	n := bootstrap(t, testutil.API(t, e.srv.Addr()))
	conn, err := grpc.NewClient(e.srv.EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return e, n, pb.NewAuthClient(conn)
}

// TestAuthOnTheEtcdAPI: a node with --auth serves etcd's API; a Tenure
// token's id and secret authenticate, and the token's kv rules decide,
// over whole spans; anonymous, unknown and unauthorized callers get
// etcd's own errors.
func TestAuthOnTheEtcdAPI(t *testing.T) {
	e, n, auth := startAuth(t)
	ctx := ctxT(t)
	_, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("app/x")})
	wantErr(t, err, rpctypes.ErrGRPCUserEmpty)
	_, err = e.kv.Put(ctx, &pb.PutRequest{Key: []byte("app/x"), Value: []byte("v")})
	wantErr(t, err, rpctypes.ErrGRPCUserEmpty)
	_, err = e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 10})
	wantErr(t, err, rpctypes.ErrGRPCUserEmpty)

	tok := n.token(t, "app", "kv:app/:write")
	_, err = auth.Authenticate(ctx, &pb.AuthenticateRequest{Name: tok.GetId(), Password: "wrong"})
	wantErr(t, err, rpctypes.ErrGRPCAuthFailed)
	_, err = auth.Authenticate(ctx, &pb.AuthenticateRequest{Name: "someone-else", Password: tok.GetSecret()})
	wantErr(t, err, rpctypes.ErrGRPCAuthFailed)
	a, err := auth.Authenticate(ctx, &pb.AuthenticateRequest{Name: tok.GetId(), Password: tok.GetSecret()})
	if err != nil {
		t.Fatal(err)
	}
	app := withToken(ctx, a.Token)
	if _, err := e.kv.Put(app, &pb.PutRequest{Key: []byte("app/x"), Value: []byte("v")}); err != nil {
		t.Fatalf("put within the token's rules: %v", err)
	}
	r, err := e.kv.Range(app, &pb.RangeRequest{Key: []byte("app/"), RangeEnd: []byte("app0")})
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("range of the prefix: %v %v", r, err)
	}
	root := withToken(ctx, n.root)
	if _, err := e.kv.Put(root, &pb.PutRequest{Key: []byte("secret/y"), Value: []byte("pw")}); err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]*pb.RangeRequest{
		"another key":        {Key: []byte("secret/y")},
		"past the prefix":    {Key: []byte("app/"), RangeEnd: []byte("b")},
		"from a key on":      {Key: []byte("app/"), RangeEnd: []byte{0}},
		"every key":          {Key: []byte{0}, RangeEnd: []byte{0}},
		"a wider prefix":     {Key: []byte("a"), RangeEnd: []byte("b")},
		"serializable other": {Key: []byte("secret/y"), Serializable: true},
	} {
		if _, err := e.kv.Range(app, req); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want permission denied", name, err)
		}
		_, err := e.kv.Range(app, req)
		wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	}
	_, err = e.kv.Put(app, &pb.PutRequest{Key: []byte("secret/y"), Value: []byte("x")})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	_, err = e.kv.Txn(app, &pb.TxnRequest{Success: []*pb.RequestOp{putOp("app/z", "1"), getOp("secret/y")}})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	_, err = e.kv.DeleteRange(app, &pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte("z")})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	_, err = e.lease.LeaseGrant(app, &pb.LeaseGrantRequest{TTL: 10})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	if _, err := e.lease.LeaseGrant(root, &pb.LeaseGrantRequest{TTL: 10}); err != nil {
		t.Fatalf("a lease with session write: %v", err)
	}
	// A lease's keys are the keys': revoking another's lease, which
	// deletes its keys, needs write on them, and listing them read.
	leaser := withToken(ctx, n.token(t, "leaser", "session:etcd:write", "kv:mine/:write").GetSecret())
	g, err := e.lease.LeaseGrant(root, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.kv.Put(root, &pb.PutRequest{Key: []byte("secret/leased"), Value: []byte("v"), Lease: g.ID}); err != nil {
		t.Fatal(err)
	}
	_, err = e.lease.LeaseRevoke(leaser, &pb.LeaseRevokeRequest{ID: g.ID})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	_, err = e.lease.LeaseTimeToLive(leaser, &pb.LeaseTimeToLiveRequest{ID: g.ID, Keys: true})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	if r, err := e.kv.Range(root, &pb.RangeRequest{Key: []byte("secret/leased")}); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the leased key after a refused revoke: %v %v", r, err)
	}
	_, err = e.kv.Range(withToken(ctx, "tnr_unknown"), &pb.RangeRequest{Key: []byte("app/x")})
	wantErr(t, err, rpctypes.ErrGRPCInvalidAuthToken)
	// A revoked token stops working at once.
	if _, err := n.api.AclTokenRevoke(n.ctx(t), &tpb.AclTokenRevokeRequest{Id: tok.GetId()}); err != nil {
		t.Fatal(err)
	}
	_, err = e.kv.Range(app, &pb.RangeRequest{Key: []byte("app/x")})
	wantErr(t, err, rpctypes.ErrGRPCInvalidAuthToken)
	st, err := auth.AuthStatus(ctx, &pb.AuthStatusRequest{})
	if err != nil || !st.Enabled {
		t.Fatalf("auth status: %v %v", st, err)
	}
}

// TestEtcdUsersAndRoles: etcd's user and role RPCs, as etcdctl's user and
// role commands send them, make Tenure tokens and policies that then
// decide etcd's requests; they need management rights.
func TestEtcdUsersAndRoles(t *testing.T) {
	e, n, auth := startAuth(t)
	ctx := ctxT(t)
	root := withToken(ctx, n.root)
	_, err := auth.RoleAdd(ctx, &pb.AuthRoleAddRequest{Name: "r1"})
	wantErr(t, err, rpctypes.ErrGRPCUserEmpty)
	steps := []func() error{
		func() error { _, err := auth.RoleAdd(root, &pb.AuthRoleAddRequest{Name: "root"}); return err },
		func() error { _, err := auth.RoleAdd(root, &pb.AuthRoleAddRequest{Name: "r1"}); return err },
		func() error {
			_, err := auth.RoleGrantPermission(root, &pb.AuthRoleGrantPermissionRequest{Name: "r1", Perm: &authpb.Permission{PermType: authpb.Permission_READWRITE, Key: []byte("u/"), RangeEnd: []byte("u0")}})
			return err
		},
		func() error {
			_, err := auth.RoleGrantPermission(root, &pb.AuthRoleGrantPermissionRequest{Name: "r1", Perm: &authpb.Permission{PermType: authpb.Permission_READ, Key: []byte("pub/"), RangeEnd: []byte("pub0")}})
			return err
		},
		func() error {
			_, err := auth.UserAdd(root, &pb.AuthUserAddRequest{Name: "u1", Password: "a-long-password-1"})
			return err
		},
		func() error {
			_, err := auth.UserGrantRole(root, &pb.AuthUserGrantRoleRequest{User: "u1", Role: "r1"})
			return err
		},
		func() error { _, err := auth.AuthEnable(root, &pb.AuthEnableRequest{}); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	_, err = auth.UserAdd(root, &pb.AuthUserAddRequest{Name: "u1", Password: "another-password"})
	wantErr(t, err, rpctypes.ErrGRPCUserAlreadyExist)
	_, err = auth.RoleGrantPermission(root, &pb.AuthRoleGrantPermissionRequest{Name: "r1", Perm: &authpb.Permission{PermType: authpb.Permission_READ, Key: []byte("one-key")}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a single-key permission (wider as a prefix rule): %v", err)
	}
	if g, err := auth.UserGet(root, &pb.AuthUserGetRequest{Name: "u1"}); err != nil || strings.Join(g.Roles, ",") != "r1" {
		t.Fatalf("user get: %v %v", g, err)
	}
	if g, err := auth.RoleGet(root, &pb.AuthRoleGetRequest{Role: "r1"}); err != nil || len(g.Perm) != 2 {
		t.Fatalf("role get: %v %v", g, err)
	}
	a, err := auth.Authenticate(ctx, &pb.AuthenticateRequest{Name: "u1", Password: "a-long-password-1"})
	if err != nil {
		t.Fatal(err)
	}
	u1 := withToken(ctx, a.Token)
	if _, err := e.kv.Put(u1, &pb.PutRequest{Key: []byte("u/1"), Value: []byte("v")}); err != nil {
		t.Fatalf("put under the role's prefix: %v", err)
	}
	if _, err := e.kv.Range(u1, &pb.RangeRequest{Key: []byte("pub/"), RangeEnd: []byte("pub0")}); err != nil {
		t.Fatalf("read under the role's read prefix: %v", err)
	}
	_, err = e.kv.Put(u1, &pb.PutRequest{Key: []byte("pub/1"), Value: []byte("v")})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	// A user may not manage users.
	_, err = auth.UserAdd(u1, &pb.AuthUserAddRequest{Name: "u2", Password: "pw-pw-pw-pw"})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	// Revoking the permission and changing the password take effect.
	if _, err := auth.RoleRevokePermission(root, &pb.AuthRoleRevokePermissionRequest{Role: "r1", Key: []byte("u/"), RangeEnd: []byte("u0")}); err != nil {
		t.Fatal(err)
	}
	_, err = e.kv.Put(u1, &pb.PutRequest{Key: []byte("u/2"), Value: []byte("v")})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	if _, err := auth.UserChangePassword(root, &pb.AuthUserChangePasswordRequest{Name: "u1", Password: "a-long-password-2"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.kv.Range(u1, &pb.RangeRequest{Key: []byte("pub/x")})
	wantErr(t, err, rpctypes.ErrGRPCInvalidAuthToken)
	if _, err := auth.UserDelete(root, &pb.AuthUserDeleteRequest{Name: "u1"}); err != nil {
		t.Fatal(err)
	}
	_, err = auth.Authenticate(ctx, &pb.AuthenticateRequest{Name: "u1", Password: "a-long-password-2"})
	wantErr(t, err, rpctypes.ErrGRPCAuthFailed)
	_, err = auth.AuthDisable(root, &pb.AuthDisableRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("auth disable: %v", err)
	}
}

// TestWatchEndsWhenTheTokenIsRevoked: an open etcd watch whose token is
// revoked ends within a second with permission denied, and delivers no
// change written after the revocation.
func TestWatchEndsWhenTheTokenIsRevoked(t *testing.T) {
	for _, how := range []string{"token revoked", "policy replaced"} {
		t.Run(how, func(t *testing.T) {
			e, n, _ := startAuth(t)
			tok := n.token(t, "reader", "kv:w/:read")
			root := withToken(ctxT(t), n.root)
			w, err := e.watch.Watch(withToken(ctxT(t), tok.GetSecret()))
			if err != nil {
				t.Fatal(err)
			}
			create(t, w, &pb.WatchCreateRequest{Key: []byte("w/"), RangeEnd: []byte("w0")})
			if _, err := e.kv.Put(root, &pb.PutRequest{Key: []byte("w/1"), Value: []byte("before")}); err != nil {
				t.Fatal(err)
			}
			if r := recvWatch(t, w); len(r.Events) != 1 || string(r.Events[0].Kv.Value) != "before" {
				t.Fatalf("before the revocation: %v", r)
			}
			if how == "token revoked" {
				_, err = n.api.AclTokenRevoke(n.ctx(t), &tpb.AclTokenRevokeRequest{Id: tok.GetId()})
			} else {
				_, err = n.api.AclPolicyCreate(n.ctx(t), &tpb.AclPolicyCreateRequest{Replace: true, Policy: &tpb.AclPolicy{Name: "reader", Rules: []*tpb.AclRule{{Kind: "kv", Prefix: "w/", Access: "deny"}}}})
			}
			if err != nil {
				t.Fatal(err)
			}
			revoked := time.Now()
			if _, err := e.kv.Put(root, &pb.PutRequest{Key: []byte("w/2"), Value: []byte("after")}); err != nil {
				t.Fatal(err)
			}
			for {
				r, err := w.Recv()
				if err != nil {
					wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
					break
				}
				for _, ev := range r.Events {
					t.Fatalf("delivered after the revocation: %s=%s", ev.Kv.Key, ev.Kv.Value)
				}
			}
			if d := time.Since(revoked); d > time.Second {
				t.Fatalf("the watch ended %v after the revocation, want within 1s", d)
			}
		})
	}
}

// TestKeepAliveEndsWhenTheTokenIsRevoked: an open keep-alive stream ends
// with permission denied once its token is revoked, even with no request
// in flight.
func TestKeepAliveEndsWhenTheTokenIsRevoked(t *testing.T) {
	e, n, _ := startAuth(t)
	tok := n.token(t, "leaser", "session:etcd:write")
	ctx := withToken(ctxT(t), tok.GetSecret())
	g, err := e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 30})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := e.lease.LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: g.ID}); err != nil {
		t.Fatal(err)
	}
	if r, err := ka.Recv(); err != nil || r.TTL <= 0 {
		t.Fatalf("keepalive: %v %v", r, err)
	}
	if _, err := n.api.AclTokenRevoke(n.ctx(t), &tpb.AclTokenRevokeRequest{Id: tok.GetId()}); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	_, err = ka.Recv()
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	if d := time.Since(revoked); d > time.Second {
		t.Fatalf("the keep-alive ended %v after the revocation, want within 1s", d)
	}
}

// TestAuthEnableTurnsTheClusterACLsOn: etcd's AuthEnable on a node started
// without --auth is `tenure acl enable`: from then on the cluster enforces
// its ACLs, so an anonymous etcd call is refused as etcd refuses it, and a
// second AuthEnable needs cluster write.
func TestAuthEnableTurnsTheClusterACLsOn(t *testing.T) {
	e2 := start(t, daemon.Config{})
	conn, err := grpc.NewClient(e2.srv.EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	auth := pb.NewAuthClient(conn)
	if _, err := e2.kv.Put(ctxT(t), &pb.PutRequest{Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatalf("before AuthEnable an anonymous put works: %v", err)
	}
	if st, err := auth.AuthStatus(ctxT(t), &pb.AuthStatusRequest{}); err != nil || st.Enabled {
		t.Fatalf("AuthStatus before = %v, %v; want disabled", st, err)
	}
	if _, err := auth.AuthEnable(ctxT(t), &pb.AuthEnableRequest{}); err != nil {
		t.Fatalf("AuthEnable: %v", err)
	}
	_, err = e2.kv.Put(ctxT(t), &pb.PutRequest{Key: []byte("k"), Value: []byte("w")})
	if !errors.Is(rpctypes.Error(err), rpctypes.ErrUserEmpty) {
		t.Fatalf("anonymous put after AuthEnable = %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	if _, err := auth.AuthEnable(ctxT(t), &pb.AuthEnableRequest{}); !errors.Is(rpctypes.Error(err), rpctypes.ErrUserEmpty) {
		t.Fatalf("anonymous AuthEnable where enforced = %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	who, err := testutil.API(t, e2.srv.Addr()).AclWhoAmI(ctxT(t), &tpb.AclWhoAmIRequest{})
	if err != nil || !who.GetAuth() {
		t.Fatalf("whoami after AuthEnable = %v, %v; want auth on", who, err)
	}
}
