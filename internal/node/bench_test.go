package node_test

import (
	"context"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// BenchmarkProposeSequential: the latency of one durable commit through
// raft (one proposer, so nothing batches), per log engine.
func BenchmarkProposeSequential(b *testing.B) {
	for _, engine := range []string{"bolt", "wal"} {
		b.Run(engine, func(b *testing.B) {
			n := node.OpenRunning(b, node.Config{DataDir: b.TempDir(), LogStore: engine})
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				cmd := &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k"}}}
				if _, err := n.Propose(ctx, cmd); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
