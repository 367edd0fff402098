package node_test

import (
	"context"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// BenchmarkLeadershipPredicates: what asking a serving node whether it
// leads costs, from every core at once (the server asks on every session
// request, every keepalive and every ACL denial).
//
//	go test -run '^$' -bench 'LeadershipPredicates|KeepAliveParallel' -count 5 ./internal/node/
func BenchmarkLeadershipPredicates(b *testing.B) {
	n := node.OpenRunning(b, node.Config{DataDir: b.TempDir()})
	for _, c := range []struct {
		name string
		ask  func() bool
	}{
		{"IsLeader", n.IsLeader},
		{"Serving", n.Serving},
		{"CaughtUpLeader", n.CaughtUpLeader},
		{"LeadershipConfirmed", n.LeadershipConfirmed},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.ask()
				}
			})
		})
	}
}

// BenchmarkKeepAliveParallel: keepalives of one session on the leader,
// from every core at once: the leadership check, the leader lease (one
// barrier every 500 ms) and the lessor.
func BenchmarkKeepAliveParallel(b *testing.B) {
	n := node.OpenRunning(b, node.Config{DataDir: b.TempDir()})
	ctx := context.Background()
	res, err := n.Propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "o", TtlMs: 60_000, SecretHash: fsm.HashSecret(make([]byte, fsm.SecretBytes))}}})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := n.KeepAlive(ctx, res.Session); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
