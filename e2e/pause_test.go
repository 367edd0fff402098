package e2e

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestServerResumingFromStopExpiresNoSessionOnResume: a single server is
// stopped (SIGSTOP) for 8 s while 50 sessions with a TTL of 3 s keep
// renewing; their keepalives wait in its sockets. When it resumes, it
// charges no session for the time it did not run: none expires on
// resume (they would all have been past their deadline). Their clients
// gave up meanwhile (no renewal was confirmed before their safe
// deadlines), so the sessions do expire, a TTL later.
func TestServerResumingFromStopExpiresNoSessionOnResume(t *testing.T) {
	addr := freeAddr(t)
	srv := startServer(t, addr, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dial(t, ctx, addr)
	const sessions = 50
	for i := 0; i < sessions; i++ {
		if _, err := c.NewSession(ctx, client.WithTTL(3*time.Second), client.WithOwner(fmt.Sprint("s", i))); err != nil {
			t.Fatal(err)
		}
	}
	srv.signal(syscall.SIGSTOP)
	time.Sleep(8 * time.Second) // the length of the stall
	srv.signal(syscall.SIGCONT)
	resumed := time.Now()

	// A fresh client, so that its calls do not queue behind the old ones.
	watch := dial(t, ctx, addr)
	for time.Since(resumed) < 1500*time.Millisecond {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		list, err := watch.Sessions(rctx)
		rcancel()
		if err != nil {
			t.Fatal(err)
		}
		if n := len(list.GetSessions()); n != sessions {
			t.Fatalf("%v after resuming: %d of %d sessions left", time.Since(resumed).Round(time.Millisecond), n, sessions)
		}
	}
	testutil.WaitFor(t, "the abandoned sessions to expire", 20*time.Second, func() bool {
		list, err := watch.Sessions(ctx)
		return err == nil && len(list.GetSessions()) == 0
	})
	t.Logf("expired %v after resuming", time.Since(resumed).Round(time.Millisecond))
}

// TestClusterLeaderStoppedKeepsEveryHold: the leader of a 3-node cluster
// is stopped (SIGSTOP) for 5 s while 20 sessions (TTL 5 s) hold a lock
// each. The others elect a new leader; every session notices that its
// renewals go unconfirmed, moves to another endpoint and resumes there.
// No hold is lost: each is suspect for a moment, then held again with the
// same token, and stays so once the old leader resumes. That old leader
// confirms no keepalive sent while it was stopped.
func TestClusterLeaderStoppedKeepsEveryHold(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dial(t, ctx, endpoints(ms))

	type change struct {
		st client.State
		at time.Time
	}
	type held struct {
		h       *client.Hold
		changes []change
	}
	const holds = 20
	var mu sync.Mutex
	hs := make([]*held, holds)
	var wg sync.WaitGroup
	for i := range hs {
		s, err := c.NewSession(ctx, client.WithTTL(5*time.Second), client.WithOwner(fmt.Sprint("h", i)))
		if err != nil {
			t.Fatal(err)
		}
		m, _ := s.Mutex(fmt.Sprint("res-", i))
		h, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = &held{h: h}
		ch := h.Changes()
		wg.Go(func() {
			for st := range ch {
				mu.Lock()
				hs[i].changes = append(hs[i].changes, change{st, time.Now()})
				mu.Unlock()
			}
		})
	}
	leader, others := leaderOf(t, ctx, c, ms)
	// A session that can reach only the leader: whatever the leader
	// confirms to it after it is stopped, it confirms as a deposed leader.
	only := dial(t, ctx, leader.addr)
	lone, err := only.NewSession(ctx, client.WithTTL(9*time.Second), client.WithOwner("lone"))
	if err != nil {
		t.Fatal(err)
	}

	stopped := time.Now()
	leader.p.signal(syscall.SIGSTOP)
	rest := dial(t, ctx, endpoints(others))
	var elected time.Duration
	testutil.WaitFor(t, "a new leader", 10*time.Second, func() bool {
		sctx, scancel := context.WithTimeout(ctx, time.Second)
		defer scancel()
		st, err := rest.Status(sctx)
		if err == nil && st.GetLeader() != "" && st.GetLeader() != leader.id {
			elected = time.Since(stopped)
			return true
		}
		return false
	})
	time.Sleep(5*time.Second - time.Since(stopped)) // the length of the stop
	leader.p.signal(syscall.SIGCONT)
	resumed := time.Now()

	testutil.WaitFor(t, "every hold held again", 20*time.Second, func() bool {
		for _, x := range hs {
			if x.h.State() != client.Held {
				return false
			}
		}
		return true
	})
	allHeld := time.Since(stopped)
	time.Sleep(3 * time.Second) // and still held a while after the old leader resumed
	var longest, moved time.Duration
	for i, x := range hs {
		st, err := c.LockStatus(ctx, fmt.Sprint("res-", i))
		if err != nil {
			t.Fatal(err)
		}
		if x.h.State() != client.Held || len(st.GetHolders()) != 1 || st.GetHolders()[0].GetToken() != x.h.Token() || st.GetHolders()[0].GetSession() != x.h.SessionID() {
			t.Fatalf("hold %d: %v with token %d; the lock: %v", i, x.h.State(), x.h.Token(), st)
		}
		mu.Lock()
		var suspect time.Time
		for _, ch := range x.changes {
			switch ch.st {
			case client.Suspect:
				suspect = ch.at
			case client.Held:
				longest = max(longest, ch.at.Sub(suspect))
				moved = max(moved, ch.at.Sub(stopped))
			default:
				t.Errorf("hold %d went %v", i, ch.st)
			}
		}
		mu.Unlock()
	}
	t.Logf("new leader after %v; the last hold held again (on the new leader) %v after the stop; longest suspect %v; all held %v after",
		elected.Round(time.Millisecond), moved.Round(time.Millisecond), longest.Round(time.Millisecond), allHeld.Round(time.Millisecond))

	// The lone session's last confirmed renewal was sent before the stop.
	if sent := lone.SafeDeadline().Add(-9*time.Second + 9*time.Second/100 + 5*time.Millisecond); !sent.Before(stopped) {
		t.Fatalf("the stopped leader confirmed a keepalive sent %v after it was stopped (resumed %v after)", sent.Sub(stopped), resumed.Sub(stopped))
	}
	for _, x := range hs {
		if err := x.h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}

// TestFollowerCutsRelaysToAStoppedLeader: a client that reaches the
// cluster only through a follower (no discovery: the follower forwards
// every request to the leader) holds a lock when the leader is stopped
// (SIGSTOP). The follower's relay of the session's stream to the stopped
// leader is silent, not broken; once the follower sees another leader it
// ends that relay, the client resumes its session through the same
// follower, now forwarded to the new leader, and the hold is never lost:
// suspect for a moment, then held again with the same token before its
// TTL runs out.
func TestFollowerCutsRelaysToAStoppedLeader(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all := dial(t, ctx, endpoints(ms))
	leader, others := leaderOf(t, ctx, all, ms)
	c := dial(t, ctx, others[0].addr)
	s, err := c.NewSession(ctx, client.WithTTL(6*time.Second), client.WithOwner("through-follower"))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Mutex("cut-relay")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	token := h.Token()
	var mu sync.Mutex
	var states []client.State
	ch := h.Changes()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for st := range ch {
			mu.Lock()
			states = append(states, st)
			mu.Unlock()
		}
	}()

	leader.p.signal(syscall.SIGSTOP)
	stopped := time.Now()
	t.Cleanup(func() { leader.p.signal(syscall.SIGCONT) })
	testutil.WaitFor(t, "the hold to be suspect once the leader stopped answering", 10*time.Second, func() bool {
		return h.State() != client.Held
	})
	testutil.WaitFor(t, "the hold held again through the follower", 15*time.Second, func() bool {
		return h.State() == client.Held
	})
	t.Logf("held again %v after the leader stopped", time.Since(stopped).Round(time.Millisecond))
	if got := h.Token(); got != token {
		t.Fatalf("token changed from %d to %d", token, got)
	}
	leader.p.signal(syscall.SIGCONT)
	if err := h.Unlock(ctx); err != nil {
		t.Fatalf("release through the follower: %v", err)
	}
	<-done
	mu.Lock()
	defer mu.Unlock()
	for _, st := range states {
		if st == client.Lost {
			t.Fatalf("the hold was lost: %v", states)
		}
	}
}
