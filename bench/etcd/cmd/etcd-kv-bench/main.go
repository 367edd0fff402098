// Command etcd-kv-bench measures etcd's key-value throughput with the same
// load as `tenure-bench kv`, so the figures can be set side by side.
//
// Usage:
//
//	etcd-kv-bench --endpoints 127.0.0.1:2379 --op put|get|txn \
//	              --clients 16 --duration 5s
//
// Every client is a goroutine on one shared clientv3.Client, working on a
// key of its own: put writes it, get reads it linearizably, txn is a
// compare-and-swap on its mod revision (which always succeeds). Only
// operations that finished inside the window are counted. It prints one
// JSON object: {"system","op","clients","ops","ops_per_sec","p50_ms",
// "p99_ms","errors"}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

type result struct {
	System    string  `json:"system"`
	Op        string  `json:"op"`
	Clients   int     `json:"clients"`
	Ops       int64   `json:"ops"`
	OpsPerSec float64 `json:"ops_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	Errors    int64   `json:"errors"`
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated etcd client endpoints")
	op := flag.String("op", "put", "put, get or txn")
	clients := flag.Int("clients", 16, "concurrent clients")
	duration := flag.Duration("duration", 5*time.Second, "measurement window")
	flag.Parse()
	if *op != "put" && *op != "get" && *op != "txn" {
		fmt.Fprintln(os.Stderr, "etcd-kv-bench: --op must be put, get or txn")
		os.Exit(2)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd-kv-bench:", err)
		os.Exit(1)
	}
	defer cli.Close()
	ctx := context.Background()
	run := time.Now().UnixNano()
	var mu sync.Mutex
	var lat []time.Duration
	var errs int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(*duration)
	for i := range *clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("bench/%d/%d", run, i)
			pr, err := cli.Put(ctx, key, "v")
			if err != nil {
				mu.Lock()
				errs++
				mu.Unlock()
				return
			}
			rev := pr.Header.Revision
			var mine []time.Duration
			var myErrs int64
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				switch *op {
				case "put":
					_, err = cli.Put(ctx, key, "v")
				case "get":
					_, err = cli.Get(ctx, key)
				case "txn":
					var tr *clientv3.TxnResponse
					tr, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, "v")).Commit()
					if err == nil {
						if !tr.Succeeded {
							err = fmt.Errorf("CAS failed on its own key")
						}
						rev = tr.Header.Revision
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
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000
	}
	out := result{System: "etcd", Op: *op, Clients: *clients, Ops: int64(len(lat)), OpsPerSec: float64(len(lat)) / duration.Seconds(), P50Ms: pct(0.5), P99Ms: pct(0.99), Errors: errs}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
