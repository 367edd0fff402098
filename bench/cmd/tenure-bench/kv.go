package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
)

// kvBenchJSON is `tenure-bench kv -o json`; bench/etcd's etcd-kv-bench
// prints the same fields.
type kvBenchJSON struct {
	System    string  `json:"system"`
	Op        string  `json:"op"`
	Clients   int     `json:"clients"`
	Ops       int64   `json:"ops"`
	OpsPerSec float64 `json:"ops_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	Errors    int64   `json:"errors"`
}

// kvCommand is the key-value benchmark.
func (a *app) kvCommand() *cobra.Command {
	var (
		op       string
		clients  int
		duration time.Duration
	)
	cmd := &cobra.Command{
		Use:   "kv --op put|get|txn --clients N --duration D",
		Short: "Measure key-value throughput against a running server",
		Long: `Drive a running server with N concurrent clients (on one connection), each
on a key of its own, for --duration: put writes the key, get reads it
(linearizable unless --consistency serializable), txn is a compare-and-swap
on its mod revision (always succeeding). Only operations that finished
inside the window count.

JSON: {"system":"tenure","op","clients","ops","ops_per_sec","p50_ms",
"p99_ms","errors"}, the fields bench/etcd's etcd-kv-bench prints.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if op != "put" && op != "get" && op != "txn" {
				return fmt.Errorf("--op must be put, get or txn, not %q", op)
			}
			if clients < 1 || duration <= 0 {
				return fmt.Errorf("--clients and --duration must be positive")
			}
			ctx := cmd.Context()
			c, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			out, err := kvBench(ctx, c, op, clients, duration)
			if err != nil {
				return a.describe(err)
			}
			return a.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "%s: %d clients, %.0f ops/s, p50 %.2f ms, p99 %.2f ms, %d errors\n", op, clients, out.OpsPerSec, out.P50Ms, out.P99Ms, out.Errors)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&op, "op", "put", "put, get or txn")
	f.IntVar(&clients, "clients", 16, "concurrent clients")
	f.DurationVar(&duration, "duration", 5*time.Second, "measurement window")
	return cmd
}

func kvBench(ctx context.Context, c *client.Client, op string, clients int, duration time.Duration) (kvBenchJSON, error) {
	run := time.Now().UnixNano()
	var mu sync.Mutex
	var lat []time.Duration
	var errs int64
	var firstErr error
	var wg sync.WaitGroup
	end := time.Now().Add(duration)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("bench/%d/%d", run, i)
			rev, err := c.Put(ctx, key, []byte("v"))
			if err != nil {
				mu.Lock()
				errs++
				firstErr = err
				mu.Unlock()
				return
			}
			var mine []time.Duration
			var myErrs int64
			for {
				t0 := time.Now()
				if !t0.Before(end) || ctx.Err() != nil {
					break
				}
				switch op {
				case "put":
					_, err = c.Put(ctx, key, []byte("v"))
				case "get":
					_, err = c.Get(ctx, key)
				case "txn":
					var r client.TxnResult
					r, err = c.Txn(ctx, []client.Compare{client.ModRevisionIs(key, client.Equal, rev)}, []client.Op{client.OpPut(key, []byte("v"))}, nil)
					if err == nil {
						if !r.Succeeded {
							err = fmt.Errorf("CAS failed on its own key")
						}
						rev = r.Revision
					}
				}
				t1 := time.Now()
				if err != nil {
					myErrs++
					continue
				}
				if t1.Before(end) {
					mine = append(mine, t1.Sub(t0))
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += myErrs
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(lat) == 0 && firstErr != nil {
		return kvBenchJSON{}, firstErr
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000
	}
	return kvBenchJSON{System: "tenure", Op: op, Clients: clients, Ops: int64(len(lat)), OpsPerSec: float64(len(lat)) / duration.Seconds(), P50Ms: pct(0.5), P99Ms: pct(0.99), Errors: errs}, nil
}
