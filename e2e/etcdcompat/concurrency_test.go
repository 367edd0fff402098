package etcdcompat

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// client is a clientv3 client of endpoints, closed when the test ends.
func client(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func session(t *testing.T, c *clientv3.Client, opts ...concurrency.SessionOption) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestMutex follows etcd's own examples of concurrency.Mutex (TryLock,
// Lock), then has eight sessions contend: never two holders, and each
// holder's fence (its key's create revision) grows.
func TestMutex(t *testing.T) {
	cli := client(t, startTenure(t).Etcd)
	ctx := tctx(t)

	// ExampleMutex_TryLock
	s1, s2 := session(t, cli), session(t, cli)
	m1, m2 := concurrency.NewMutex(s1, "/my-lock"), concurrency.NewMutex(s2, "/my-lock")
	if err := m1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m2.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("TryLock of a held mutex: %v", err)
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m2.TryLock(ctx); err != nil {
		t.Fatalf("TryLock of a free mutex: %v", err)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// ExampleMutex_Lock
	m1, m2 = concurrency.NewMutex(s1, "/my-lock/"), concurrency.NewMutex(s2, "/my-lock/")
	if err := m1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	go func() { locked <- m2.Lock(ctx) }()
	select {
	case err := <-locked:
		t.Fatalf("s2 locked while s1 holds: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Contention.
	var (
		inside atomic.Int32
		mu     sync.Mutex
		fences []int64
		wg     sync.WaitGroup
	)
	errc := make(chan error, 8*5*3)
	for range 8 {
		s := session(t, cli)
		wg.Go(func() {
			m := concurrency.NewMutex(s, "/contended/")
			for range 5 {
				if err := m.Lock(ctx); err != nil {
					errc <- err
					return
				}
				if n := inside.Add(1); n != 1 {
					errc <- errors.New("two holders at once")
					return
				}
				// The fence: the create revision of the holder's key, at or
				// below the revision Lock answered at.
				g, err := cli.Get(ctx, m.Key())
				if err != nil || len(g.Kvs) != 1 || g.Kvs[0].CreateRevision > m.Header().Revision {
					errc <- errors.New("the holder's key is missing or newer than its grant")
					return
				}
				mu.Lock()
				fences = append(fences, g.Kvs[0].CreateRevision)
				mu.Unlock()
				inside.Add(-1)
				if err := m.Unlock(ctx); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences %v do not grow", fences)
		}
	}
	if len(fences) != 40 {
		t.Fatalf("%d grants", len(fences))
	}
}

// TestElection follows etcd's ExampleElection_Campaign: e2 wins, e1 waits;
// e2 resigns and e1 wins; an observer sees both, and a proclamation.
func TestElection(t *testing.T) {
	cli := client(t, startTenure(t).Etcd)
	ctx := tctx(t)
	s1, s2 := session(t, cli), session(t, cli)
	e1, e2 := concurrency.NewElection(s1, "/my-election/"), concurrency.NewElection(s2, "/my-election/")
	obs := concurrency.NewElection(session(t, cli), "/my-election/").Observe(ctx)
	if err := e2.Campaign(ctx, "e2"); err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() { won <- e1.Campaign(ctx, "e1") }()
	next := func() string {
		t.Helper()
		select {
		case r, ok := <-obs:
			if !ok {
				t.Fatal("observe ended")
			}
			return string(r.Kvs[0].Value)
		case <-time.After(10 * time.Second):
			t.Fatal("no leader change observed")
		}
		return ""
	}
	if v := next(); v != "e2" {
		t.Fatalf("first leader %q", v)
	}
	if err := e2.Proclaim(ctx, "e2 again"); err != nil {
		t.Fatal(err)
	}
	if v := next(); v != "e2 again" {
		t.Fatalf("after proclaim %q", v)
	}
	if l, err := e1.Leader(ctx); err != nil || string(l.Kvs[0].Value) != "e2 again" {
		t.Fatalf("Leader: %v %v", l, err)
	}
	select {
	case err := <-won:
		t.Fatalf("e1 won while e2 leads: %v", err)
	default:
	}
	if err := e2.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	if v := next(); v != "e1" {
		t.Fatalf("second leader %q", v)
	}
}

// TestSession: a session's lease has its TTL, is kept alive past it, and
// Done is closed once the lease is revoked.
func TestSession(t *testing.T) {
	cli := client(t, startTenure(t).Etcd)
	ctx := tctx(t)
	s := session(t, cli, concurrency.WithTTL(2))
	ttl, err := cli.TimeToLive(ctx, s.Lease())
	if err != nil || ttl.GrantedTTL != 2 {
		t.Fatalf("TimeToLive %+v %v", ttl, err)
	}
	time.Sleep(3 * time.Second) // past the TTL: only keepalives hold it
	select {
	case <-s.Done():
		t.Fatal("the session ended while kept alive")
	default:
	}
	if _, err := cli.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the lease was revoked")
	}
}
