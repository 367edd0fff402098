package server_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// The scale benchmarks: many idle sessions, and many waiters on one lock.
// Each runs against an in-process server, or against a running `tenure
// serve` when TENURE_BENCH_ADDR names its address and TENURE_BENCH_PID its
// process (then the server's RSS and CPU are read from /proc; in process,
// the live heap of the process, client included, stands for it).
// TENURE_BENCH_N is the number of sessions (default 100,000) and
// TENURE_BENCH_CONNS the client connections they share (default 4);
// TENURE_BENCH_OPENERS sessions are opened at a time (default 256):
//
//	TENURE_BENCH_N=1000000 go test -run '^$' -bench 'IdleSessions|Waiters' -benchtime 1x -timeout 60m ./internal/server/

// scaleTarget is the server a scale benchmark measures.
type scaleTarget struct {
	addr string
	pid  int // 0: in process
}

func newScaleTarget(b *testing.B) scaleTarget { return newScaleTargetWith(b, fsm.Limits{}) }

// newScaleTargetWith is newScaleTarget whose in-process server has the
// given cluster limits (zero fields: the defaults).
func newScaleTargetWith(b *testing.B, limits fsm.Limits) scaleTarget {
	if addr := os.Getenv("TENURE_BENCH_ADDR"); addr != "" {
		pid, err := strconv.Atoi(os.Getenv("TENURE_BENCH_PID"))
		if err != nil {
			b.Fatalf("TENURE_BENCH_PID: %v", err)
		}
		return scaleTarget{addr: addr, pid: pid}
	}
	return scaleTarget{addr: testutil.StartConfig(b, daemon.Config{ClusterLimits: limits}).Addr()}
}

// memMiB is the server's RSS (external) or the process's live heap after
// a GC (in process).
func (t scaleTarget) memMiB(b *testing.B) float64 {
	if t.pid == 0 {
		runtime.GC()
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapAlloc) / (1 << 20)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", t.pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// cpuSeconds is the server's CPU time so far (external), or the process's
// (in process: client included).
func (t scaleTarget) cpuSeconds(b *testing.B) float64 {
	pid := "self"
	if t.pid != 0 {
		pid = strconv.Itoa(t.pid)
	}
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// openSessions opens n sessions (TTL 60 s) over conns client connections,
// TENURE_BENCH_OPENERS at a time, and reports the creation rate overall and of the slowest
// tenth.
func openSessions(b *testing.B, ctx context.Context, t scaleTarget, n, conns int) []*client.Session {
	var clients []*client.Client
	for range conns {
		clients = append(clients, testutil.Dial(b, t.addr))
	}
	sessions := make([]*client.Session, n)
	tenth := max(n/10, 1)
	marks := make([]time.Time, 11)
	var next, made atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	marks[0] = start
	var mu sync.Mutex
	for w := range envInt("TENURE_BENCH_OPENERS", 256) {
		wg.Go(func() {
			c := clients[w%conns]
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				s, err := c.NewSession(ctx, client.WithTTL(60*time.Second), client.WithOwner("idle"))
				if err != nil {
					b.Error(err)
					return
				}
				sessions[i] = s
				if m := int(made.Add(1)); m%tenth == 0 && m/tenth <= 10 {
					mu.Lock()
					marks[m/tenth] = time.Now()
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	el := time.Since(start)
	slowest := 0.0
	for i := 1; i <= 10; i++ {
		if marks[i].IsZero() {
			continue
		}
		r := float64(tenth) / marks[i].Sub(marks[i-1]).Seconds()
		if slowest == 0 || r < slowest {
			slowest = r
		}
		b.Logf("sessions %d..%d: %.0f/s", (i-1)*tenth, i*tenth, r)
	}
	b.ReportMetric(float64(n)/el.Seconds(), "created/s")
	b.ReportMetric(slowest, "slowest-tenth/s")
	return sessions
}

// BenchmarkIdleSessions opens TENURE_BENCH_N idle sessions and reports the
// creation rate, the server memory per session and the server's CPU while
// the sessions only keep alive (over 30 s, more than one keepalive round).
func BenchmarkIdleSessions(b *testing.B) {
	n, conns := envInt("TENURE_BENCH_N", 100_000), envInt("TENURE_BENCH_CONNS", 4)
	t := newScaleTarget(b)
	ctx := context.Background()
	before := t.memMiB(b)
	sessions := openSessions(b, ctx, t, n, conns)
	after := t.memMiB(b)
	cpu0, t0 := t.cpuSeconds(b), time.Now()
	time.Sleep(30 * time.Second) // measuring idle CPU over a fixed span
	cpu := (t.cpuSeconds(b) - cpu0) / time.Since(t0).Seconds()
	lost := 0
	for _, s := range sessions {
		if s.Err() != nil {
			lost++
		}
	}
	if lost > 0 {
		b.Errorf("%d sessions ended while idle", lost)
	}
	if p := os.Getenv("TENURE_BENCH_HEAPPROFILE"); p != "" && t.pid == 0 {
		writeHeapProfile(b, p)
	}
	b.ReportMetric(before, "mem-before-MiB")
	b.ReportMetric(after, "mem-after-MiB")
	b.ReportMetric((after-before)*(1<<20)/float64(n), "B/session")
	b.ReportMetric(cpu, "idle-cores")
	if t.pid == 0 { // a server of its own goes with its sessions
		closeAll(sessions)
	}
}

func closeAll(sessions []*client.Session) {
	var wg sync.WaitGroup
	ch := make(chan *client.Session)
	for range 64 {
		wg.Go(func() {
			for s := range ch {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_ = s.Close(cctx)
				cancel()
			}
		})
	}
	for _, s := range sessions {
		ch <- s
	}
	close(ch)
	wg.Wait()
}

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkWaiters queues TENURE_BENCH_N sessions on one lock behind a
// holder and reports the queuing rate (overall and of the slowest tenth of
// the line: it stays flat if a queued acquire costs the same however long
// the line is) and the server memory per waiter (over the sessions alone),
// then releases the lock and reports the hand-off rate over 5 s while every
// waiter releases its grant at once and queues again; and the same with 10
// waiters. A running server's --max-waiters and --max-total-waiters must
// admit TENURE_BENCH_N waiters (their defaults are 10,000 and 100,000; an
// in-process server has its limits raised): an acquire refused fails the
// run.
func BenchmarkWaiters(b *testing.B) {
	n, conns := envInt("TENURE_BENCH_N", 100_000), envInt("TENURE_BENCH_CONNS", 4)
	t := newScaleTargetWith(b, fsm.Limits{MaxSessions: uint64(2*n + 100), MaxWaiters: uint64(n + 10), MaxTotalWaiters: uint64(n + 10)})
	ctx := context.Background()
	for _, waiters := range []int{10, n} {
		name := fmt.Sprint("herd-", waiters)
		sessions := openSessions(b, ctx, t, waiters+1, conns)
		base := t.memMiB(b)
		holder, _ := sessions[0].Mutex(name)
		h, err := holder.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var handoffs atomic.Int64
		var stopping atomic.Bool // the sessions are being closed: errors are expected
		var over atomic.Bool     // the measurement is over: waiters stop queuing again
		var queued sync.WaitGroup
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256) // queue in waves
		tenth := max(waiters/10, 1)
		marks := make([]time.Time, 11)
		var inLine atomic.Int64
		var marksMu sync.Mutex
		start := time.Now()
		marks[0] = start
		for _, s := range sessions[1:] {
			queued.Add(1)
			sem <- struct{}{}
			m, _ := s.Mutex(name)
			wg.Go(func() {
				var once sync.Once
				inLineNow := func() {
					once.Do(func() {
						if q := int(inLine.Add(1)); q%tenth == 0 && q/tenth <= 10 {
							marksMu.Lock()
							marks[q/tenth] = time.Now()
							marksMu.Unlock()
						}
						<-sem
						queued.Done()
					})
				}
				defer inLineNow() // a refused first acquire must not hold up the others
				onQueued := client.OnQueued(func(int) { inLineNow() })
				for !over.Load() {
					g, err := m.Lock(ctx, onQueued)
					if err != nil {
						if !stopping.Load() {
							b.Error(err)
						}
						return
					}
					handoffs.Add(1)
					if err := g.Unlock(ctx); err != nil && !stopping.Load() {
						b.Error(err)
					}
				}
			})
		}
		queued.Wait()
		if b.Failed() {
			b.FailNow()
		}
		el := time.Since(start)
		mem := t.memMiB(b)
		if p := os.Getenv("TENURE_BENCH_HEAPPROFILE"); p != "" && t.pid == 0 && waiters == n {
			writeHeapProfile(b, p)
		}
		slowest := 0.0
		for i := 1; i <= 10; i++ {
			if marks[i].IsZero() || marks[i-1].IsZero() {
				continue
			}
			r := float64(tenth) / marks[i].Sub(marks[i-1]).Seconds()
			if slowest == 0 || r < slowest {
				slowest = r
			}
			b.Logf("waiters %d..%d: queued %.0f/s", (i-1)*tenth, i*tenth, r)
		}
		b.ReportMetric(float64(waiters)/el.Seconds(), fmt.Sprint("queued/s@", waiters))
		b.ReportMetric(slowest, fmt.Sprint("slowest-tenth-queued/s@", waiters))
		b.ReportMetric((mem-base)*(1<<20)/float64(waiters), fmt.Sprint("B/waiter@", waiters))
		// Every grant is released at once and its waiter queues again at
		// the back, so the line stays as long for the whole 5 s.
		c0, t0 := handoffs.Load(), time.Now()
		if err := h.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		time.Sleep(5 * time.Second) // measuring a rate over a fixed span
		b.ReportMetric(float64(handoffs.Load()-c0)/time.Since(t0).Seconds(), fmt.Sprint("handoffs/s@", waiters))
		over.Store(true)
		if t.pid == 0 { // a server of its own goes with its sessions
			stopping.Store(true)
			closeAll(sessions) // ends the remaining waits
			wg.Wait()
		}
	}
}
