package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// revocationBound is how soon after a revocation is acknowledged every
// stream of the revoked caller must have ended.
const revocationBound = time.Second

// worker is a token of one policy of its own, with what takes its rights
// away again.
type worker struct {
	id, secret, policy string
}

// newWorker creates a policy with rules and a token with it.
func newWorker(t *testing.T, ctx context.Context, a *authServer, rules ...string) worker {
	t.Helper()
	w := worker{policy: fmt.Sprintf("w%d", a.n.Add(1))}
	if err := a.admin.CreatePolicy(ctx, policyOf(t, w.policy, rules...), false); err != nil {
		t.Fatal(err)
	}
	tok, err := a.admin.CreateToken(ctx, []string{w.policy}, "worker")
	if err != nil {
		t.Fatal(err)
	}
	w.id, w.secret = tok.ID, tok.Secret
	return w
}

func policyOf(t *testing.T, name string, rules ...string) *pb.AclPolicy {
	t.Helper()
	p := &pb.AclPolicy{Name: name}
	for _, s := range rules {
		r, err := fsm.ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		p.Rules = append(p.Rules, &pb.AclRule{Kind: string(r.Kind), Prefix: r.Prefix, Access: r.Access.String()})
	}
	return p
}

// revocations are the ways a worker loses its rights: its token revoked,
// or its policy replaced by one that denies what it had (deny).
func revocations(a *authServer, deny ...string) []struct {
	name   string
	revoke func(t *testing.T, ctx context.Context, w worker)
} {
	return []struct {
		name   string
		revoke func(t *testing.T, ctx context.Context, w worker)
	}{
		{"token revoked", func(t *testing.T, ctx context.Context, w worker) {
			if err := a.admin.RevokeToken(ctx, w.id); err != nil {
				t.Fatal(err)
			}
		}},
		{"policy replaced by a deny", func(t *testing.T, ctx context.Context, w worker) {
			if err := a.admin.CreatePolicy(ctx, policyOf(t, w.policy, deny...), true); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

// wantRevoked checks how a stream ended after a revocation acknowledged
// at revoked: PERMISSION_DENIED, within revocationBound.
func wantRevoked(t *testing.T, what string, err error, revoked time.Time) {
	t.Helper()
	took := time.Since(revoked)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("%s: ended with %v, want PERMISSION_DENIED", what, err)
	}
	if took > revocationBound {
		t.Fatalf("%s: ended %v after the revocation, the bound is %v", what, took, revocationBound)
	}
	t.Logf("%s: ended %v after the revocation: %v", what, took, err)
}

// TestRevocationEndsKVWatch: a worker's open kv watch ends with
// PERMISSION_DENIED within a second of its token's revocation or its
// policy's replacement by a deny, and a put written after the revocation
// is never delivered to it.
func TestRevocationEndsKVWatch(t *testing.T) {
	a := startAuth(t)
	api := rawAPI(t, a.srv.Addr())
	for _, rv := range revocations(a, "kv:jobs/:deny") {
		t.Run(rv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			w := newWorker(t, ctx, a, "kv:jobs/:read")
			wctx, wcancel := context.WithTimeout(withToken(ctx, w.secret), 10*time.Second)
			defer wcancel()
			watch, err := api.KVWatch(wctx, &pb.KVWatchRequest{Key: "jobs/", Prefix: true})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := watch.Recv(); err != nil || !r.GetCreated() {
				t.Fatalf("watch created: %v %v", r, err)
			}
			if _, err := a.admin.Put(ctx, "jobs/before", []byte("1")); err != nil {
				t.Fatal(err)
			}
			if r, err := watch.Recv(); err != nil || len(r.GetEvents()) != 1 || r.GetEvents()[0].GetKv().GetKey() != "jobs/before" {
				t.Fatalf("the event before the revocation: %v %v", r, err)
			}
			rv.revoke(t, ctx, w)
			revoked := time.Now()
			if _, err := a.admin.Put(ctx, "jobs/after", []byte("2")); err != nil {
				t.Fatal(err)
			}
			for {
				r, err := watch.Recv()
				if err != nil {
					wantRevoked(t, "the kv watch", err, revoked)
					return
				}
				for _, ev := range r.GetEvents() {
					t.Fatalf("delivered after the revocation: %v", ev)
				}
			}
		})
	}
}

// TestRevocationEndsObserve: an open Observe of an election ends with
// PERMISSION_DENIED within a second of the revocation, and a leader's value
// proclaimed after it is never delivered.
func TestRevocationEndsObserve(t *testing.T) {
	a := startAuth(t)
	api := rawAPI(t, a.srv.Addr())
	for i, rv := range revocations(a, "lock:el/:deny") {
		t.Run(rv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			name := fmt.Sprint("el/", i)
			s := testutil.Session(t, ctx, a.admin)
			e, err := s.Election(name)
			if err != nil {
				t.Fatal(err)
			}
			h, err := e.Campaign(ctx, []byte("before"))
			if err != nil {
				t.Fatal(err)
			}
			w := newWorker(t, ctx, a, "lock:el/:read")
			wctx, wcancel := context.WithTimeout(withToken(ctx, w.secret), 10*time.Second)
			defer wcancel()
			ob, err := api.Observe(wctx, &pb.ObserveRequest{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			if ev, err := ob.Recv(); err != nil || string(ev.GetValue()) != "before" {
				t.Fatalf("the leader before the revocation: %v %v", ev, err)
			}
			rv.revoke(t, ctx, w)
			revoked := time.Now()
			if err := e.Proclaim(ctx, h, []byte("after")); err != nil {
				t.Fatal(err)
			}
			for {
				ev, err := ob.Recv()
				if err != nil {
					wantRevoked(t, "the observation", err, revoked)
					return
				}
				t.Fatalf("delivered after the revocation: %v", ev)
			}
		})
	}
}

// TestRevocationEndsAWaitingDequeue: a dequeue waiting for an item ends
// with PERMISSION_DENIED within a second of the revocation, and the item
// enqueued after it stays in the queue.
func TestRevocationEndsAWaitingDequeue(t *testing.T) {
	a := startAuth(t)
	api := rawAPI(t, a.srv.Addr())
	for i, rv := range revocations(a, "queue:q/:deny") {
		t.Run(rv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			q := fmt.Sprint("q/", i)
			w := newWorker(t, ctx, a, "queue:q/:write")
			wctx, wcancel := context.WithTimeout(withToken(ctx, w.secret), 10*time.Second)
			defer wcancel()
			type answer struct {
				resp *pb.QueueDequeueResponse
				err  error
			}
			got := make(chan answer, 1)
			go func() {
				resp, err := api.QueueDequeue(wctx, &pb.QueueDequeueRequest{Queue: q, Wait: true})
				got <- answer{resp, err}
			}()
			testutil.WaitFor(t, "the dequeue to wait", 10*time.Second, func() bool { return a.srv.Hub.QueueWaiting(q) == 1 })
			rv.revoke(t, ctx, w)
			revoked := time.Now()
			if _, err := a.admin.Queue(q).Enqueue(ctx, []byte("after")); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.err == nil {
				t.Fatalf("the waiting dequeue got %v after the revocation", r.resp)
			}
			wantRevoked(t, "the waiting dequeue", r.err, revoked)
			st, err := a.admin.Queue(q).Stats(ctx)
			if err != nil || st.Queued != 1 || st.InFlight != 0 {
				t.Fatalf("the item enqueued after the revocation: %v %v, want it ready", st, err)
			}
		})
	}
}

// TestRevocationEndsASessionStream: a worker's session stream ends with
// PERMISSION_DENIED within a second of the revocation, and the grant of a
// lock it queued for, made after the revocation, is never delivered.
func TestRevocationEndsASessionStream(t *testing.T) {
	a := startAuth(t)
	api := rawAPI(t, a.srv.Addr())
	for i, rv := range revocations(a, "session::write", "lock:jobs/:deny") {
		t.Run(rv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			name := fmt.Sprint("jobs/", i)
			s := testutil.Session(t, ctx, a.admin)
			m, err := s.Mutex(name)
			if err != nil {
				t.Fatal(err)
			}
			held, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			w := newWorker(t, ctx, a, "session::write", "lock:jobs/:write")
			wctx, wcancel := context.WithTimeout(withToken(ctx, w.secret), 10*time.Second)
			defer wcancel()
			raw, err := testutil.OpenRawSession(wctx, api)
			if err != nil {
				t.Fatal(err)
			}
			if err := raw.Send(&pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{Owner: "worker", TtlMs: 10_000}}}); err != nil {
				t.Fatal(err)
			}
			if r, err := raw.Recv(); err != nil || r.GetOpened() == nil {
				t.Fatalf("open: %v %v", r, err)
			}
			if err := raw.Send(&pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: name, Wait: true}}}); err != nil {
				t.Fatal(err)
			}
			if r, err := raw.Recv(); err != nil || r.GetQueued() == nil {
				t.Fatalf("acquire: %v %v, want queued", r, err)
			}
			rv.revoke(t, ctx, w)
			revoked := time.Now()
			if err := held.Unlock(ctx); err != nil { // the worker's session is granted the lock
				t.Fatal(err)
			}
			for {
				r, err := raw.Recv()
				if err != nil {
					if errors.Is(err, io.EOF) {
						t.Fatal("the session stream ended normally")
					}
					wantRevoked(t, "the session stream", err, revoked)
					return
				}
				if r.GetGranted() != nil {
					t.Fatalf("a grant made after the revocation was delivered: %v", r)
				}
			}
		})
	}
}

// TestRevocationEndsAWatchOnAFollower: a kv watch served by a follower
// ends with PERMISSION_DENIED within a second of the revocation (committed
// through the leader), and a put after it is never delivered.
func TestRevocationEndsAWatchOnAFollower(t *testing.T) {
	testutil.Slow(t)
	ms := startMixedCluster(t, true, true, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var leader, follower *authMember
	testutil.WaitFor(t, "a leader", 30*time.Second, func() bool {
		leader = leaderOf(ms, func(*authMember) bool { return true })
		return leader != nil
	})
	for _, m := range ms {
		if m != leader {
			follower = m
			break
		}
	}
	lapi := rawAPI(t, leader.addr)
	boot, err := lapi.AclBootstrap(ctx, &pb.AclBootstrapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	admin := withToken(ctx, boot.GetSecret())
	if _, err := lapi.AclPolicyCreate(admin, &pb.AclPolicyCreateRequest{Policy: policyOf(t, "reader", "kv:jobs/:read")}); err != nil {
		t.Fatal(err)
	}
	tok, err := lapi.AclTokenCreate(admin, &pb.AclTokenCreateRequest{Policies: []string{"reader"}})
	if err != nil {
		t.Fatal(err)
	}
	put, err := lapi.KVPut(admin, &pb.KVPutRequest{Key: "jobs/before", Value: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the follower to apply the token", 30*time.Second, func() bool {
		_, ok := follower.d.Node.Security().TokenBySecret(tok.GetSecret())
		return ok
	})
	fctx, fcancel := context.WithTimeout(withToken(ctx, tok.GetSecret()), 10*time.Second)
	defer fcancel()
	// A start revision: a follower serves the watch itself.
	watch, err := rawAPI(t, follower.addr).KVWatch(fctx, &pb.KVWatchRequest{Key: "jobs/", Prefix: true, StartRevision: put.GetRevision()})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || !r.GetCreated() {
		t.Fatalf("watch created on the follower: %v %v", r, err)
	}
	if r, err := watch.Recv(); err != nil || len(r.GetEvents()) != 1 || r.GetEvents()[0].GetKv().GetKey() != "jobs/before" {
		t.Fatalf("the event before the revocation: %v %v", r, err)
	}
	if _, err := lapi.AclTokenRevoke(admin, &pb.AclTokenRevokeRequest{Id: tok.GetId()}); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if _, err := lapi.KVPut(admin, &pb.KVPutRequest{Key: "jobs/after", Value: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := watch.Recv()
		if err != nil {
			wantRevoked(t, "the follower's kv watch", err, revoked)
			return
		}
		for _, ev := range r.GetEvents() {
			t.Fatalf("the follower delivered after the revocation: %v", ev)
		}
	}
}

// TestRevocationEndsIdleStreams: streams that have nothing to deliver (a
// kv watch, an Observe, a waiting dequeue, a session stream, and one with
// an acquire waiting in line) end with PERMISSION_DENIED within a second
// of the revocation, without any write after it to wake them.
func TestRevocationEndsIdleStreams(t *testing.T) {
	a := startAuth(t)
	api := rawAPI(t, a.srv.Addr())
	for _, rv := range revocations(a, "kv::deny", "lock::deny", "queue::deny", "session::deny") {
		t.Run(rv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			lock := fmt.Sprint("idle/", a.n.Add(1))
			s := testutil.Session(t, ctx, a.admin)
			m, err := s.Mutex(lock)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			w := newWorker(t, ctx, a, "kv::read", "lock::write", "queue::write", "session::write")
			wctx, wcancel := context.WithTimeout(withToken(ctx, w.secret), 10*time.Second)
			defer wcancel()

			type end struct {
				what string
				err  error
			}
			ends := make(chan end, 5)
			watch, err := api.KVWatch(wctx, &pb.KVWatchRequest{Key: "idle/", Prefix: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := watch.Recv(); err != nil {
				t.Fatal(err)
			}
			ob, err := api.Observe(wctx, &pb.ObserveRequest{Name: lock})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ob.Recv(); err != nil {
				t.Fatal(err)
			}
			var sessions []*testutil.RawSession
			for _, acquire := range []bool{false, true} {
				raw, err := testutil.OpenRawSession(wctx, api)
				if err != nil {
					t.Fatal(err)
				}
				if err := raw.Send(&pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{Owner: "worker", TtlMs: 10_000}}}); err != nil {
					t.Fatal(err)
				}
				if r, err := raw.Recv(); err != nil || r.GetOpened() == nil {
					t.Fatalf("open: %v %v", r, err)
				}
				if acquire {
					if err := raw.Send(&pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: lock, Wait: true}}}); err != nil {
						t.Fatal(err)
					}
					if r, err := raw.Recv(); err != nil || r.GetQueued() == nil {
						t.Fatalf("acquire: %v %v, want queued", r, err)
					}
				}
				sessions = append(sessions, raw)
			}
			q := fmt.Sprint("idle/", a.n.Add(1))
			go func() {
				_, err := api.QueueDequeue(wctx, &pb.QueueDequeueRequest{Queue: q, Wait: true})
				ends <- end{"the waiting dequeue", err}
			}()
			testutil.WaitFor(t, "the dequeue to wait", 10*time.Second, func() bool { return a.srv.Hub.QueueWaiting(q) == 1 })
			go func() {
				for {
					if _, err := watch.Recv(); err != nil {
						ends <- end{"the kv watch", err}
						return
					}
				}
			}()
			go func() {
				for {
					if _, err := ob.Recv(); err != nil {
						ends <- end{"the observation", err}
						return
					}
				}
			}()
			for i, raw := range sessions {
				go func() {
					for {
						if _, err := raw.Recv(); err != nil {
							ends <- end{fmt.Sprint("session stream ", i), err}
							return
						}
					}
				}()
			}

			rv.revoke(t, ctx, w)
			revoked := time.Now()
			for range 5 {
				e := <-ends
				wantRevoked(t, e.what, e.err, revoked)
			}
		})
	}
}

// TestUnbindingEndsACertificatesWatch: a client certificate's identity
// loses its binding: its open kv watch ends with PERMISSION_DENIED within
// a second, and a put after the unbinding is never delivered.
func TestUnbindingEndsACertificatesWatch(t *testing.T) {
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
	if err := admin.CreatePolicy(ctx, policyOf(t, "readers", "kv:jobs/:read"), false); err != nil {
		t.Fatal(err)
	}
	if err := admin.BindIdentity(ctx, "watcher", []string{"readers"}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	w, err := as("watcher").Watch(wctx, "jobs/", client.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Put(ctx, "jobs/before", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if resp := <-w.C; len(resp.Events) != 1 || resp.Events[0].KV.Key != "jobs/before" {
		t.Fatalf("the event before the unbinding: %+v", resp)
	}
	if err := admin.UnbindIdentity(ctx, "watcher"); err != nil {
		t.Fatal(err)
	}
	unbound := time.Now()
	if _, err := admin.Put(ctx, "jobs/after", []byte("2")); err != nil {
		t.Fatal(err)
	}
	for resp := range w.C {
		if len(resp.Events) > 0 {
			t.Fatalf("delivered after the unbinding: %+v", resp)
		}
	}
	took := time.Since(unbound)
	if err := w.Err(); !errors.Is(err, client.ErrPermissionDenied) || took > revocationBound {
		t.Fatalf("the watch ended %v after the unbinding with %v, want PERMISSION_DENIED within %v", took, err, revocationBound)
	}
	t.Logf("the certificate's watch ended %v after the unbinding: %v", took, w.Err())
}
