package fsm_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestCountersAndTotals: every grant, hand-off, session end, fenced write
// outcome, redelivery and dead letter is counted; the totals of held and
// delayed locks follow the locks, also through a snapshot.
func TestCountersAndTotals(t *testing.T) {
	m := newMachine(t)
	a, b, c := m.session("a"), m.session("b"), m.session("c")
	tokA := m.acquire(a, "x", 5_000) // grant 1
	m.queue(b, "x", 0)
	m.acquire(c, "y", 0) // grant 2
	if tot := m.s.Totals(); tot.Held != 2 || tot.Waiters != 1 || tot.Locks != 2 || tot.Sessions != 3 {
		t.Fatalf("totals %+v", tot)
	}
	m.ok(cmdExpire(a)) // x delayed: no hand-off yet
	if tot := m.s.Totals(); tot.Held != 1 || tot.Delayed != 1 || tot.Waiters != 1 {
		t.Fatalf("after expiry: %+v", tot)
	}
	if v := m.s.LockSummary("x"); v.DelayMs != 5_000 || !v.Delayed {
		t.Fatalf("delayed summary %+v", v)
	}
	m.ok(cmdEndDelay("x", m.s.Delays()[0].Generation)) // hand-off to b: grant 3
	if tot := m.s.Totals(); tot.Held != 2 || tot.Delayed != 0 || tot.Waiters != 0 {
		t.Fatalf("after the delay: %+v", tot)
	}
	m.ok(cmdClose(c))

	// Fenced writes: accepted, duplicate, stale, never issued.
	tokB := m.s.Lock("x").Holder.Token
	m.ok(cmdPut("k", "v", tokB, "op"))
	m.ok(cmdPut("k", "v", tokB, "op"))
	m.ok(cmdPut("k", "v", tokA, ""))
	m.apply(cmdPut("k", "v", m.s.Revision()+10, ""))

	// A queue item delivered twice, then dead-lettered.
	qapply(t, m.s, enqueueCmd("q", "p", "", 2))
	d := qapply(t, m.s, dequeueCmd("q", 0))
	qapply(t, m.s, nackCmd("q", d.ID, d.Token))
	d = qapply(t, m.s, dequeueCmd("q", 0))
	qapply(t, m.s, nackCmd("q", d.ID, d.Token))

	want := fsm.Counters{Grants: 3, Handoffs: 1, SessionsExpired: 1, SessionsClosed: 1,
		FenceAccepted: 1, FenceDuplicate: 1, FenceStale: 1, FenceInvalid: 1, Redeliveries: 1, DeadLettered: 1}
	if got := m.s.Counters(); got != want {
		t.Fatalf("counters\n got %+v\nwant %+v", got, want)
	}
	var sizes []fsm.QueueSizes
	m.s.EachQueue(func(q fsm.QueueSizes) { sizes = append(sizes, q) })
	if len(sizes) != 1 || sizes[0] != (fsm.QueueSizes{Name: "q", Dead: 1}) {
		t.Fatalf("queue sizes %+v", sizes)
	}

	// Totals survive a snapshot; counters are this process's (FSM.Restore
	// carries them, a bare Import starts at zero).
	restored, err := fsm.Import(m.s.Export())
	if err != nil {
		t.Fatal(err)
	}
	if restored.Totals() != m.s.Totals() {
		t.Fatalf("restored totals %+v, want %+v", restored.Totals(), m.s.Totals())
	}
	if err := restored.CheckIndexes(); err != nil {
		t.Fatal(err)
	}
}

// TestLockKinds: a listing names each lock's kind.
func TestLockKinds(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")
	m.acquire(a, "mutex", 0)
	m.ok(cmdAcquireN(a, "sem", false, 3))
	m.ok(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: a, Name: "elect", Election: true}}})
	m.ok(cmdAcquireRW(a, "rw-read", false, true))
	m.ok(cmdAcquireRW(a, "rw-write", false, false))
	m.ok(cmdAcquireRW(b, "rw-write", true, true)) // a reader waits behind the writer
	want := map[string]string{"elect": fsm.KindElection, "mutex": fsm.KindMutex, "rw-read": fsm.KindRWLock, "rw-write": fsm.KindRWLock, "sem": fsm.KindSemaphore}
	for l := range m.s.Locks("", "") {
		if l.Kind != want[l.Name] {
			t.Errorf("%s: kind %q, want %q", l.Name, l.Kind, want[l.Name])
		}
	}
	for _, tc := range []struct {
		permits          uint32
		shared, election bool
		want             string
	}{{0, false, false, fsm.KindMutex}, {1, false, false, fsm.KindMutex}, {3, false, false, fsm.KindSemaphore}, {1, true, false, fsm.KindRWLock}, {1, false, true, fsm.KindElection}} {
		if got := fsm.LockKind(tc.permits, tc.shared, tc.election); got != tc.want {
			t.Errorf("LockKind(%d, %v, %v) = %q, want %q", tc.permits, tc.shared, tc.election, got, tc.want)
		}
	}
}

// TestFSMRestoreKeepsCounters: the counts are this process's: a restore
// replaces the state but not what was counted before it.
func TestFSMRestoreKeepsCounters(t *testing.T) {
	f := fsm.New(nil)
	var logs []*raft.Log
	for i, cmd := range script() {
		logs = append(logs, logOf(t, uint64(i+1), cmd))
	}
	f.ApplyBatch(logs)
	var before fsm.Counters
	f.Read(func(s *fsm.State) { before = s.Counters() })
	if before.Grants == 0 {
		t.Fatalf("the script granted nothing: %+v", before)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	var after fsm.Counters
	f.Read(func(s *fsm.State) { after = s.Counters() })
	if after != before {
		t.Fatalf("counters after a restore %+v, before %+v", after, before)
	}
}
