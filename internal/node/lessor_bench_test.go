//go:build unix

package node_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

// The lessor at scale: a leader with 100,000 sessions (docs/benchmarks.md,
// "Session expiry at scale"). Run with
//
//	go test -run '^$' -bench BenchmarkLessor100k -benchtime 1x ./internal/node/

const benchSessions = 100_000

// openBenchNode starts a single durable node (the default log store) whose
// lessor runs on clk.
func openBenchNode(b *testing.B, clk clock.Clock) *node.Node {
	b.Helper()
	return node.OpenRunning(b, node.Config{DataDir: b.TempDir(), Clock: clk})
}

// createSessions opens count sessions with ttl, 1,024 proposals at a time
// (the node commits each such group in a few log entries), and returns
// their ids.
func createSessions(b *testing.B, n *node.Node, count int, ttl time.Duration) []uint64 {
	b.Helper()
	const window = 1024
	start := time.Now()
	ids := make([]uint64, 0, count)
	defer func() { b.Logf("created %d sessions in %v", count, time.Since(start)) }()
	for i := 0; i < count; i += window {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var first error
		for j := i; j < min(i+window, count); j++ {
			wg.Add(1)
			n.ProposeAsync(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "bench", TtlMs: ttl.Milliseconds()}}}, func(res fsm.Result, err error) {
				mu.Lock()
				if err != nil {
					first = err
				}
				ids = append(ids, res.Session)
				mu.Unlock()
				wg.Done()
			})
		}
		wg.Wait()
		if first != nil {
			b.Fatal(first)
		}
	}
	return ids
}

// awaitIdle waits until the lessor's loop has taken in the sessions just
// created and waits on its timer: it makes a timer after each wake-up (one
// a session), so once none was made for 200 ms it is idle. Only then does
// testutil.Elapse let time pass as it passes for a running server; a step
// taken while the loop is still busy is a stall to it.
func awaitIdle(clk *clock.Fake) {
	for {
		select {
		case <-clk.TimerCreated():
		case <-time.After(200 * time.Millisecond):
			return
		}
	}
}

func sessionCount(n *node.Node) (c int) {
	n.Read(func(s *fsm.State) { c = s.SessionCount() })
	return c
}

// reportCPU reports the CPU the process used over a 10 s window, in ms per
// second, as the benchmark's cpu-ms/s.
func reportCPU(b *testing.B) {
	b.ResetTimer()
	var perSec float64
	for i := 0; i < b.N; i++ {
		const window = 10 * time.Second
		before := cpuTime()
		time.Sleep(window)
		perSec = float64(cpuTime()-before) / float64(time.Millisecond) / window.Seconds()
	}
	b.ReportMetric(perSec, "cpu-ms/s")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLessor100k measures, on a leader holding 100,000 sessions:
//
//   - idle: the CPU the process uses (user+system, ms per second) over
//     10 s in which nothing happens but the lessor's own timers; the
//     sessions have a TTL of an hour and no keepalives.
//   - keptalive: the same while every session is renewed (in process,
//     node.KeepAlive) once every 3 s, as clients renew a 10 s TTL; this
//     includes the renewing goroutines.
//   - expire10k: 10,000 of the sessions fall due at the same instant
//     (a TTL of 5 s, the other 90,000 an hour; the lessor's clock is
//     driven with testutil.Elapse); the wall time from that instant until
//     the state holds none of them.
func BenchmarkLessor100k(b *testing.B) {
	b.Run("idle", func(b *testing.B) {
		n := openBenchNode(b, clock.Real)
		createSessions(b, n, benchSessions, time.Hour)
		time.Sleep(2 * time.Second) // settle: the creation's garbage, raft's snapshot checks
		reportCPU(b)
	})
	b.Run("keptalive", func(b *testing.B) {
		n := openBenchNode(b, clock.Real)
		ids := createSessions(b, n, benchSessions, 10*time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		const workers, period = 4, 3 * time.Second
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				per := benchSessions / workers
				tick := time.NewTicker(period / time.Duration(per/100))
				defer tick.Stop()
				for i := 0; ; i = (i + 100) % per {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					for _, id := range ids[w*per+i : w*per+i+100] {
						n.KeepAlive(ctx, id)
					}
				}
			}()
		}
		defer func() { cancel(); wg.Wait() }()
		time.Sleep(4 * time.Second) // every session renewed once
		reportCPU(b)
		if c := sessionCount(n); c != benchSessions {
			b.Fatalf("%d sessions left of %d: the renewals did not keep up", c, benchSessions)
		}
	})
	b.Run("expire10k", func(b *testing.B) {
		var ms float64
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			clk := clock.NewFake()
			n := openBenchNode(b, clk)
			const short, ttl = 10_000, 5 * time.Second
			createSessions(b, n, benchSessions-short, time.Hour)
			shortIDs := createSessions(b, n, short, ttl)
			awaitIdle(clk)
			testutil.Elapse(b, clk, ttl-100*time.Millisecond)
			if c := sessionCount(n); c != benchSessions {
				b.Fatalf("%d sessions before the deadline, want %d", c, benchSessions)
			}
			b.StartTimer()
			start := time.Now()
			testutil.Elapse(b, clk, 100*time.Millisecond)
			for deadline := time.Now().Add(30 * time.Second); sessionCount(n) > benchSessions-short; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					left, _ := n.SessionsTimeLeft(shortIDs)
					stuck := map[time.Duration]int{}
					for _, d := range left {
						stuck[d]++
					}
					b.Fatalf("%d sessions left after 30s; times left of the short ones: %v", sessionCount(n), stuck)
				}
			}
			ms = float64(time.Since(start)) / float64(time.Millisecond)
		}
		b.ReportMetric(ms, "ms/10k-expiry")
	})
}
