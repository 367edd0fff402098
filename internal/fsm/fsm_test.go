package fsm_test

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// memSink is an in-memory raft.SnapshotSink.
// restored is a new FSM restored from what snap persists.
func restored(t *testing.T, snap raft.FSMSnapshot) *fsm.FSM {
	t.Helper()
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := fsm.New(nil)
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	return g
}

type memSink struct {
	buf       bytes.Buffer
	writeErr  error // if set, Write fails with it
	closed    bool
	cancelled bool
}

func (s *memSink) Write(p []byte) (int, error) {
	if s.writeErr != nil {
		return 0, s.writeErr
	}
	return s.buf.Write(p)
}

func (s *memSink) Close() error  { s.closed = true; return nil }
func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }

var _ raft.SnapshotSink = (*memSink)(nil)

func logOf(tb testing.TB, index uint64, cmd *fsmpb.Command) *raft.Log {
	tb.Helper()
	data, err := fsm.EncodeEntry(cmd, 0)
	if err != nil {
		tb.Fatalf("marshal %v: %v", cmd, err)
	}
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
}

func fsmExport(tb testing.TB, f *fsm.FSM) []byte {
	tb.Helper()
	var b []byte
	f.Read(func(s *fsm.State) { b = exportBytes(tb, s) })
	return b
}

// script is a short history touching every kind of state: sessions, a
// holder, a waiter, a lock-delay, history and a register with an op id.
// Session ids are the revisions of their creation: 1, 2, 3.
func script() []*fsmpb.Command {
	return []*fsmpb.Command{
		cmdCreate("a", 10_000),        // rev 1: session 1
		cmdCreate("b", 10_000),        // rev 2: session 2
		cmdCreate("c", 10_000),        // rev 3: session 3
		cmdAcquire(1, "x", true, 0),   // rev 4: granted, token 4
		cmdAcquire(2, "x", true, 0),   // rev 5: queued
		cmdAcquire(3, "x", true, 0),   // rev 6: queued
		cmdRelease(1, "x", 4),         // rev 7, and rev 8: hand-off to 2, token 8
		cmdAcquire(1, "y", true, 500), // rev 9: granted with a delay
		cmdExpire(1),                  // rev 10: y delayed, generation 1
		cmdPut("k", "v", 7, "op-1"),   // rev 11
		cmdAcquire(3, "y", true, 0),   // rev 12: queued behind the delay
	}
}

func TestFSMApplyBatch(t *testing.T) {
	var events []fsm.Event
	var f *fsm.FSM
	var batchEnd uint64 // revision after the batch being applied
	f = fsm.New(func(e fsm.Event) {
		// Events arrive after the state lock is released: reading the
		// state from the sink must not deadlock, and sees the whole batch.
		f.Read(func(s *fsm.State) {
			if s.Revision() != batchEnd {
				t.Errorf("sink saw revision %d, want the batch's last, %d", s.Revision(), batchEnd)
			}
		})
		events = append(events, e)
	})

	// The reference: the same commands on a bare State.
	ref := fsm.NewStateAt(1) // as FSM starts: at the base version
	var wantEvents []fsm.Event
	var wantResults []fsm.Result
	var logs []*raft.Log
	for i, cmd := range script() {
		wantResults = append(wantResults, ref.Apply(cmd, func(e fsm.Event) { wantEvents = append(wantEvents, e) }))
		logs = append(logs, logOf(t, uint64(i+1), cmd))
	}
	// An entry that is not a command changes nothing.
	logs = append(logs[:3], append([]*raft.Log{
		{Index: 100, Type: raft.LogNoop},
	}, logs[3:]...)...)

	batchEnd = 12
	out := f.ApplyBatch(logs)
	if len(out) != len(logs) {
		t.Fatalf("%d results for %d entries", len(out), len(logs))
	}
	var got []fsm.Result
	for i, o := range out {
		if _, ok := o.(*fsm.Result); !ok {
			t.Fatalf("result %d is %T, want *fsm.Result", i, o)
		}
		r := fsm.TakeResult(o)
		if !reflect.DeepEqual(*o.(*fsm.Result), fsm.Result{}) {
			t.Fatalf("TakeResult left %+v", o)
		}
		switch i {
		case 3:
			if r.Err != nil || r.Revision != 3 {
				t.Fatalf("no-op entry: %+v", r)
			}
		default:
			got = append(got, r)
		}
	}
	for i := range got {
		if !sameResult(got[i], wantResults[i]) {
			t.Fatalf("result %d: %+v, want %+v", i, got[i], wantResults[i])
		}
	}
	// The batch's events, then the marker that ends it.
	wantEvents = append(wantEvents, fsm.Event{Kind: fsm.EventApplied, Revision: 12})
	if !reflect.DeepEqual(events, wantEvents) {
		t.Fatalf("events\n got %+v\nwant %+v", events, wantEvents)
	}
	if !bytes.Equal(fsmExport(t, f), exportBytes(t, ref)) {
		t.Fatal("FSM state differs from the reference state")
	}

	// Apply is ApplyBatch of one.
	batchEnd = 14
	r := fsm.TakeResult(f.Apply(logOf(t, 12, cmdRelease(2, "x", 8))))
	if r.Err != nil || r.Revision != 14 {
		t.Fatalf("Apply: %+v", r)
	}
	if n := len(events); events[n-2].Kind != fsm.EventGranted || events[n-2].Session != 3 || events[n-1].Kind != fsm.EventApplied {
		t.Fatalf("Apply delivered %+v", events[len(wantEvents):])
	}
}

func TestFSMNilSink(t *testing.T) {
	f := fsm.New(nil)
	out := f.ApplyBatch([]*raft.Log{logOf(t, 1, cmdCreate("a", 10_000))})
	if r := fsm.TakeResult(out[0]); r.Err != nil || r.Session != 1 {
		t.Fatalf("%+v", r)
	}
}

func TestFSMSnapshotRestore(t *testing.T) {
	f := fsm.New(nil)
	var logs []*raft.Log
	for i, cmd := range script() {
		logs = append(logs, logOf(t, uint64(i+1), cmd))
	}
	f.ApplyBatch(logs)
	want := fsmExport(t, f)
	var wantRev uint64
	f.Read(func(s *fsm.State) { wantRev = s.Revision() })

	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	// Apply goes on between Snapshot and Persist; the snapshot must not
	// see it.
	later := []*raft.Log{
		logOf(t, 12, cmdRelease(2, "x", 8)),
		logOf(t, 13, cmdEndDelay("y", 1)),
		logOf(t, 14, cmdPut("k", "w", 9, "op-2")),
		logOf(t, 15, cmdCreate("d", 2_000)),
	}
	f.ApplyBatch(later)

	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatalf("Persist: %v", err)
	}
	if !sink.closed || sink.cancelled {
		t.Fatalf("sink closed %v cancelled %v", sink.closed, sink.cancelled)
	}

	var events []fsm.Event
	g := fsm.New(func(e fsm.Event) { events = append(events, e) })
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	// Restore emits only the restore marker (watch history restarts there).
	if len(events) != 1 || events[0].Kind != fsm.EventRestored || events[0].Revision != wantRev {
		t.Fatalf("Restore emitted %v", events)
	}
	if !bytes.Equal(fsmExport(t, g), want) {
		t.Fatal("restored state differs from the state at Snapshot")
	}
	// Replaying the later entries on the restored FSM reaches the same state.
	g.ApplyBatch(later)
	if !bytes.Equal(fsmExport(t, g), fsmExport(t, f)) {
		t.Fatal("restored FSM diverged after the same entries")
	}
}

func TestFSMPersistWriteErrorCancels(t *testing.T) {
	f := fsm.New(nil)
	f.Apply(logOf(t, 1, cmdCreate("a", 10_000)))
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	disk := errors.New("disk full")
	sink := &memSink{writeErr: disk}
	if err := snap.Persist(sink); !errors.Is(err, disk) {
		t.Fatalf("Persist: %v, want %v", err, disk)
	}
	if !sink.cancelled || sink.closed {
		t.Fatalf("sink cancelled %v closed %v", sink.cancelled, sink.closed)
	}
}

func TestFSMRestoreRejectsBadSnapshots(t *testing.T) {
	orphan, err := proto.Marshal(&fsmpb.Snapshot{
		Revision: 5,
		Locks:    []*fsmpb.LockState{{Name: "x", Holder: &fsmpb.GrantState{Session: 9, Token: 5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	orphanWaiter, err := proto.Marshal(&fsmpb.Snapshot{
		Revision: 5,
		Locks:    []*fsmpb.LockState{{Name: "x", Waiters: []*fsmpb.WaiterState{{Session: 9}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"undecodable":          {0xff, 0xff, 0xff},
		"holder is no session": orphan,
		"waiter is no session": orphanWaiter,
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			f := fsm.New(nil)
			f.Apply(logOf(t, 1, cmdCreate("a", 10_000)))
			before := fsmExport(t, f)
			if err := f.Restore(io.NopCloser(bytes.NewReader(data))); err == nil {
				t.Fatal("Restore accepted a bad snapshot")
			}
			if !bytes.Equal(before, fsmExport(t, f)) {
				t.Fatal("a failed Restore changed the state")
			}
		})
	}
}

// TestFSMPersistConcurrentWithApply runs Persist while Apply goes on, as
// raft does; under -race it shows the snapshot shares nothing mutable with
// the live state.
func TestFSMPersistConcurrentWithApply(t *testing.T) {
	f := fsm.New(nil)
	var logs []*raft.Log
	for i, cmd := range script() {
		logs = append(logs, logOf(t, uint64(i+1), cmd))
	}
	f.ApplyBatch(logs)
	want := fsmExport(t, f)
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := snap.Persist(sink); err != nil {
			t.Errorf("Persist: %v", err)
		}
	}()
	idx := uint64(len(logs))
	for i := 0; i < 200; i++ {
		idx++
		r := fsm.TakeResult(f.Apply(logOf(t, idx, cmdPut("k", string(rune('a'+i%26)), uint64(7+i), ""))))
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		idx++
		f.Apply(logOf(t, idx, cmdAcquire(2, "z", true, 0)))
		idx++
		f.Apply(logOf(t, idx, cmdCancel(2, "z", r.Revision+1)))
	}
	wg.Wait()
	g := fsm.New(nil)
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fsmExport(t, g), want) {
		t.Fatal("snapshot persisted during Apply differs from the state at Snapshot")
	}
}
