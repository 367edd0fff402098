package fsm_test

import (
	"fmt"
	"runtime"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// BenchmarkKVPutApply measures a put of an existing key through
// State.Apply without the history window (cluster version 2) and with it
// (3: the put also records the change and the superseded version, and
// compacts the oldest once the window is full).
//
//	go test -run '^$' -bench KVPutApply -benchmem ./internal/fsm/
func BenchmarkKVPutApply(b *testing.B) {
	for _, v := range []uint32{2, 3} {
		b.Run(fmt.Sprint("cluster-version=", v), func(b *testing.B) {
			s := fsm.NewStateAt(v)
			s.Apply(cmdSetLimits(fsm.Limits{MaxKVHistoryRevisions: 10_000}), nil)
			cmds := make([]*fsmpb.Command, 1000)
			for i := range cmds {
				cmds[i] = cmdKVPut(fmt.Sprint("bench/", i), "0123456789abcdef0123456789abcdef", 0)
				s.Apply(cmds[i], nil)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if r := s.Apply(cmds[i%len(cmds)], nil); r.Err != nil {
					b.Fatal(r.Err)
				}
				i++
			}
		})
	}
}

// BenchmarkKVHistoryWindow fills the history window with its default
// bounds (100,000 revisions, 128 MiB) by overwriting 10,000 keys, and
// reports the live heap, the snapshot's size and the window's own count,
// against the same keys without the window (cluster version 2).
//
//	go test -run '^$' -bench KVHistoryWindow -benchtime 1x ./internal/fsm/
func BenchmarkKVHistoryWindow(b *testing.B) {
	const keys, writes = 10_000, 120_000
	for _, size := range []int{256, 1024} {
		for _, v := range []uint32{2, 3} {
			b.Run(fmt.Sprintf("value=%d/cluster-version=%d", size, v), func(b *testing.B) {
				for b.Loop() {
					runtime.GC()
					var before runtime.MemStats
					runtime.ReadMemStats(&before)
					s := fsm.NewStateAt(v)
					value := make([]byte, size)
					for i := range writes {
						value[0] = byte(i)
						cmd := &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: fmt.Sprintf("history/key/%05d", i%keys), Value: value}}}
						if r := s.Apply(cmd, nil); r.Err != nil {
							b.Fatal(r.Err)
						}
					}
					runtime.GC()
					var after runtime.MemStats
					runtime.ReadMemStats(&after)
					records, bytes := s.KVHistoryStats()
					b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
					b.ReportMetric(float64(proto.Size(s.Export()))/(1<<20), "snapshot-MiB")
					b.ReportMetric(float64(records), "window-records")
					b.ReportMetric(float64(bytes)/(1<<20), "window-MiB")
					b.ReportMetric(float64(s.Revision()-s.KVCompactRevision()), "window-revisions")
					runtime.KeepAlive(s)
				}
			})
		}
	}
}
