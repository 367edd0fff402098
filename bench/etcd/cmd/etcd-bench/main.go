// Command etcd-bench measures lock throughput and hand-off latency of etcd's
// own distributed mutex (go.etcd.io/etcd/client/v3/concurrency.Mutex), so the
// figures can be set side by side with `tenure-bench`.
//
// Usage:
//
//	etcd-bench --endpoints 127.0.0.1:2379 --mode uncontended|contended \
//	           --clients 64 --duration 10s -o json
//
// Every logical client owns its own concurrency.Session (and therefore its own
// lease) and its own Mutex value, exactly as an application using etcd for
// locking would.
//
//   - uncontended: each client locks and unlocks a mutex name of its own, in a
//     loop. This measures the cost of one lock+unlock cycle under load.
//   - contended: all clients lock and unlock one shared name with a hold time
//     of zero. This measures how fast the lock can be handed from one waiter
//     to the next.
//
// Connections (--conns): by default all sessions share a single
// clientv3.Client (one gRPC connection, multiplexed). Both layouts were
// measured on a 2-core loopback setup with 64 clients; the shared connection
// was as fast or faster than one connection per client in both modes (see
// bench/README.md), so it is the default to give etcd its best fair figure.
// Pass --conns 0 to give every client its own clientv3.Client, or any other
// number to spread the clients round-robin over that many connections.
//
// The run is bounded: sessions are set up first, then the clock runs for
// --duration, then every client stops, releases what it holds and closes its
// session. Only cycles that finished inside the window are counted. The tool
// only ever talks to the endpoints it is given, which are expected to be on
// loopback.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// result is the single JSON object printed with -o json. The first fields are
// the ones shared with `tenure-bench`; the rest are extra detail.
type result struct {
	System         string   `json:"system"`
	Mode           string   `json:"mode"`
	Clients        int      `json:"clients"`
	OpsPerSec      float64  `json:"ops_per_sec"`
	HandoffsPerSec float64  `json:"handoffs_per_sec"`
	P50Ms          float64  `json:"p50_ms"`
	P99Ms          float64  `json:"p99_ms"`
	Errors         int64    `json:"errors"`
	Fairness       *float64 `json:"fairness_max_over_min"` // null when some client got no grant
	DurationS      float64  `json:"duration_s"`
	Ops            int64    `json:"ops"`
	Grants         int64    `json:"grants"`
	GrantsMin      int64    `json:"grants_min"`
	GrantsMax      int64    `json:"grants_max"`
	Conns          int      `json:"conns"`
}

type workerStats struct {
	ops    int64           // lock+unlock cycles completed inside the window
	grants int64           // Lock calls that returned success inside the window
	errors int64           // failed Lock/Unlock/session calls (not counting the end-of-run cancel)
	errMsg []string        // first few error messages, for stderr
	waits  []time.Duration // time spent in Lock for each grant inside the window
}

func main() {
	var (
		endpoints = flag.String("endpoints", "127.0.0.1:2379", "comma-separated etcd client endpoints (loopback)")
		mode      = flag.String("mode", "uncontended", "uncontended | contended")
		clients   = flag.Int("clients", 64, "number of concurrent lock clients (each with its own session/lease)")
		duration  = flag.Duration("duration", 10*time.Second, "measurement window")
		output    = flag.String("o", "text", "output format: json | text")
		conns     = flag.Int("conns", 1, "number of clientv3.Client connections shared round-robin by the clients; 0 = one per client")
		ttl       = flag.Int("ttl", 60, "session lease TTL in seconds")
		prefix    = flag.String("prefix", "", "key prefix for the mutexes (default: a fresh prefix per run)")
	)
	flag.Parse()

	if *mode != "uncontended" && *mode != "contended" {
		fatalf("--mode must be uncontended or contended, got %q", *mode)
	}
	if *clients < 1 {
		fatalf("--clients must be >= 1")
	}
	if *duration <= 0 {
		fatalf("--duration must be > 0")
	}
	if *output != "json" && *output != "text" {
		fatalf("-o must be json or text")
	}
	if *conns <= 0 || *conns > *clients {
		*conns = *clients
	}
	if *prefix == "" {
		*prefix = fmt.Sprintf("/etcd-bench/%d-%d", os.Getpid(), time.Now().UnixNano())
	}
	eps := strings.Split(*endpoints, ",")

	// Connections.
	cls := make([]*clientv3.Client, *conns)
	for i := range cls {
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   eps,
			DialTimeout: 5 * time.Second,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			fatalf("connect %v: %v", eps, err)
		}
		cls[i] = c
	}
	defer func() {
		for _, c := range cls {
			c.Close()
		}
	}()

	// Sessions (one lease per client), created before the clock starts.
	sessions := make([]*concurrency.Session, *clients)
	{
		var wg sync.WaitGroup
		errs := make([]error, *clients)
		for i := range sessions {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				// The session context bounds the lease keep-alive, so it must
				// not carry a timeout.
				sessions[i], errs[i] = concurrency.NewSession(cls[i%len(cls)],
					concurrency.WithTTL(*ttl), concurrency.WithContext(context.Background()))
			}(i)
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				fatalf("session %d: %v", i, err)
			}
		}
	}

	lockName := func(i int) string {
		if *mode == "contended" {
			return *prefix + "/shared"
		}
		return fmt.Sprintf("%s/c%d", *prefix, i)
	}

	stats := make([]workerStats, *clients)
	start := time.Now()
	deadline := start.Add(*duration)
	runCtx, cancelRun := context.WithDeadline(context.Background(), deadline)
	defer cancelRun()

	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			runWorker(runCtx, deadline, cls[i%len(cls)], &sessions[i], lockName(i), *ttl, &stats[i])
		}(i)
	}
	wg.Wait()
	elapsed := deadline.Sub(start).Seconds()

	// Release leases (deletes any key a client might still have queued).
	{
		var cwg sync.WaitGroup
		for _, s := range sessions {
			if s == nil {
				continue
			}
			cwg.Add(1)
			go func(s *concurrency.Session) {
				defer cwg.Done()
				s.Close()
			}(s)
		}
		cwg.Wait()
	}

	// Aggregate.
	res := result{System: "etcd", Mode: *mode, Clients: *clients, DurationS: elapsed, Conns: len(cls)}
	var all []time.Duration
	res.GrantsMin = math.MaxInt64
	for i := range stats {
		s := &stats[i]
		res.Ops += s.ops
		res.Grants += s.grants
		res.Errors += s.errors
		all = append(all, s.waits...)
		if s.grants < res.GrantsMin {
			res.GrantsMin = s.grants
		}
		if s.grants > res.GrantsMax {
			res.GrantsMax = s.grants
		}
	}
	res.OpsPerSec = round2(float64(res.Ops) / elapsed)
	if *mode == "contended" {
		res.HandoffsPerSec = round2(float64(res.Grants) / elapsed)
	} else {
		res.HandoffsPerSec = res.OpsPerSec
	}
	// Error details go to stderr so stdout stays one JSON object.
	shown := 0
	for i := range stats {
		for _, m := range stats[i].errMsg {
			if shown < 10 {
				fmt.Fprintf(os.Stderr, "etcd-bench: client %d: %s\n", i, m)
				shown++
			}
		}
	}
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	res.P50Ms = round3(percentileMs(all, 0.50))
	res.P99Ms = round3(percentileMs(all, 0.99))
	if res.GrantsMin > 0 {
		f := round3(float64(res.GrantsMax) / float64(res.GrantsMin))
		res.Fairness = &f
	}

	if *output == "json" {
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return
	}
	fair := "n/a (a client got no grant)"
	if res.Fairness != nil {
		fair = fmt.Sprintf("%.3f", *res.Fairness)
	}
	fmt.Printf("system=etcd mode=%s clients=%d conns=%d duration=%.1fs\n", res.Mode, res.Clients, res.Conns, elapsed)
	fmt.Printf("  ops/s (lock+unlock)  %.1f\n", res.OpsPerSec)
	fmt.Printf("  hand-offs/s          %.1f\n", res.HandoffsPerSec)
	fmt.Printf("  acquire wait p50     %.3f ms\n", res.P50Ms)
	fmt.Printf("  acquire wait p99     %.3f ms\n", res.P99Ms)
	fmt.Printf("  errors               %d\n", res.Errors)
	fmt.Printf("  grants min/max       %d/%d (max/min %s)\n", res.GrantsMin, res.GrantsMax, fair)
}

// runWorker locks and unlocks name in a loop until deadline.
func runWorker(ctx context.Context, deadline time.Time, cli *clientv3.Client, sp **concurrency.Session,
	name string, ttl int, st *workerStats) {
	st.waits = make([]time.Duration, 0, 1024)
	m := concurrency.NewMutex(*sp, name)
	for ctx.Err() == nil {
		// A lost lease makes every later call fail: start a new session.
		select {
		case <-(*sp).Done():
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl), concurrency.WithContext(context.Background()))
			if err != nil {
				st.fail("session", err)
				pause(ctx, 50*time.Millisecond)
				continue
			}
			*sp = s
			m = concurrency.NewMutex(s, name)
		default:
		}

		t0 := time.Now()
		err := m.Lock(ctx)
		got := time.Now()
		if err != nil {
			// End of the window while in Lock: not an error. gRPC sends the
			// deadline to the server, so a DeadlineExceeded can arrive a
			// moment before ctx itself reports it; accept it near the end.
			if isCancel(err) && (ctx.Err() != nil || time.Until(deadline) < time.Second) {
				return
			}
			st.fail("lock", err)
			pause(ctx, 10*time.Millisecond)
			continue
		}
		inWindow := !got.After(deadline)
		if inWindow {
			st.grants++
			st.waits = append(st.waits, got.Sub(t0))
		}

		// Hold time 0. Unlock with a context that outlives the window so a
		// lock granted right at the end is still released promptly.
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = m.Unlock(uctx)
		cancel()
		done := time.Now()
		if err != nil {
			st.fail("unlock", err)
			pause(ctx, 10*time.Millisecond)
			continue
		}
		if inWindow && !done.After(deadline) {
			st.ops++
		}
	}
}

func (st *workerStats) fail(what string, err error) {
	st.errors++
	if len(st.errMsg) < 3 {
		st.errMsg = append(st.errMsg, what+": "+err.Error())
	}
}

func isCancel(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// gRPC wraps context errors in status errors.
	s := err.Error()
	return strings.Contains(s, "context canceled") || strings.Contains(s, "context deadline exceeded")
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func percentileMs(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	// nearest-rank
	idx := int(math.Ceil(p*float64(len(sorted)))) - 1
	if idx < 0 {
		idx = 0
	}
	if idx >= len(sorted) {
		idx = len(sorted) - 1
	}
	return float64(sorted[idx]) / float64(time.Millisecond)
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }
func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "etcd-bench: "+format+"\n", a...)
	os.Exit(2)
}
