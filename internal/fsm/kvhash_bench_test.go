package fsm

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// BenchmarkHashKVStall measures HashKV over TENURE_BENCH_N keys (default
// 200,000) of 1 KiB values, and how long a put waits meanwhile: a
// goroutine applies puts, one at a time, from before the hash begins
// until it ends. "locked" walks the state under its read lock, as HashKV
// did before KVView (Apply waits for the whole walk); "view" takes a
// KVView and walks it without the lock. TENURE_BENCH_ROUNDS rounds
// (default 3), the two kinds alternating. Run it with -benchtime=1x:
//
//	go test -run '^$' -bench HashKVStall -benchtime=1x -timeout 20m ./internal/fsm/
func BenchmarkHashKVStall(b *testing.B) {
	n := benchEnv(b, "TENURE_BENCH_N", 200_000)
	rounds := benchEnv(b, "TENURE_BENCH_ROUNDS", 3)
	f := New(nil)
	s := f.state
	s.limits.MaxKeys = uint64(n) + 1_000_000
	s.limits.MaxKVBytes = 1 << 40
	if r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_SetClusterVersion{SetClusterVersion: &fsmpb.SetClusterVersion{Version: historyVersion}}}, nil); r.Err != nil {
		b.Fatal(r.Err)
	}
	value := bytes.Repeat([]byte("v"), 1024)
	start := time.Now()
	for i := range n {
		if r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: fmt.Sprintf("key/%08d", i), Value: value}}}, nil); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
	b.Logf("built %d keys of 1 KiB in %v; history window: %d records", n, time.Since(start).Round(time.Millisecond), len(s.kv.hist.records()))
	kinds := []struct {
		name string
		hash func() uint32
	}{
		{"locked", func() (h uint32) { f.Read(func(st *State) { h, _, _, _ = st.HashKV(0) }); return }},
		{"view", func() uint32 { h, _, _, _ := f.KVView().HashKV(0); return h }},
	}
	index := uint64(1)
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			for i := range kinds {
				k := kinds[(i+r)%len(kinds)]
				runtime.GC()
				stop := make(chan struct{})
				started := make(chan struct{})
				type applied struct {
					max time.Duration
					n   int
				}
				done := make(chan applied, 1)
				go func() {
					var a applied
					defer func() { done <- a }()
					for j := 0; ; j++ {
						if j == 3 {
							close(started)
						}
						select {
						case <-stop:
							return
						default:
						}
						data, err := EncodeEntry(&fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: fmt.Sprintf("key/%08d", j%n), Value: value}}}, 0)
						if err != nil {
							panic(err)
						}
						index++
						t0 := time.Now()
						f.ApplyBatch([]*raft.Log{{Index: index, Term: 1, Type: raft.LogCommand, Data: data}})
						a.max = max(a.max, time.Since(t0))
						a.n++
					}
				}()
				<-started
				t0 := time.Now()
				k.hash()
				took := time.Since(t0)
				close(stop)
				a := <-done
				b.Logf("round %d %-6s hash %7.1f ms; longest put %7.1f ms (%d puts during the hash)", r+1, k.name, ms(took), ms(a.max), a.n)
			}
		}
	}
}
