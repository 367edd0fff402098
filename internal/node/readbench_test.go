//go:build tenurefault

package node_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// BenchmarkClusterRead: the latency of one linearizable read on the
// leader of three voters, confirmed by a read round (readindex.go) or
// through raft's leader loop (VerifyLeader), idle and while 16 writers
// keep the leader's log appending, each append made to take at least
// appendDelay more (a slower disk than the test machine's).
func BenchmarkClusterRead(b *testing.B) {
	const appendDelay = 2 * time.Millisecond
	addrA, addrB, addrC := freeAddr(b), freeAddr(b), freeAddr(b)
	var slow sync.Map // node id → true: its appends are slowed
	a := node.OpenRunning(b, node.Config{NodeID: "a", DataDir: b.TempDir(), PeerAddr: addrA, Faults: node.Faults{BeforeAppend: func(id string) {
		if _, ok := slow.Load(id); ok {
			time.Sleep(appendDelay)
		}
	}}})
	ctx := context.Background()
	joining(b, "b", addrB)
	joining(b, "c", addrC)
	for _, m := range []struct{ id, addr string }{{"b", addrB}, {"c", addrC}} {
		if err := a.AddVoter(ctx, m.id, m.addr, 0); err != nil {
			b.Fatalf("adding %s: %v", m.id, err)
		}
	}
	reads := []struct {
		name string
		read func(context.Context) error
	}{{"round", a.LinearizableRead}, {"verify", a.VerifyLeaderRead}}
	for _, load := range []string{"idle", "writes"} {
		for _, r := range reads {
			b.Run(load+"/"+r.name, func(b *testing.B) {
				stop := make(chan struct{})
				var wg sync.WaitGroup
				var writes atomic.Int64
				if load == "writes" {
					slow.Store("a", true)
					defer slow.Delete("a")
					for w := range 16 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							key := "w" + strconv.Itoa(w)
							for {
								select {
								case <-stop:
									return
								default:
								}
								if _, err := a.Propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: []byte("v")}}}); err != nil {
									b.Error(err)
									return
								}
								writes.Add(1)
							}
						}()
					}
				}
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					if err := r.read(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(writes.Load())/time.Since(start).Seconds(), "writes/s")
				close(stop)
				wg.Wait()
			})
		}
	}
}
