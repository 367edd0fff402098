package fsm_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// fillQueue enqueues n items of 100 bytes into queue "q" of f.
func fillQueue(b *testing.B, f *fsm.FSM, n int) {
	b.Helper()
	payload := make([]byte, 100)
	const batch = 1024
	for i := 0; i < n; i += batch {
		b := &fsmpb.Batch{}
		for j := i; j < min(n, i+batch); j++ {
			b.Commands = append(b.Commands, &fsmpb.Command{Op: &fsmpb.Command_QueueEnqueue{QueueEnqueue: &fsmpb.QueueEnqueue{Queue: "q", Payload: payload}}})
		}
		data, _ := proto.Marshal(&fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: b}})
		f.Apply(&raft.Log{Type: raft.LogCommand, Data: data})
	}
}

func applyOne(f *fsm.FSM, cmd *fsmpb.Command) fsm.Result {
	data, _ := proto.Marshal(cmd)
	return fsm.TakeResult(f.Apply(&raft.Log{Type: raft.LogCommand, Data: data}))
}

// benchReceipt is the receipt hash every benchmark delivery carries, as
// the server's do.
var benchReceipt = fsm.ReceiptHash([]byte("0123456789abcdef"))

// BenchmarkQueueCycle is the state machine's cost of one enqueue, one
// dequeue and one ack (decoding included) with 100 or 1,000,000 items
// stored: it must not depend on the queue's length.
//
//	go test -run '^$' -bench BenchmarkQueueCycle -benchtime 200000x ./internal/fsm/
func BenchmarkQueueCycle(b *testing.B) {
	for _, stored := range []int{100, 1_000_000} {
		b.Run(fmt.Sprintf("stored=%d", stored), func(b *testing.B) {
			f := fsm.New(nil)
			fillQueue(b, f, stored)
			payload := make([]byte, 100)
			b.ResetTimer()
			for range b.N {
				applyOne(f, &fsmpb.Command{Op: &fsmpb.Command_QueueEnqueue{QueueEnqueue: &fsmpb.QueueEnqueue{Queue: "q", Payload: payload}}})
				d := applyOne(f, &fsmpb.Command{Op: &fsmpb.Command_QueueDequeue{QueueDequeue: &fsmpb.QueueDequeue{Queue: "q", VisibilityMs: 30_000, ReceiptHash: benchReceipt}}}).Queue
				applyOne(f, &fsmpb.Command{Op: &fsmpb.Command_QueueAck{QueueAck: &fsmpb.QueueSettle{Queue: "q", Id: d.ID, DeliveryToken: d.Token, ReceiptHash: benchReceipt}}})
			}
		})
	}
}

// BenchmarkQueueSnapshotStall measures, with 1,000,000 items of 100 bytes
// stored, how long FSM.Snapshot holds the state lock (the time Apply is
// blocked: "stall-ms"), how long Persist takes to serialise the clone
// while Apply goes on ("persist-ms"), and the slowest Apply of a
// concurrent enqueue loop during the whole snapshot ("max-apply-ms").
//
//	go test -run '^$' -bench BenchmarkQueueSnapshotStall -benchtime 3x ./internal/fsm/
func BenchmarkQueueSnapshotStall(b *testing.B) {
	f := fsm.New(nil)
	fillQueue(b, f, 1_000_000)
	var stall, persist, maxApply time.Duration
	payload := make([]byte, 100)
	b.ResetTimer()
	for range b.N {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var worst time.Duration
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				applyOne(f, &fsmpb.Command{Op: &fsmpb.Command_QueueEnqueue{QueueEnqueue: &fsmpb.QueueEnqueue{Queue: "q", Payload: payload}}})
				d := applyOne(f, &fsmpb.Command{Op: &fsmpb.Command_QueueDequeue{QueueDequeue: &fsmpb.QueueDequeue{Queue: "q", VisibilityMs: 30_000, ReceiptHash: benchReceipt}}}).Queue
				applyOne(f, &fsmpb.Command{Op: &fsmpb.Command_QueueAck{QueueAck: &fsmpb.QueueSettle{Queue: "q", Id: d.ID, DeliveryToken: d.Token, ReceiptHash: benchReceipt}}})
				worst = max(worst, time.Since(t0))
			}
		}()
		time.Sleep(10 * time.Millisecond) // the loop is running
		t0 := time.Now()
		snap, err := f.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := snap.Persist(&discardSink{}); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		close(stop)
		wg.Wait()
		stall = max(stall, t1.Sub(t0))
		persist = max(persist, t2.Sub(t1))
		maxApply = max(maxApply, worst)
	}
	b.ReportMetric(float64(stall.Microseconds())/1000, "stall-ms")
	b.ReportMetric(float64(persist.Microseconds())/1000, "persist-ms")
	b.ReportMetric(float64(maxApply.Microseconds())/1000, "max-apply-ms")
}

type discardSink struct{}

func (discardSink) Write(p []byte) (int, error) { return io.Discard.Write(p) }
func (discardSink) Close() error                { return nil }
func (discardSink) ID() string                  { return "discard" }
func (discardSink) Cancel() error               { return nil }

// benchItems is how many items the restore and memory benchmarks store:
// TENURE_BENCH_ITEMS, or 1,000,000.
func benchItems(b *testing.B) int {
	n := 1_000_000
	if v := os.Getenv("TENURE_BENCH_ITEMS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("TENURE_BENCH_ITEMS=%q", v)
		}
	}
	return n
}

// fillQueueBatches enqueues n items of 100 bytes into queue "q" of f, a
// batch of fsm.MaxQueueBatch per command.
func fillQueueBatches(b *testing.B, f *fsm.FSM, n int) {
	b.Helper()
	f.Read(func(s *fsm.State) {}) // the FSM is usable
	applyOne(f, &fsmpb.Command{Op: &fsmpb.Command_SetLimits{SetLimits: &fsmpb.SetLimits{Limits: &fsmpb.Limits{MaxQueueLength: uint64(n) + 1_000_000}}}})
	payload := make([]byte, 100)
	for i := 0; i < n; i += fsm.MaxQueueBatch {
		c := &fsmpb.QueueEnqueueBatch{Queue: "q"}
		for range min(fsm.MaxQueueBatch, n-i) {
			c.Items = fsm.AppendBatchItem(c.Items, payload, "")
		}
		if r := applyOne(f, &fsmpb.Command{Op: &fsmpb.Command_QueueEnqueueBatch{QueueEnqueueBatch: c}}); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
}

// BenchmarkQueueRestore measures a restore of a snapshot holding
// TENURE_BENCH_ITEMS items of 100 bytes (default 1,000,000): the snapshot's
// size, and the time FSM.Restore takes from its bytes to a usable state.
//
//	go test -run '^$' -bench BenchmarkQueueRestore -benchtime 3x ./internal/fsm/
//	TENURE_BENCH_ITEMS=10000000 go test -run '^$' -bench BenchmarkQueueRestore -benchtime 1x -timeout 30m ./internal/fsm/
func BenchmarkQueueRestore(b *testing.B) {
	n := benchItems(b)
	f := fsm.New(nil)
	fillQueueBatches(b, f, n)
	snap, err := f.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		b.Fatal(err)
	}
	f = nil
	data := sink.buf.Bytes()
	b.ResetTimer()
	for range b.N {
		g := fsm.New(nil)
		if err := g.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			b.Fatal(err)
		}
		g.Read(func(s *fsm.State) {
			if s.QueueLen("q") != n {
				b.Fatalf("restored %d items of %d", s.QueueLen("q"), n)
			}
		})
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "restore-s")
	b.ReportMetric(float64(len(data))/float64(n), "snapshot-bytes/item")
}

// BenchmarkQueueMemory measures the live heap per stored item beyond its
// payload, with TENURE_BENCH_ITEMS items of 100 bytes (default 1,000,000)
// in one queue: enqueued ("enqueued-bytes/item") and after a restore from
// a snapshot ("restored-bytes/item").
//
//	go test -run '^$' -bench BenchmarkQueueMemory -benchtime 1x ./internal/fsm/
func BenchmarkQueueMemory(b *testing.B) {
	n := benchItems(b)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for range b.N {
		base := heap()
		f := fsm.New(nil)
		fillQueueBatches(b, f, n)
		enq := heap()
		b.ReportMetric(float64(enq-base)/float64(n)-100, "enqueued-bytes/item")
		snap, err := f.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		sink := &memSink{}
		if err := snap.Persist(sink); err != nil {
			b.Fatal(err)
		}
		data := sink.buf.Bytes()
		f, snap, sink = nil, nil, nil
		g := fsm.New(nil)
		if err := g.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			b.Fatal(err)
		}
		data = nil
		rest := heap()
		b.ReportMetric(float64(rest-base)/float64(n)-100, "restored-bytes/item")
		runtime.KeepAlive(g)
	}
}
