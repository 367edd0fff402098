package fsm_test

import (
	"fmt"
	"io"
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
