package server_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/testutil"
)

// BenchmarkQueueSnapshotStallServer measures, on a real node with
// 1,000,000 items of 100 bytes stored, what a raft snapshot (the state
// machine's clone, its serialisation and the write to disk) does to
// concurrent enqueues: "snapshot-ms" is how long the snapshot took,
// "max-during-ms" and "p99-during-ms" the slowest and 99th-percentile
// enqueue commit while it ran, "p99-before-ms" the 99th percentile just
// before it.
//
//	go test -run '^$' -bench BenchmarkQueueSnapshotStallServer -benchtime 1x ./internal/server/
func BenchmarkQueueSnapshotStallServer(b *testing.B) {
	srv := testutil.Start(b, "", nil)
	ctx := context.Background()
	payload := make([]byte, 100)
	enqueue := func() error {
		_, err := srv.Node.Propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_QueueEnqueue{QueueEnqueue: &fsmpb.QueueEnqueue{Queue: "q", Payload: payload}}})
		return err
	}
	// Prefill: 1,000 proposers, batched by the node into few entries.
	const stored, proposers = 1_000_000, 1000
	var wg sync.WaitGroup
	for p := range proposers {
		wg.Go(func() {
			for i := p; i < stored; i += proposers {
				if err := enqueue(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	measure := func(d time.Duration, during func()) []time.Duration {
		var lat []time.Duration
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				t := time.Now()
				if err := enqueue(); err != nil {
					b.Error(err)
					return
				}
				lat = append(lat, time.Since(t))
			}
		}()
		if during != nil {
			during()
		} else {
			time.Sleep(d)
		}
		close(stop)
		<-done
		slices.Sort(lat)
		return lat
	}
	p99 := func(l []time.Duration) float64 {
		if len(l) == 0 {
			return 0
		}
		return float64(l[(len(l)*99+99)/100-1].Microseconds()) / 1000
	}
	b.ResetTimer()
	var snapMs, maxDuring, p99During, p99Before float64
	for range b.N {
		before := measure(2*time.Second, nil)
		var took time.Duration
		during := measure(0, func() {
			t := time.Now()
			if err := srv.Node.Snapshot(); err != nil {
				b.Fatal(err)
			}
			took = time.Since(t)
		})
		snapMs = max(snapMs, float64(took.Microseconds())/1000)
		if len(during) > 0 {
			maxDuring = max(maxDuring, float64(during[len(during)-1].Microseconds())/1000)
		}
		p99During = max(p99During, p99(during))
		p99Before = max(p99Before, p99(before))
	}
	b.ReportMetric(snapMs, "snapshot-ms")
	b.ReportMetric(maxDuring, "max-during-ms")
	b.ReportMetric(p99During, "p99-during-ms")
	b.ReportMetric(p99Before, "p99-before-ms")
}
