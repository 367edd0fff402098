package node_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// BenchmarkProposeSequential: the latency of one durable commit through
// raft (one proposer, so nothing batches), per log engine.
func BenchmarkProposeSequential(b *testing.B) {
	for _, engine := range []string{"bolt", "wal"} {
		b.Run(engine, func(b *testing.B) {
			n, err := node.Open(node.Config{DataDir: b.TempDir(), LogStore: engine, LogOutput: io.Discard}, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { n.Run(ctx); close(done) }()
			defer func() { cancel(); <-done; n.Close() }()
			select {
			case <-n.Ready():
			case <-time.After(20 * time.Second):
				b.Fatal("not ready")
			}
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
