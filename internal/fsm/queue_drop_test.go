package fsm_test

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func purgeCmd(q string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueuePurge{QueuePurge: &fsmpb.QueuePurge{Queue: q}}}
}

func deleteQueueCmd(q string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueueDelete{QueueDelete: &fsmpb.QueueDelete{Queue: q}}}
}

func setMaxQueues(t *testing.T, s *fsm.State, n uint64) {
	t.Helper()
	if r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_SetLimits{SetLimits: &fsmpb.SetLimits{Limits: &fsmpb.Limits{MaxQueues: n}}}}, nil); r.Err != nil {
		t.Fatal(r.Err)
	}
}

// dropFixture fills queue q with one ready item, one in flight under a
// session (and one outside it), one dead letter, an acked item and an
// operation id. It returns the session, the delivery under it and the
// acked delivery.
func dropFixture(t *testing.T, s *fsm.State, q string) (sess uint64, held, acked *fsm.QueueResult) {
	t.Helper()
	sess = s.Apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "c", TtlMs: 5000}}}, nil).Session
	qapply(t, s, enqueueCmd(q, "dead", "op-dead", 1))
	for _, p := range []string{"held", "free", "acked", "ready"} {
		qapply(t, s, enqueueCmd(q, p, "op-"+p, 0))
	}
	dead := qapply(t, s, dequeueCmd(q, 0))
	qapply(t, s, nackCmd(q, dead.ID, dead.Token)) // one attempt: dead
	held = qapply(t, s, dequeueCmd(q, sess))
	qapply(t, s, dequeueCmd(q, 0))
	acked = qapply(t, s, dequeueCmd(q, 0))
	qapply(t, s, ackCmd(q, acked.ID, acked.Token))
	if st := s.QueueStats(q); st.Ready != 1 || st.InFlight != 2 || st.Dead != 1 {
		t.Fatalf("fixture: %+v", st)
	}
	return sess, held, acked
}

// TestQueuePurge removes every item (ready, in flight, dead) and keeps the
// queue's settings and memories; the deliveries in flight end (their
// timers are told so, the session no longer holds them); the queue no
// longer counts against max-queues.
func TestQueuePurge(t *testing.T) {
	s := fsm.NewState()
	setMaxQueues(t, s, 1)
	sess, held, acked := dropFixture(t, s, "q")
	var settled []uint64
	r := s.Apply(purgeCmd("q"), func(e fsm.Event) {
		if e.Kind == fsm.EventQueueSettled && e.Name == "q" {
			settled = append(settled, e.Queue.ID)
		}
	})
	if r.Err != nil || r.Queue.Removed != 4 || len(settled) != 2 || settled[0] != held.ID {
		t.Fatalf("purge: %+v %v, settled %v", r.Queue, r.Err, settled)
	}
	if st := s.QueueStats("q"); !st.Exists || st.Ready+st.InFlight+st.Dead != 0 || st.MaxAttempts != 1 {
		t.Fatalf("stats after the purge: %+v", st)
	}
	if res := qapply(t, s, ackCmd("q", held.ID, held.Token)); !res.Stale {
		t.Fatalf("ack of a purged delivery: %+v", res)
	}
	if res := qapply(t, s, ackCmd("q", acked.ID, acked.Token)); !res.Duplicate {
		t.Fatalf("repeated ack after the purge: %+v", res)
	}
	if res := qapply(t, s, enqueueCmd("q", "x", "op-ready", 0)); !res.Duplicate {
		t.Fatalf("operation id after the purge: %+v", res)
	}
	if res := s.Apply(enqueueCmd("q", "x", "", 3), nil); !errors.Is(res.Err, fsm.ErrInvalid) {
		t.Fatalf("max attempts changed by the purge: %v", res.Err)
	}
	// Ending the session finds nothing of the queue to give back.
	var evs []fsm.Event
	s.Apply(&fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: sess}}}, func(e fsm.Event) { evs = append(evs, e) })
	for _, e := range evs {
		if e.Queue != nil {
			t.Fatalf("the session still held a purged item: %+v", e)
		}
	}
	// The purged queue holds nothing: another queue fits under max-queues 1.
	if res := s.Apply(enqueueCmd("other", "x", "", 0), nil); res.Err != nil {
		t.Fatalf("enqueue on another queue after the purge: %v", res.Err)
	}
	rev := s.Revision()
	if res := qapply(t, s, purgeCmd("q")); res.Removed != 0 || s.Revision() != rev {
		t.Fatalf("purge of an empty queue: %+v, revision %d → %d", res, rev, s.Revision())
	}
	if res := qapply(t, s, purgeCmd("never")); res.Removed != 0 || s.Revision() != rev || s.QueueStats("never").Exists {
		t.Fatalf("purge of an unknown queue: %+v", res)
	}
}

// TestQueueDelete removes the queue entirely: items, in flight, dead
// letters and memories; a later enqueue creates it anew.
func TestQueueDelete(t *testing.T) {
	s := fsm.NewState()
	setMaxQueues(t, s, 1)
	sess, held, acked := dropFixture(t, s, "q")
	var settled int
	r := s.Apply(deleteQueueCmd("q"), func(e fsm.Event) {
		if e.Kind == fsm.EventQueueSettled {
			settled++
		}
	})
	if r.Err != nil || !r.Queue.Deleted || r.Queue.Removed != 4 || settled != 2 {
		t.Fatalf("delete: %+v %v, %d settled", r.Queue, r.Err, settled)
	}
	if st := s.QueueStats("q"); st.Exists || s.QueueCount() != 0 {
		t.Fatalf("stats after the delete: %+v, %d queues", st, s.QueueCount())
	}
	for _, cmd := range []*fsmpb.Command{ackCmd("q", held.ID, held.Token), ackCmd("q", acked.ID, acked.Token)} {
		if res := qapply(t, s, cmd); !res.Stale {
			t.Fatalf("%v after the delete: %+v", cmd, res)
		}
	}
	s.Apply(&fsmpb.Command{Op: &fsmpb.Command_ExpireSession{ExpireSession: &fsmpb.ExpireSession{Session: sess}}}, nil) // must not find the deleted item
	if res := s.Apply(enqueueCmd("other", "x", "", 0), nil); res.Err != nil {
		t.Fatalf("enqueue on another queue after the delete: %v", res.Err)
	}
	qapply(t, s, deleteQueueCmd("other"))
	if res := qapply(t, s, enqueueCmd("q", "x", "op-ready", 3)); res.Duplicate {
		t.Fatalf("operation id remembered after the delete: %+v", res)
	}
	if st := s.QueueStats("q"); st.MaxAttempts != 3 || st.Ready != 1 {
		t.Fatalf("the queue created anew: %+v", st)
	}
	rev := s.Revision()
	if res := qapply(t, s, deleteQueueCmd("never")); res.Deleted || s.Revision() != rev {
		t.Fatalf("delete of an unknown queue: %+v", res)
	}
	for _, cmd := range []*fsmpb.Command{deleteQueueCmd(""), purgeCmd("")} {
		if res := s.Apply(cmd, nil); !errors.Is(res.Err, fsm.ErrInvalid) {
			t.Fatalf("%v: %v", cmd, res.Err)
		}
	}
}

// drainOne creates queue name with one item under opID, takes and acks it.
func drainOne(t testing.TB, s *fsm.State, name, opID string) {
	t.Helper()
	qapply(t, s, enqueueCmd(name, "x", opID, 0))
	d := qapply(t, s, dequeueCmd(name, 0))
	qapply(t, s, ackCmd(name, d.ID, d.Token))
}

// TestQueueEmptyQueuesAreBounded: 10,000 queues created and drained leave
// at most fsm.MaxEmptyQueues of them (the newest emptied), every new queue
// is accepted under a small max-queues, and an enqueue retried right after
// its queue was drained is still a duplicate. A snapshot keeps which empty
// queue is the oldest.
func TestQueueEmptyQueuesAreBounded(t *testing.T) {
	s := fsm.NewState()
	setMaxQueues(t, s, 10)
	const n = 10_000
	for i := range n {
		name := fmt.Sprint("q", i)
		drainOne(t, s, name, "op")
		if r := qapply(t, s, enqueueCmd(name, "x", "op", 0)); !r.Duplicate {
			t.Fatalf("retry on drained queue %s: %+v", name, r)
		}
	}
	if got := s.QueueCount(); got != fsm.MaxEmptyQueues {
		t.Fatalf("%d queues kept after %d were drained, want %d", got, n, fsm.MaxEmptyQueues)
	}
	if s.QueueStats(fmt.Sprint("q", n-fsm.MaxEmptyQueues-1)).Exists || !s.QueueStats(fmt.Sprint("q", n-fsm.MaxEmptyQueues)).Exists {
		t.Fatal("the queues kept are not the newest emptied")
	}
	// A queue that holds items is never removed, however old.
	qapply(t, s, enqueueCmd("busy", "x", "", 0))
	qapply(t, s, enqueueCmd("q9999", "again", "", 0)) // q9999 holds items again
	for i := range fsm.MaxEmptyQueues + 1 {
		drainOne(t, s, fmt.Sprint("late", i), "")
	}
	if !s.QueueStats("busy").Exists || s.QueueStats("q9999").Ready != 1 || s.QueueCount() != fsm.MaxEmptyQueues+2 {
		t.Fatalf("non-empty queues were removed: %d queues", s.QueueCount())
	}
	// Through a snapshot the same commands remove the same queues.
	data, err := proto.Marshal(s.Export())
	if err != nil {
		t.Fatal(err)
	}
	snap := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(data, snap); err != nil {
		t.Fatal(err)
	}
	r, err := fsm.Import(snap)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []*fsm.State{s, r} {
		for i := range 10 {
			drainOne(t, st, fmt.Sprint("after", i), "")
		}
		qapply(t, st, purgeCmd("busy"))
	}
	if !proto.Equal(r.Export(), s.Export()) {
		t.Fatal("a restored state removes other empty queues than the original")
	}
	if s.QueueStats("late0").Exists || s.QueueStats("late11").Exists || !s.QueueStats("late12").Exists || !s.QueueStats("busy").Exists {
		t.Fatal("the oldest empty queues were not the ones removed")
	}
}
