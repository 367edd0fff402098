package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// authServer is a server run with --auth, bootstrapped.
type authServer struct {
	t      *testing.T
	srv    *testutil.Server
	admin  *client.Client
	secret string // the management token's
	n      atomic.Int64
}

func startAuth(t *testing.T) *authServer {
	t.Helper()
	srv := testutil.StartConfig(t, daemon.Config{Auth: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	anon := testutil.Dial(t, srv.Addr())
	if _, err := anon.Status(ctx); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("status before bootstrap, without a token: %v, want PERMISSION_DENIED", err)
	}
	tok, err := anon.BootstrapACL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.BootstrapACL(ctx); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("second bootstrap: %v, want PERMISSION_DENIED", err)
	}
	a := &authServer{t: t, srv: srv, secret: tok.Secret, admin: testutil.Dial(t, srv.Addr(), client.WithAuthToken(tok.Secret))}
	if _, err := a.admin.Status(ctx); err != nil {
		t.Fatalf("status with the management token: %v", err)
	}
	return a
}

// as returns a client whose token's one policy has rules (KIND:PREFIX:ACCESS).
func (a *authServer) as(rules ...string) *client.Client {
	a.t.Helper()
	c, _ := a.asToken(rules...)
	return c
}

// asToken is as, also returning the token's secret.
func (a *authServer) asToken(rules ...string) (*client.Client, string) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := &pb.AclPolicy{Name: fmt.Sprintf("p%d", a.n.Add(1))}
	for _, s := range rules {
		r, err := fsm.ParseRule(s)
		if err != nil {
			a.t.Fatal(err)
		}
		p.Rules = append(p.Rules, &pb.AclRule{Kind: string(r.Kind), Prefix: r.Prefix, Access: r.Access.String()})
	}
	if err := a.admin.CreatePolicy(ctx, p, false); err != nil {
		a.t.Fatal(err)
	}
	tok, err := a.admin.CreateToken(ctx, []string{p.Name}, "test")
	if err != nil {
		a.t.Fatal(err)
	}
	return testutil.Dial(a.t, a.srv.Addr(), client.WithAuthToken(tok.Secret)), tok.Secret
}

// aclOp is one request of the matrix: it needs need (read or write) of
// kind on its target name.
type aclOp struct {
	name string
	kind fsm.Kind
	need string
	// byName: the right is on the target's name (false: on every name,
	// or on the cluster).
	byName bool
	run    func(ctx context.Context, c *client.Client, target string) error
}

// aclOps lists a request of every kind and access. admin prepares what a
// request acts on (a delivery to ack).
// adminDelivery enqueues an item on queue n and hands it out to admin: a
// real delivery, so that only the ACL can stop its settling.
func adminDelivery(ctx context.Context, admin *client.Client, n string) (*client.Delivery, error) {
	if _, err := admin.Queue(n).Enqueue(ctx, []byte("job")); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	d, err := admin.Queue(n).TryDequeue(ctx, time.Minute)
	if err != nil || d == nil {
		return nil, fmt.Errorf("setup: %v %v", d, err)
	}
	return d, nil
}

func aclOps(admin *client.Client) []aclOp {
	session := func(ctx context.Context, c *client.Client, fn func(*client.Session) error) error {
		s, err := c.NewSession(ctx, client.WithTTL(5*time.Second))
		if err != nil {
			return err
		}
		defer s.Close(context.Background())
		return fn(s)
	}
	return []aclOp{
		{"acquire", fsm.KindLock, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			return session(ctx, c, func(s *client.Session) error {
				m, err := s.Mutex(n)
				if err != nil {
					return err
				}
				h, err := m.TryLock(ctx)
				if err == nil {
					err = h.Unlock(ctx)
				}
				return err
			})
		}},
		{"lock status", fsm.KindLock, "read", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.LockStatus(ctx, n)
			return err
		}},
		{"lock history", fsm.KindLock, "read", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.LockHistory(ctx, n)
			return err
		}},
		{"lock list", fsm.KindLock, "read", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Locks(ctx, n)
			return err
		}},
		{"fence put", fsm.KindFence, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.FencedPut(ctx, n, []byte("v"), 1, "")
			return err
		}},
		{"fence delete", fsm.KindFence, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.FencedDelete(ctx, n, 1, "")
			return err
		}},
		{"fence get", fsm.KindFence, "read", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.FencedGet(ctx, n)
			return err
		}},
		{"kv put", fsm.KindKV, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Put(ctx, n, []byte("v"))
			return err
		}},
		{"kv delete prefix", fsm.KindKV, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.DeletePrefix(ctx, n)
			return err
		}},
		{"kv txn", fsm.KindKV, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Txn(ctx, nil, []client.Op{client.OpPut(n, []byte("v"))}, nil)
			return err
		}},
		{"kv get", fsm.KindKV, "read", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Get(ctx, n)
			return err
		}},
		{"kv range", fsm.KindKV, "read", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Range(ctx, n, 0)
			return err
		}},
		{"queue enqueue", fsm.KindQueue, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Queue(n).Enqueue(ctx, []byte("job"))
			return err
		}},
		{"queue dequeue", fsm.KindQueue, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Queue(n).TryDequeue(ctx, time.Minute)
			return err
		}},
		{"queue ack", fsm.KindQueue, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			// A real delivery, handed out to the administrator: only the
			// ACL can stop the ack.
			if _, err := admin.Queue(n).Enqueue(ctx, []byte("job")); err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			d, err := admin.Queue(n).TryDequeue(ctx, time.Minute)
			if err != nil || d == nil {
				return fmt.Errorf("setup: %v %v", d, err)
			}
			return c.Queue(n).Ack(ctx, d)
		}},
		{"queue enqueue batch", fsm.KindQueue, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Queue(n).EnqueueBatch(ctx, []client.BatchItem{{Payload: []byte("job")}, {Payload: []byte("job")}})
			return err
		}},
		{"queue dequeue batch", fsm.KindQueue, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Queue(n).TryDequeueBatch(ctx, 10, time.Minute)
			return err
		}},
		{"queue ack batch", fsm.KindQueue, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			d, err := adminDelivery(ctx, admin, n)
			if err != nil {
				return err
			}
			_, err = c.Queue(n).AckBatch(ctx, []*client.Delivery{d})
			return err
		}},
		{"queue nack batch", fsm.KindQueue, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			d, err := adminDelivery(ctx, admin, n)
			if err != nil {
				return err
			}
			_, err = c.Queue(n).NackBatch(ctx, []*client.Delivery{d})
			return err
		}},
		{"queue stats", fsm.KindQueue, "read", true, func(ctx context.Context, c *client.Client, n string) error {
			_, err := c.Queue(n).Stats(ctx)
			return err
		}},
		{"session create", fsm.KindSession, "write", true, func(ctx context.Context, c *client.Client, n string) error {
			s, err := c.NewSession(ctx, client.WithOwner(n), client.WithTTL(5*time.Second))
			if err == nil {
				err = s.Close(ctx)
			}
			return err
		}},
		{"session list", fsm.KindSession, "read", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.Sessions(ctx)
			return err
		}},
		{"status", fsm.KindCluster, "read", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.Status(ctx)
			return err
		}},
		{"member list", fsm.KindCluster, "read", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.Members(ctx)
			return err
		}},
		{"member add", fsm.KindCluster, "write", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.AddMember(ctx, "n9", "127.0.0.1:1", true)
			return err
		}},
		{"member remove", fsm.KindCluster, "write", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.RemoveMember(ctx, "n9", true)
			return err
		}},
		{"snapshot save", fsm.KindCluster, "write", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.SaveSnapshot(ctx, &bytes.Buffer{})
			return err
		}},
		{"snapshot restore", fsm.KindCluster, "write", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.RestoreSnapshot(ctx, strings.NewReader("not a snapshot"), true)
			return err
		}},
		{"cluster keys retire", fsm.KindCluster, "write", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.RetireClusterKey(ctx, "0011223344556677", 0)
			return err
		}},
		{"limits set", fsm.KindCluster, "write", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.SetLimits(ctx, &pb.ClusterLimits{MaxSessions: 100_000})
			return err
		}},
		{"acl token create", fsm.KindCluster, "write", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.CreateToken(ctx, []string{fsm.ManagementPolicy}, "")
			return err
		}},
		{"acl policy list", fsm.KindCluster, "read", false, func(ctx context.Context, c *client.Client, _ string) error {
			_, err := c.Policies(ctx)
			return err
		}},
	}
}

// wantDenied checks that err is PERMISSION_DENIED naming the right.
func wantDenied(t *testing.T, what string, err error, right string) {
	t.Helper()
	if !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("%s: %v, want PERMISSION_DENIED", what, err)
		return
	}
	if !strings.Contains(err.Error(), right) {
		t.Errorf("%s: %q does not name the missing right %q", what, err, right)
	}
}

// TestACLMatrix: for every kind and access, a token without the right
// cannot make the request (PERMISSION_DENIED naming the right: kind,
// access, name), a read right does not allow a write, a deny of a longer
// prefix overrides a write of a shorter one, and a token for "jobs/" does
// not reach "billing/"; a token with exactly the right is not refused.
func TestACLMatrix(t *testing.T) {
	a := startAuth(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sessions := "session::write" // lock and queue requests need sessions
	for _, op := range aclOps(a.admin) {
		target := "jobs/" + strings.ReplaceAll(op.name, " ", "-")
		prefix, name := "", target
		if op.byName {
			prefix = "jobs/"
		}
		rightName := fmt.Sprintf("%s %s on %q", op.kind, op.need, name)
		if op.kind == fsm.KindCluster {
			rightName = "cluster " + op.need
		} else if !op.byName || op.name == "lock list" || op.name == "kv range" || op.name == "kv delete prefix" {
			rightName = fmt.Sprintf("%s %s on every name under %q", op.kind, op.need, name)
			if !op.byName {
				rightName = fmt.Sprintf("%s %s on every name under %q", op.kind, op.need, "")
			}
		}
		base := []string{sessions}
		if op.kind == fsm.KindSession {
			base = nil
		}
		with := func(rules ...string) *client.Client { return a.as(append(rules, base...)...) }
		t.Run(op.name, func(t *testing.T) {
			// The right itself (for "jobs/"): not refused.
			if err := op.run(ctx, with(fmt.Sprintf("%s:%s:%s", op.kind, prefix, op.need)), target); errors.Is(err, client.ErrPermissionDenied) {
				t.Fatalf("with %s:%s:%s: %v", op.kind, prefix, op.need, err)
			}
			other := fsm.KindKV
			if op.kind == fsm.KindKV {
				other = fsm.KindFence
			}
			wantDenied(t, "with rights on another kind only", op.run(ctx, with(fmt.Sprintf("%s::write", other)), target), rightName)
			if op.need == "write" {
				wantDenied(t, "with read only", op.run(ctx, with(fmt.Sprintf("%s::read", op.kind)), target), rightName)
			}
			if op.kind != fsm.KindCluster {
				wantDenied(t, "with write on everything but a deny of the name", op.run(ctx, with(fmt.Sprintf("%s::write", op.kind), fmt.Sprintf("%s:%s:deny", op.kind, name)), target), rightName)
			} else {
				wantDenied(t, "with write on everything but a cluster deny", op.run(ctx, with("cluster::deny", "kv::write"), target), rightName)
			}
			if op.byName {
				billing := "billing/" + strings.TrimPrefix(target, "jobs/")
				err := op.run(ctx, with(fmt.Sprintf("%s:jobs/:write", op.kind)), billing)
				want := strings.Replace(rightName, target, billing, 1)
				wantDenied(t, "a jobs/ token on billing/", err, want)
			}
		})
	}
}

// TestACLRevokedPolicyStopsReleaseAndRevokedTokenStopsAll: rights are
// checked on every request, also on a session stream that is already
// open: a holder whose policy loses lock write cannot release, and a
// revoked token gets nothing.
func TestACLRevokedPolicyStopsReleaseAndRevokedTokenStopsAll(t *testing.T) {
	a := startAuth(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.admin.CreatePolicy(ctx, &pb.AclPolicy{Name: "worker", Rules: []*pb.AclRule{{Kind: "lock", Prefix: "jobs/", Access: "write"}, {Kind: "session", Access: "write"}}}, false); err != nil {
		t.Fatal(err)
	}
	tok, err := a.admin.CreateToken(ctx, []string{"worker"}, "")
	if err != nil {
		t.Fatal(err)
	}
	c := testutil.Dial(t, a.srv.Addr(), client.WithAuthToken(tok.Secret))
	s := testutil.Session(t, ctx, c, client.WithTTL(5*time.Second))
	m, _ := s.Mutex("jobs/1")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.admin.CreatePolicy(ctx, &pb.AclPolicy{Name: "worker", Rules: []*pb.AclRule{{Kind: "lock", Prefix: "jobs/", Access: "read"}, {Kind: "session", Access: "write"}}}, true); err != nil {
		t.Fatal(err)
	}
	wantDenied(t, "release after the policy lost lock write", h.Unlock(ctx), `lock write on "jobs/1"`)
	st, err := a.admin.LockStatus(ctx, "jobs/1")
	if err != nil || len(st.GetHolders()) != 1 || st.GetHolders()[0].GetToken() != h.Token() {
		t.Fatalf("the refused release changed the lock: %v %v", st, err)
	}
	if err := a.admin.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.LockStatus(ctx, "jobs/1")
	wantDenied(t, "read with a revoked token", err, "unknown or revoked")
}

// TestACLSessionBelongsToItsCreator: another identity cannot use a
// session, even with its secret: not resume it (and so release its locks
// or close it), not bind keys to it, not tie dequeues to it.
func TestACLSessionBelongsToItsCreator(t *testing.T) {
	a := startAuth(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all := []string{"session::write", "lock::write", "kv::write", "queue::write"}
	owner := a.as(all...)
	other, otherSecret := a.asToken(all...)
	victim := testutil.Session(t, ctx, owner, client.WithOwner("victim"), client.WithTTL(5*time.Second))
	m, _ := victim.Mutex("L")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The other identity's token, on the raw API, with the right secret.
	conn, err := grpc.NewClient(a.srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := pb.NewTenureClient(conn)
	octx := metadata.AppendToOutgoingContext(ctx, client.AuthTokenHeader, otherSecret)
	_, _, err = openRaw(octx, api, &pb.OpenSession{SessionId: victim.ID(), TtlMs: 5000, Secret: victim.Secret()})
	rawDenied(t, "resume by another identity with the secret", err, fmt.Sprintf("session %d", victim.ID()))
	_, err = other.Put(ctx, "eph", []byte("x"), client.WithSessionCredentials(victim.ID(), victim.Secret()))
	wantDenied(t, "ephemeral put bound to another identity's session", err, fmt.Sprintf("session %d", victim.ID()))
	_, err = api.QueueDequeue(octx, &pb.QueueDequeueRequest{Queue: "q", Session: victim.ID(), SessionSecret: victim.Secret(), VisibilityMs: 1000})
	rawDenied(t, "dequeue tied to another identity's session", err, fmt.Sprintf("session %d", victim.ID()))
	if h.State() != client.Held {
		t.Fatalf("the victim's hold is %v", h.State())
	}
	// The creator itself still can.
	if _, err := owner.Put(ctx, "eph", []byte("x"), client.WithSessionCredentials(victim.ID(), victim.Secret())); err != nil {
		t.Fatalf("the creator's own ephemeral put: %v", err)
	}
}

// rawDenied checks that a raw gRPC error is PERMISSION_DENIED naming what.
func rawDenied(t *testing.T, what string, err error, right string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), right) {
		t.Errorf("%s: %v, want PERMISSION_DENIED naming %q", what, err, right)
	}
}

// TestACLCertificateIdentity: a verified client certificate's common name
// bound to policies is an identity of its own: it gets what they grant
// and nothing else, a certificate bound to nothing gets nothing, and its
// sessions are its own (a token cannot resume them, even with the secret).
func TestACLCertificateIdentity(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsconfig.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.pem", ca.PEM)
	leaf := func(cn string, usage tlsconfig.Usage, hosts ...string) (string, string) {
		l, err := ca.Issue(cn, hosts, usage, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return write(cn+".pem", l.CertPEM), write(cn+"-key.pem", l.KeyPEM)
	}
	sc, sk := leaf("server", tlsconfig.ServerAuth, "127.0.0.1")
	r, err := tlsconfig.New(tlsconfig.Files{Cert: sc, Key: sk, CA: caFile}, tlsconfig.Server, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := testutil.StartConfig(t, daemon.Config{TLS: r.ServerConfig(), Auth: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	as := func(cn string, opts ...client.Option) *client.Client {
		cert, key := leaf(cn, tlsconfig.ClientAuth)
		cfg, err := tlsconfig.ClientConfig(caFile, cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return testutil.Dial(t, srv.Addr(), append(opts, client.WithTLS(cfg))...)
	}
	tok, err := as("operator").BootstrapACL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin := as("operator", client.WithAuthToken(tok.Secret))
	if err := admin.CreatePolicy(ctx, &pb.AclPolicy{Name: "workers", Rules: []*pb.AclRule{{Kind: "lock", Prefix: "jobs/", Access: "write"}, {Kind: "session", Access: "write"}}}, false); err != nil {
		t.Fatal(err)
	}
	if err := admin.BindIdentity(ctx, "worker-1", []string{"workers"}); err != nil {
		t.Fatal(err)
	}
	worker, stranger := as("worker-1"), as("stranger")
	if who, err := worker.WhoAmI(ctx); err != nil || who.GetIdentity() != "certificate worker-1" || len(who.GetPolicies()) != 1 {
		t.Fatalf("whoami of worker-1: %v %v", who, err)
	}
	s := testutil.Session(t, ctx, worker, client.WithTTL(5*time.Second))
	m, _ := s.Mutex("jobs/1")
	if _, err := m.Lock(ctx); err != nil {
		t.Fatalf("worker-1 on jobs/1: %v", err)
	}
	mb, _ := s.Mutex("billing/1")
	_, err = mb.TryLock(ctx)
	wantDenied(t, "worker-1 on billing/1", err, `lock write on "billing/1" is not granted to certificate "worker-1"`)
	_, err = stranger.NewSession(ctx)
	wantDenied(t, "a certificate bound to nothing", err, `certificate "stranger"`)

	// The management token, on the same TLS connection kind, with the
	// worker's session secret: another identity.
	cert, key := leaf("operator2", tlsconfig.ClientAuth)
	cfg, _ := tlsconfig.ClientConfig(caFile, cert, key)
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	octx := metadata.AppendToOutgoingContext(ctx, client.AuthTokenHeader, tok.Secret)
	_, _, err = openRaw(octx, pb.NewTenureClient(conn), &pb.OpenSession{SessionId: s.ID(), TtlMs: 5000, Secret: s.Secret()})
	rawDenied(t, "a token resuming a certificate's session", err, fmt.Sprintf("session %d", s.ID()))
}
