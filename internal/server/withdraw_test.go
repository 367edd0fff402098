package server_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestWithdrawNotCommittedIsRetried: a waiter gives up while its node has
// just lost leadership, so the CancelAcquire that withdraws it cannot be
// committed. The server must not answer "cancelled" then, and the client
// must withdraw again on the next leader: otherwise the waiter is granted
// later, no Hold owns the grant, and every other waiter is blocked until
// the waiting session ends.
func TestWithdrawNotCommittedIsRetried(t *testing.T) {
	testutil.Slow(t)
	root := t.TempDir()
	peers := map[string]string{"n1": freePort(t), "n2": freePort(t), "n3": freePort(t)}
	started := make(chan *member, 3)
	for id := range peers {
		go func() { started <- startMember(t, root, id, peers[id], peers) }()
	}
	ms := []*member{<-started, <-started, <-started}
	c := clusterClient(t, ms)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Long TTLs: no keepalive (every 20 s) tells the client of the
	// leadership loss before the waiter gives up.
	sess := func(owner string) *client.Session {
		s, err := c.NewSession(ctx, client.WithTTL(time.Minute), client.WithOwner(owner))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// Bounded: the restarted followers are stopped first (cleanups
			// run last first), and a close the cluster cannot commit would
			// otherwise wait for the minute-long TTL.
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			s.Close(cctx)
		})
		return s
	}
	lock := func(s *client.Session) *client.Mutex {
		m, err := s.Mutex("res")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	holder, err := lock(sess("holder")).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, giveUp := context.WithCancel(ctx)
	queued := make(chan int, 1)
	gaveUp := make(chan error, 1)
	waiter := sess("waiter")
	go func() {
		_, err := lock(waiter).Lock(wctx, client.OnQueued(func(p int) { queued <- p }))
		gaveUp <- err
	}()
	if p := <-queued; p != 1 {
		t.Fatalf("waiter queued at %d", p)
	}

	// The leader loses its quorum: stop both followers.
	_, leaderID := voterIDs(t, ctx, c)
	var leader *member
	var stopped []*member
	for _, m := range ms {
		if m.id == leaderID {
			leader = m
		} else {
			m.stop()
			stopped = append(stopped, m)
		}
	}
	testutil.WaitFor(t, "the leader to step down", 20*time.Second, func() bool { return leader.d.Node.Status().Leader != leader.id })

	giveUp()
	if err := <-gaveUp; err == nil {
		t.Fatal("the waiter's Lock succeeded after its context ended")
	}
	// The withdrawal is answered with the failure of its CancelAcquire,
	// and the client leaves the stream of that node to find a leader.
	testutil.WaitFor(t, "the withdrawal to be answered", 20*time.Second, func() bool { return leader.d.Hub.StreamsOf(waiter.ID()) == 0 })

	// The followers come back, on the same addresses: a leader again.
	for _, m := range stopped {
		restartMember(t, root, m, peers)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The waiter withdrew: the next session gets the lock.
	nctx, ncancel := context.WithTimeout(ctx, 20*time.Second)
	defer ncancel()
	next, err := lock(sess("next")).Lock(nctx)
	if err != nil {
		st, _ := c.LockStatus(ctx, "res")
		t.Fatalf("the next waiter got nothing (%v): the lock is %v", err, st)
	}
	if next.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", next.Token(), holder.Token())
	}
}

// restartMember starts stopped member m again on its data, peer address
// and client address.
func restartMember(t *testing.T, root string, m *member, peers map[string]string) {
	t.Helper()
	d, err := daemon.Start(daemon.Config{NodeID: m.id, DataDir: filepath.Join(root, m.id), Listen: m.d.Addr(), PeerListen: m.peer, BootstrapPeers: peers, LogOutput: testutil.LogWriter(t, m.id)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("%s stopped: %v", m.id, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready", m.id)
	}
}
