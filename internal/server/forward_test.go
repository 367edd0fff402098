//go:build tenurefault

package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	tu "github.com/tenure-io/tenure/internal/testutil"
)

// TestFollowersForwardWhenTheLeadersClientAPIIsCut: the leader's client
// API is blackholed while it keeps leading. A client given only a
// follower's endpoint, one given every endpoint that locked on the
// leader itself, and one that finds the cluster from a follower after the
// cut keep their holds (held, token unchanged) for several TTLs, and new
// acquires, releases and writes through a follower succeed: the follower
// relays them to the leader over the peer port. The followers name the
// leader in their answers, but the clients, unable to reach it, stay on
// the followers.
//
// The scenario needs the leader to keep leading throughout: on a machine
// that stalls long enough for an election, a hold may become suspect
// because leadership moved, which proves nothing of forwarding. Such an
// attempt is run again on a new cluster, at most three times.
func TestFollowersForwardWhenTheLeadersClientAPIIsCut(t *testing.T) {
	tu.Slow(t)
	for attempt := 1; attempt <= 3; attempt++ {
		if forwardWhenTheLeadersClientAPIIsCut(t) {
			return
		}
		t.Logf("attempt %d: leadership moved during the scenario; again on a new cluster", attempt)
	}
	t.Fatal("leadership moved in each of 3 attempts: the test proved nothing")
}

// forwardWhenTheLeadersClientAPIIsCut runs the scenario once; false when
// the leader lost its leadership (or its term moved) during it, before
// anything failed for another reason.
func forwardWhenTheLeadersClientAPIIsCut(t *testing.T) bool {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader, followers := forwarding(t, ms)
	term := leader.d.Node.Leadership().Term
	// moved reports whether the leader stopped leading term, waiting a
	// little for it: a hold may turn suspect before the election ends.
	moved := func() bool {
		return tu.PollUntil(3*time.Second, func() (bool, error) {
			l := leader.d.Node.Leadership()
			return !l.Leading || l.Term != term, nil
		}) == nil
	}
	const ttl = 2 * time.Second

	// One client is given a follower only, without discovery: the
	// leader's address, which the follower names, is not one it was
	// given, so it stays there whatever happens. The other is given every
	// member, the leader first.
	viaFollower := tu.Dial(t, followers[0].d.Addr())
	all := tu.Dial(t, strings.Join([]string{leader.d.Addr(), followers[0].d.Addr(), followers[1].d.Addr()}, ","))
	s1 := tu.Session(t, ctx, viaFollower, client.WithTTL(ttl), client.WithOwner("via-follower"))
	s2 := tu.Session(t, ctx, all, client.WithTTL(ttl), client.WithOwner("all-endpoints"))
	lock := func(s *client.Session, name string) *client.Hold {
		t.Helper()
		m, err := s.Mutex(name)
		if err != nil {
			t.Fatal(err)
		}
		lctx, lcancel := context.WithTimeout(ctx, 20*time.Second)
		defer lcancel()
		h, err := m.Lock(lctx)
		if err != nil {
			t.Fatalf("lock %s: %v", name, err)
		}
		return h
	}
	h1 := lock(s1, "one")
	h2 := lock(s2, "two")
	if all.Endpoint() != leader.d.Addr() {
		t.Fatalf("the client given every endpoint locked at %s, the leader is at %s", all.Endpoint(), leader.d.Addr())
	}
	tok1, tok2 := h1.Token(), h2.Token()

	ch1, ch2 := h1.Changes(), h2.Changes()
	leader.d.BlackholeClientAPI(true)
	defer leader.d.BlackholeClientAPI(false)

	// A third finds the cluster from the other follower once the cut is
	// in place (as the CLI does): it learns the leader's address, from
	// the member list and from the follower's answers, but cannot reach
	// it, so it stays on the follower.
	late := tu.Dial(t, followers[1].d.Addr(), client.WithDiscovery())
	s3 := tu.Session(t, ctx, late, client.WithTTL(ttl), client.WithOwner("late"))
	h4 := lock(s3, "four")
	tok4, ch4 := h4.Token(), h4.Changes()

	// For four TTLs neither hold is lost; the one through the follower
	// stays held throughout (the follower relays its keepalives), the
	// other moves to a follower within a TTL.
	timer := time.NewTimer(4 * ttl)
	defer timer.Stop()
watch:
	for {
		select {
		case st := <-ch1:
			if moved() {
				return false
			}
			t.Fatalf("the hold through the follower became %v (%v) with the leader's client API cut", st, h1.Err())
		case st, ok := <-ch2:
			if !ok || st == client.Lost || st == client.Released {
				if moved() {
					return false
				}
				t.Fatalf("the hold of the client given every endpoint became %v (%v)", h2.State(), h2.Err())
			}
		case st := <-ch4:
			if moved() {
				return false
			}
			t.Fatalf("the hold of the client that found the cluster after the cut became %v (%v)", st, h4.Err())
		case <-timer.C:
			break watch
		}
	}
	tu.WaitFor(t, "the hold of the client given every endpoint held again", 10*time.Second, func() bool {
		return h2.State() == client.Held
	})
	if h1.Token() != tok1 || h2.Token() != tok2 || h4.Token() != tok4 {
		t.Fatalf("tokens changed: %d→%d, %d→%d, %d→%d", tok1, h1.Token(), tok2, h2.Token(), tok4, h4.Token())
	}
	if l := leader.d.Node.Leadership(); !l.Leading || l.Term != term {
		return false
	}
	if viaFollower.Endpoint() != followers[0].d.Addr() {
		t.Fatalf("the client given a follower is at %s, not the follower", viaFollower.Endpoint())
	}
	if late.Endpoint() != followers[1].d.Addr() {
		t.Fatalf("the client that found the cluster after the cut is at %s, not the follower %s", late.Endpoint(), followers[1].d.Addr())
	}
	if all.Endpoint() == leader.d.Addr() {
		t.Fatal("the client given every endpoint is back on the leader, whose client API is cut")
	}

	// New work through the follower: an acquire, a release, a put, a
	// fenced write with the held token.
	h3 := lock(s1, "three")
	if err := h3.Unlock(ctx); err != nil {
		t.Fatalf("unlock through the follower: %v", err)
	}
	// A watch from now needs the leader (a linearizable read of the
	// revision): the follower forwards the stream with its request.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w, err := viaFollower.Watch(wctx, "k")
	if err != nil {
		t.Fatalf("watch through the follower: %v", err)
	}
	if _, err := viaFollower.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("put through the follower: %v", err)
	}
	select {
	case r, ok := <-w.C:
		if !ok || len(r.Events) != 1 || string(r.Events[0].KV.Value) != "v" {
			t.Fatalf("the watch through the follower: %+v %v (%v)", r, ok, w.Err())
		}
	case <-ctx.Done():
		t.Fatal("the watch through the follower saw nothing")
	}
	wcancel()
	if res, err := viaFollower.FencedPut(ctx, "reg", []byte("x"), tok1, "op-1", client.WithLock("one")); err != nil || !res.Accepted {
		t.Fatalf("fenced put through the follower: %+v %v", res, err)
	}
	if got, err := viaFollower.Get(ctx, "k"); err != nil || len(got.KVs) != 1 {
		t.Fatalf("linearizable get through the follower: %+v %v", got, err)
	}
	if l := leader.d.Node.Leadership(); !l.Leading || l.Term != term {
		return false
	}
	if n := forwardedCount(t, followers[0]); n == 0 {
		t.Fatal("the follower counted no forwarded request (tenure_forwarded_requests_total)")
	}
	if err := h1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h4.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	return true
}

// TestClientsMoveToTheLeaderFromAForwardingFollower: a client given a
// follower's endpoint (with discovery) is served by forwarding at first;
// the follower names the leader in its answers, and the client, having
// checked the leader's endpoint, moves its requests and its session
// there. Afterwards the follower forwards nothing more for it, the
// session's only stream on the leader came by the leader's own client
// API, and the hold taken through the follower stayed Held with its
// token throughout.
func TestClientsMoveToTheLeaderFromAForwardingFollower(t *testing.T) {
	tu.Slow(t)
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader, followers := forwarding(t, ms)
	const ttl = 2 * time.Second

	c := tu.Dial(t, followers[0].d.Addr(), client.WithDiscovery())
	s := tu.Session(t, ctx, c, client.WithTTL(ttl), client.WithOwner("follower-first"))
	lock := func(name string) *client.Hold {
		t.Helper()
		m, err := s.Mutex(name)
		if err != nil {
			t.Fatal(err)
		}
		lctx, lcancel := context.WithTimeout(ctx, 20*time.Second)
		defer lcancel()
		h, err := m.Lock(lctx)
		if err != nil {
			t.Fatalf("lock %s: %v", name, err)
		}
		return h
	}
	h := lock("one")
	tok, ch := h.Token(), h.Changes()
	if n := forwardedCount(t, followers[0]); n == 0 {
		t.Fatal("the follower forwarded nothing: the test proves nothing")
	}

	tu.WaitFor(t, "the client on the leader, and its session's stream there", 15*time.Second, func() bool {
		if _, err := c.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatalf("put: %v", err)
		}
		return c.Endpoint() == leader.d.Addr() && leader.d.Hub.DirectStreamsOf(s.ID()) == 1 && leader.d.Hub.StreamsOf(s.ID()) == 1
	})
	before := forwardedCount(t, followers[0])
	for i := range 20 {
		if _, err := c.Put(ctx, "k", []byte(fmt.Sprint(i))); err != nil {
			t.Fatalf("put: %v", err)
		}
	}
	if err := lock("two").Unlock(ctx); err != nil {
		t.Fatalf("unlock: %v", err)
	}
	if after := forwardedCount(t, followers[0]); after != before {
		t.Fatalf("the follower still forwards for the client: %v forwarded requests, then %v", before, after)
	}

	// The hold never left Held through the move.
	select {
	case st := <-ch:
		t.Fatalf("the hold became %v (%v) through the move", st, h.Err())
	default:
	}
	if h.State() != client.Held || h.Token() != tok {
		t.Fatalf("the hold is %v with token %d, was Held with %d", h.State(), h.Token(), tok)
	}
	if !leader.d.Node.IsLeader() {
		t.Fatalf("%s stopped leading: the test proves nothing", leader.id)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// forwarding waits until ms have a leader every member knows and every
// member holds the cluster's signing keys (a member's proof on the
// forward door: until then a follower redirects rather than forwards),
// and returns the leader and the followers.
func forwarding(t *testing.T, ms []*member) (leader *member, followers []*member) {
	t.Helper()
	// Forwarding starts once a member holds the cluster's signing keys
	// (its proof on the forward door); until then a follower redirects.
	tu.WaitFor(t, "a leader every member knows, and the keys on every member", 30*time.Second, func() bool {
		leader, followers = nil, nil
		for _, m := range ms {
			if len(m.d.Node.Security().Keys) == 0 {
				return false
			}
		}
		for _, m := range ms {
			if m.d.Node.IsLeader() {
				leader = m
			}
		}
		if leader == nil {
			return false
		}
		for _, m := range ms {
			if m != leader {
				if m.d.Node.Leader() != leader.id {
					return false
				}
				followers = append(followers, m)
			}
		}
		return true
	})
	return leader, followers
}

// forwardedCount sums m's tenure_forwarded_requests_total.
func forwardedCount(t *testing.T, m *member) float64 {
	t.Helper()
	mfs, err := m.d.Hub.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "tenure_forwarded_requests_total" {
			for _, c := range mf.GetMetric() {
				n += c.GetCounter().GetValue()
			}
		}
	}
	return n
}
