// Command redis-lock-bench measures the lock cycle of the usual single-node
// Redis lock recipe: SET name token NX PX ttl to acquire, and a Lua script
// that deletes the key only if it still holds the token to release. Each
// client locks and unlocks a name of its own in a loop, like
// `tenure-bench --mode uncontended`, and the JSON it prints has the same
// fields for the figures both report.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var release = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

type result struct {
	Mode      string  `json:"mode"`
	Clients   int     `json:"clients"`
	Duration  float64 `json:"duration_s"`
	Ops       int     `json:"ops"`
	OpsPerSec float64 `json:"ops_per_sec"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
	Errors    int     `json:"errors"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "Redis address")
	clients := flag.Int("clients", 1, "concurrent clients, each with its own lock name and connection")
	duration := flag.Duration("duration", 5*time.Second, "how long to run")
	ttl := flag.Duration("ttl", 10*time.Second, "the lock's expiry (PX)")
	flag.Parse()

	rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: *clients, MinIdleConns: *clients})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		fmt.Fprintln(os.Stderr, "redis-lock-bench:", err)
		os.Exit(1)
	}
	if err := release.Load(ctx, rdb).Err(); err != nil {
		fmt.Fprintln(os.Stderr, "redis-lock-bench:", err)
		os.Exit(1)
	}
	run := time.Now().UnixNano()
	var (
		mu     sync.Mutex
		waits  []time.Duration
		ops    int
		errs   int
		wg     sync.WaitGroup
		start  = time.Now()
		stopAt = start.Add(*duration)
	)
	for c := 0; c < *clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			name := fmt.Sprintf("bench-%d-%d", run, c)
			var local []time.Duration
			n, e := 0, 0
			for i := 0; time.Now().Before(stopAt); i++ {
				token := fmt.Sprintf("%d-%d", c, i)
				t0 := time.Now()
				ok, err := rdb.SetNX(ctx, name, token, *ttl).Result()
				if err != nil || !ok {
					e++
					continue
				}
				local = append(local, time.Since(t0))
				if err := release.EvalSha(ctx, rdb, []string{name}, token).Err(); err != nil {
					e++
					continue
				}
				n++
			}
			mu.Lock()
			waits = append(waits, local...)
			ops += n
			errs += e
			mu.Unlock()
		}(c)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	q := func(p float64) float64 {
		if len(waits) == 0 {
			return 0
		}
		return float64(waits[int(p*float64(len(waits)-1))].Microseconds()) / 1000
	}
	out := result{Mode: "uncontended", Clients: *clients, Duration: elapsed, Ops: ops, OpsPerSec: float64(ops) / elapsed, P50ms: q(0.5), P99ms: q(0.99), Errors: errs}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}
