package server_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// BenchmarkWatchFanout: one writer puts one key b.N times (each put
// committed before the next); 1,000 watchers of that key, over 10 client
// connections, each receive every change. Reports events delivered per
// second (b.N × 1,000 / elapsed) and the writer's puts per second.
//
//	go test -run '^$' -bench WatchFanout -benchtime 2000x ./internal/server/
func BenchmarkWatchFanout(b *testing.B) {
	const watchers, conns = 1000, 10
	srv := testutil.Start(b, "", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cs []*client.Client
	for range conns {
		cs = append(cs, testutil.Dial(b, srv.Addr()))
	}
	writer := testutil.Dial(b, srv.Addr()) // its own connection, as another process's
	var delivered atomic.Int64
	var target atomic.Uint64 // the last revision every watcher must reach
	target.Store(^uint64(0))
	var done sync.WaitGroup
	var ready sync.WaitGroup
	for i := range watchers {
		w, err := cs[i%conns].Watch(ctx, "fan")
		if err != nil {
			b.Fatal(err)
		}
		done.Add(1)
		ready.Add(1)
		go func() {
			defer done.Done()
			readyOnce := sync.OnceFunc(ready.Done)
			defer readyOnce()
			for r := range w.C {
				delivered.Add(int64(len(r.Events)))
				if r.Revision >= target.Load() {
					return
				}
				readyOnce()
			}
			if ctx.Err() == nil {
				b.Errorf("watch ended: %v", w.Err())
			}
		}()
	}
	// Warm up: every watcher has received one change.
	if _, err := writer.Put(ctx, "fan", []byte("warm")); err != nil {
		b.Fatal(err)
	}
	ready.Wait()
	delivered.Store(0)
	value := []byte("0123456789abcdef0123456789abcdef") // 32 bytes
	b.ResetTimer()
	start := time.Now()
	var last uint64
	for range b.N {
		rev, err := writer.Put(ctx, "fan", value)
		if err != nil {
			b.Fatal(err)
		}
		last = rev
	}
	putsDone := time.Since(start)
	target.Store(last)
	// Wake watchers that already saw last before target was set.
	if _, err := writer.Put(ctx, "fan", value); err != nil {
		b.Fatal(err)
	}
	done.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(delivered.Load())/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(b.N)/putsDone.Seconds(), "puts/s")
	b.ReportMetric(0, "ns/op")
	if got, want := delivered.Load(), int64(b.N)*watchers; got < want {
		b.Fatalf("delivered %d events, want at least %d", got, want)
	}
}

// BenchmarkKV: 16 concurrent clients, each op a put, a linearizable get or
// a compare-and-swap transaction on its own key.
//
//	go test -run '^$' -bench 'KV/' -benchtime 5s ./internal/server/
func BenchmarkKV(b *testing.B) {
	srv := testutil.Start(b, "", nil)
	c := testutil.Dial(b, srv.Addr())
	ctx := context.Background()
	for _, op := range []string{"put", "get", "txn"} {
		b.Run(op, func(b *testing.B) {
			var id atomic.Int64
			g := runtime.GOMAXPROCS(0)
			b.SetParallelism((16 + g - 1) / g) // 16 clients (rounded up to a multiple of GOMAXPROCS)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprint("bench/", id.Add(1))
				rev, err := c.Put(ctx, key, []byte("v"))
				if err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					switch op {
					case "put":
						_, err = c.Put(ctx, key, []byte("v"))
					case "get":
						_, err = c.Get(ctx, key)
					case "txn":
						var r client.TxnResult
						r, err = c.Txn(ctx, []client.Compare{client.ModRevisionIs(key, client.Equal, rev)}, []client.Op{client.OpPut(key, []byte("v"))}, nil)
						if err == nil && !r.Succeeded {
							err = fmt.Errorf("CAS failed on its own key")
						}
						rev = r.Revision
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
