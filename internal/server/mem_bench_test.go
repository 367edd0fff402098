package server_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// BenchmarkDistinctLockNames: b.N distinct lock names, each acquired and
// released once by 64 sessions working in parallel. The state shrinks as
// names fall out of use, so the heap afterwards (server and client in one
// process, after a GC) returns to within a few percent of the heap before;
// it reports both, their difference in percent, and the cycles per second.
//
//	go test -run '^$' -bench DistinctLockNames -benchtime 1000000x ./internal/server/
func BenchmarkDistinctLockNames(b *testing.B) {
	const workers = 64
	srv := testutil.Start(b, "", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := testutil.Dial(b, srv.Addr())
	var sessions []*client.Session
	for w := range workers {
		sessions = append(sessions, testutil.Session(b, ctx, c, client.WithOwner(fmt.Sprint("worker-", w))))
	}
	var next atomic.Int64
	run := func(n int64) { // names up to n, each once
		var wg sync.WaitGroup
		for _, s := range sessions {
			wg.Go(func() {
				for {
					i := next.Add(1)
					if i > n {
						return
					}
					m, _ := s.Mutex(fmt.Sprint("name-", i))
					h, err := m.Lock(ctx)
					if err != nil {
						b.Error(err)
						return
					}
					if err := h.Unlock(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	// heap is the live heap once it has settled: background work that
	// just finished (the snapshot's clean-up, idle request workers) lets
	// go of memory a little later, so it reads until two readings 100 ms
	// apart agree within 1% (at most 5 s).
	heap := func() float64 {
		read := func() float64 {
			runtime.GC()
			debug.FreeOSMemory()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return float64(ms.HeapAlloc) / (1 << 20)
		}
		last := read()
		for range 50 {
			time.Sleep(100 * time.Millisecond)
			now := read()
			if d := now - last; d < last/100 && d > -last/100 {
				return now
			}
			last = now
		}
		return last
	}
	// Warm up: connections, workers, raft's buffers, the first snapshot.
	run(50_000)
	if err := srv.Node.Snapshot(); err != nil {
		b.Fatal(err)
	}
	before := heap()
	b.ResetTimer()
	run(next.Load() + int64(b.N))
	b.StopTimer()
	if err := srv.Node.Snapshot(); err != nil { // the log before it is released, as it would be by the next automatic one
		b.Fatal(err)
	}
	after := heap()
	var locks int
	srv.Node.Read(func(st *fsm.State) { locks = st.LockCount() })
	if locks != 0 {
		b.Fatalf("%d locks left in the state", locks)
	}
	b.ReportMetric(before, "heap-before-MiB")
	b.ReportMetric(after, "heap-after-MiB")
	b.ReportMetric(100*(after-before)/before, "growth-%")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}
