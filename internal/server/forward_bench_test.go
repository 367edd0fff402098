package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// BenchmarkForwarding measures what a follower's forwarding costs on a
// 3-node loopback cluster: a lock and unlock cycle, and a KV put, by one
// client connected to the leader, by one connected to a follower only
// (which relays the session stream and the put to the leader over the
// peer port), and by one given the follower first and the leader second
// (which moves to the leader once the follower named it).
//
//	go test -run '^$' -bench BenchmarkForwarding -benchtime 3s ./internal/server/
func BenchmarkForwarding(b *testing.B) {
	ms := startCluster(b, 3)
	var leader, follower *member
	testutil.WaitFor(b, "a leader every member knows, and the keys on every member", 30*time.Second, func() bool {
		leader, follower = nil, nil
		for _, m := range ms {
			if len(m.d.Node.Security().Keys) == 0 {
				return false
			}
			if m.d.Node.IsLeader() {
				leader = m
			}
		}
		for _, m := range ms {
			if leader == nil || m.d.Node.Leader() != leader.id {
				return false
			}
			if m != leader {
				follower = m
			}
		}
		return true
	})
	cases := []struct {
		role string
		eps  string  // the endpoints the client is given
		want *member // where its requests go in the end
	}{
		{"leader", leader.d.Addr(), leader},
		// One endpoint: the follower names the leader, but the client
		// goes only to endpoints it was given (no discovery).
		{"follower", follower.d.Addr(), follower},
		// The follower first, then the leader: the client moves to the
		// leader once the follower named it.
		{"follower-first", follower.d.Addr() + "," + leader.d.Addr(), leader},
	}
	for _, cs := range cases {
		role := cs.role
		ctx := context.Background()
		c := testutil.Dial(b, cs.eps)
		s := testutil.Session(b, ctx, c, client.WithOwner(role))
		m, err := s.Mutex("bench-" + role)
		if err != nil {
			b.Fatal(err)
		}
		testutil.WaitFor(b, "the client where it settles", 10*time.Second, func() bool {
			if _, err := c.Put(ctx, "bench/"+role, []byte("v")); err != nil {
				b.Fatal(err)
			}
			return c.Endpoint() == cs.want.d.Addr()
		})
		b.Run(fmt.Sprintf("lock-unlock/via-%s", role), func(b *testing.B) {
			for b.Loop() {
				h, err := m.Lock(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("kv-put/via-%s", role), func(b *testing.B) {
			for b.Loop() {
				if _, err := c.Put(ctx, "bench/"+role, []byte("v")); err != nil {
					b.Fatal(err)
				}
			}
		})
		if c.Endpoint() != cs.want.d.Addr() {
			b.Fatalf("the client moved to %s", c.Endpoint())
		}
	}
}
