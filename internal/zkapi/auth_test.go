package zkapi_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc/metadata"

	tpb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// aclToken bootstraps the ACLs of the node at addr and creates a token
// holding rules.
func aclToken(t *testing.T, addr string, rules ...string) *tpb.AclTokenSecret {
	t.Helper()
	api := testutil.API(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	boot, err := api.AclBootstrap(ctx, &tpb.AclBootstrapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	mctx := metadata.AppendToOutgoingContext(ctx, server.AuthTokenHeader, boot.GetSecret())
	p := &tpb.AclPolicy{Name: "zk"}
	for _, r := range rules {
		rule, err := fsm.ParseRule(r)
		if err != nil {
			t.Fatal(err)
		}
		p.Rules = append(p.Rules, &tpb.AclRule{Kind: string(rule.Kind), Prefix: rule.Prefix, Access: rule.Access.String()})
	}
	if _, err := api.AclPolicyCreate(mctx, &tpb.AclPolicyCreateRequest{Policy: p}); err != nil {
		t.Fatal(err)
	}
	tok, err := api.AclTokenCreate(mctx, &tpb.AclTokenCreateRequest{Policies: []string{"zk"}})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestAuthMapsOntoPolicies: under --auth a client without addAuth is
// refused NoAuth; addAuth digest with a token's id and secret gives it
// the token's rights on "zk"+path (kv read and write); an unknown token
// fails with AuthFailed.
func TestAuthMapsOntoPolicies(t *testing.T) {
	d, addr := startNode(t, func(c *daemon.Config) { c.Auth = true })
	tok := aclToken(t, d.Addr(), "kv:zk/app:write", "kv:zk/ro:read")
	acl := zk.WorldACL(zk.PermAll)

	anon, _ := connect(t, []string{addr}, 5*time.Second)
	if _, err := anon.Create("/app", nil, 0, acl); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("anonymous create: %v, want NoAuth", err)
	}
	if _, _, err := anon.Get("/zookeeper"); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("anonymous get: %v, want NoAuth", err)
	}

	c, _ := connect(t, []string{addr}, 5*time.Second)
	if err := c.AddAuth("digest", []byte(tok.GetId()+":"+tok.GetSecret())); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create("/app", []byte("x"), 0, acl); err != nil {
		t.Fatalf("create with the right: %v", err)
	}
	if _, err := c.Create("/other", nil, 0, acl); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("create without the right: %v, want NoAuth", err)
	}
	if _, _, err := c.Get("/app"); err != nil {
		t.Fatalf("read with write access: %v", err)
	}

	bad, _ := connect(t, []string{addr}, 5*time.Second)
	if err := bad.AddAuth("digest", []byte(tok.GetId()+":not-the-secret")); err == nil {
		t.Fatal("addAuth with a wrong secret was accepted")
	}
}

// TestZnodeACLs: a znode's own ACL is enforced as ZooKeeper enforces it:
// the digest id of addAuth's user:password, and "auth" taking the
// caller's ids at create.
func TestZnodeACLs(t *testing.T) {
	_, addr := startNode(t, nil)
	owner, _ := connect(t, []string{addr}, 5*time.Second)
	if err := owner.AddAuth("digest", []byte("alice:pw")); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Create("/private", []byte("s"), 0, []zk.ACL{{Perms: zk.PermAll, Scheme: "auth", ID: ""}}); err != nil {
		t.Fatal(err)
	}
	acl, _, err := owner.GetACL("/private")
	if want := zk.DigestACL(zk.PermAll, "alice", "pw")[0]; err != nil || len(acl) != 1 || acl[0] != want {
		t.Fatalf("getACL: %+v %v", acl, err)
	}
	stranger, _ := connect(t, []string{addr}, 5*time.Second)
	if _, _, err := stranger.Get("/private"); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("a stranger's get: %v, want NoAuth", err)
	}
	if _, err := stranger.Set("/private", nil, -1); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("a stranger's set: %v, want NoAuth", err)
	}
	if _, _, err := owner.Get("/private"); err != nil {
		t.Fatal(err)
	}
	if _, err := stranger.Create("/open", nil, 0, []zk.ACL{{Perms: zk.PermAll, Scheme: "auth"}}); !errors.Is(err, zk.ErrInvalidACL) {
		t.Fatalf("auth ACL without an id: %v, want InvalidACL", err)
	}
}
