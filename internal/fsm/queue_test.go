package fsm_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func enqueueCmd(q, payload, opID string, maxAttempts uint32) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueueEnqueue{QueueEnqueue: &fsmpb.QueueEnqueue{Queue: q, Payload: []byte(payload), OperationId: opID, MaxAttempts: maxAttempts}}}
}

// testReceipt is the receipt of every delivery the helpers below hand
// out and settle; the receipt tests name theirs.
const testReceipt = "consumer"

// receiptHash is what the server puts in the log for receipt r.
func receiptHash(r string) []byte {
	h := sha256.Sum256([]byte(r))
	return h[:]
}

func dequeueCmd(q string, session uint64) *fsmpb.Command {
	return dequeueWith(q, session, testReceipt)
}

func dequeueWith(q string, session uint64, receipt string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueueDequeue{QueueDequeue: &fsmpb.QueueDequeue{Queue: q, Session: session, VisibilityMs: 30_000, ReceiptHash: receiptHash(receipt)}}}
}

func ackCmd(q string, id, token uint64) *fsmpb.Command { return ackWith(q, id, token, testReceipt) }

func ackWith(q string, id, token uint64, receipt string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueueAck{QueueAck: &fsmpb.QueueSettle{Queue: q, Id: id, DeliveryToken: token, ReceiptHash: receiptHash(receipt)}}}
}

func nackCmd(q string, id, token uint64) *fsmpb.Command { return nackWith(q, id, token, testReceipt) }

func nackWith(q string, id, token uint64, receipt string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueueNack{QueueNack: &fsmpb.QueueSettle{Queue: q, Id: id, DeliveryToken: token, ReceiptHash: receiptHash(receipt)}}}
}

// expireCmd is the leader's visibility expiry: it carries no receipt.
func expireCmd(q string, id, token uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueueExpire{QueueExpire: &fsmpb.QueueSettle{Queue: q, Id: id, DeliveryToken: token}}}
}

func extendCmd(q string, id, token uint64, ms int64) *fsmpb.Command {
	return extendWith(q, id, token, ms, testReceipt)
}

func extendWith(q string, id, token uint64, ms int64, receipt string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueueExtend{QueueExtend: &fsmpb.QueueExtend{Queue: q, Id: id, DeliveryToken: token, VisibilityMs: ms, ReceiptHash: receiptHash(receipt)}}}
}

func requeueCmd(q string, ids ...uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueueRequeueDead{QueueRequeueDead: &fsmpb.QueueRequeueDead{Queue: q, Ids: ids}}}
}

// qapply applies cmd and fails the test on an error result.
func qapply(t testing.TB, s *fsm.State, cmd *fsmpb.Command) *fsm.QueueResult {
	t.Helper()
	r := s.Apply(cmd, nil)
	if r.Err != nil {
		t.Fatalf("%v: %v", cmd, r.Err)
	}
	return r.Queue
}

func TestQueueFIFOWithRedeliveryAtOriginalPlace(t *testing.T) {
	s := fsm.NewState()
	a := qapply(t, s, enqueueCmd("q", "a", "", 0)).ID
	b := qapply(t, s, enqueueCmd("q", "b", "", 0)).ID
	c := qapply(t, s, enqueueCmd("q", "c", "", 0)).ID
	if !(a < b && b < c) {
		t.Fatalf("ids %d %d %d do not follow commit order", a, b, c)
	}
	da := qapply(t, s, dequeueCmd("q", 0))
	db := qapply(t, s, dequeueCmd("q", 0))
	if da.ID != a || string(da.Payload) != "a" || da.Attempt != 1 || db.ID != b || db.Token <= da.Token {
		t.Fatalf("deliveries %+v %+v", da, db)
	}
	// a is nacked and b expires: both go back ahead of c, in id order.
	qapply(t, s, expireCmd("q", b, db.Token))
	qapply(t, s, nackCmd("q", a, da.Token))
	var got []uint64
	for range 3 {
		d := qapply(t, s, dequeueCmd("q", 0))
		got = append(got, d.ID)
	}
	if !slices.Equal(got, []uint64{a, b, c}) {
		t.Fatalf("order after redelivery %v, want %v", got, []uint64{a, b, c})
	}
	if d := qapply(t, s, dequeueCmd("q", 0)); !d.Empty {
		t.Fatalf("dequeue of an empty queue: %+v", d)
	}
	if st := s.QueueStats("q"); st.Ready != 0 || st.InFlight != 3 || st.OldestID != a {
		t.Fatalf("stats %+v", st)
	}
}

func TestQueueStaleDeliveryTokenNeverAcks(t *testing.T) {
	s := fsm.NewState()
	id := qapply(t, s, enqueueCmd("q", "x", "", 0)).ID
	d1 := qapply(t, s, dequeueCmd("q", 0))
	qapply(t, s, expireCmd("q", id, d1.Token)) // visibility ran out
	d2 := qapply(t, s, dequeueCmd("q", 0))
	if d2.ID != id || d2.Token <= d1.Token || d2.Attempt != 2 {
		t.Fatalf("redelivery %+v after %+v", d2, d1)
	}
	for _, cmd := range []*fsmpb.Command{ackCmd("q", id, d1.Token), nackCmd("q", id, d1.Token), extendCmd("q", id, d1.Token, 1000), expireCmd("q", id, d1.Token), ackCmd("q", id, 0), ackCmd("q", id+1, d2.Token), ackCmd("other", id, d2.Token)} {
		if r := qapply(t, s, cmd); !r.Stale {
			t.Fatalf("%v with a stale token: %+v", cmd, r)
		}
	}
	if st := s.QueueStats("q"); st.InFlight != 1 {
		t.Fatalf("a stale command changed the queue: %+v", st)
	}
	if r := qapply(t, s, ackCmd("q", id, d2.Token)); r.Stale || r.Duplicate {
		t.Fatalf("current ack: %+v", r)
	}
	rev := s.Revision()
	if r := qapply(t, s, ackCmd("q", id, d2.Token)); r.Stale || !r.Duplicate || s.Revision() != rev {
		t.Fatalf("repeated ack with the same token: %+v (revision %d → %d)", r, rev, s.Revision())
	}
	if r := qapply(t, s, ackCmd("q", id, d1.Token)); !r.Stale {
		t.Fatalf("late ack with the first token after the item was acked: %+v", r)
	}
	if st := s.QueueStats("q"); st.Ready+st.InFlight+st.Dead != 0 {
		t.Fatalf("stats after ack %+v", st)
	}
}

func TestQueueOperationIDDedup(t *testing.T) {
	s := fsm.NewState()
	first := qapply(t, s, enqueueCmd("q", "x", "op-1", 0))
	rev := s.Revision()
	again := qapply(t, s, enqueueCmd("q", "other payload", "op-1", 0))
	if !again.Duplicate || again.ID != first.ID || s.Revision() != rev || s.QueueLen("q") != 1 {
		t.Fatalf("retried enqueue: %+v (first %+v), len %d", again, first, s.QueueLen("q"))
	}
	// Still a duplicate after the item was consumed.
	d := qapply(t, s, dequeueCmd("q", 0))
	qapply(t, s, ackCmd("q", d.ID, d.Token))
	if r := qapply(t, s, enqueueCmd("q", "x", "op-1", 0)); !r.Duplicate || r.ID != first.ID || s.QueueLen("q") != 0 {
		t.Fatalf("retried enqueue after the ack: %+v", r)
	}
	// The same id on another queue is another operation.
	if r := qapply(t, s, enqueueCmd("q2", "x", "op-1", 0)); r.Duplicate {
		t.Fatalf("op id shared across queues: %+v", r)
	}
}

func TestQueueOperationMemoryIsBounded(t *testing.T) {
	s := fsm.NewState()
	first := qapply(t, s, enqueueCmd("q", "", "op-0", 0)).ID
	for i := 1; i <= fsm.QueueOpMemory; i++ {
		qapply(t, s, enqueueCmd("q", "", fmt.Sprintf("op-%d", i), 0))
	}
	if r := qapply(t, s, enqueueCmd("q", "", "op-0", 0)); r.Duplicate || r.ID == first {
		t.Fatalf("an operation id older than the memory was remembered: %+v", r)
	}
	if r := qapply(t, s, enqueueCmd("q", "", fmt.Sprintf("op-%d", fsm.QueueOpMemory), 0)); !r.Duplicate {
		t.Fatalf("a recent operation id was forgotten: %+v", r)
	}
}

func TestQueueDeadLetterAfterMaxAttemptsAndRequeue(t *testing.T) {
	s := fsm.NewState()
	id := qapply(t, s, enqueueCmd("q", "poison", "", 3)).ID
	qapply(t, s, enqueueCmd("q", "next", "", 0)) // 0: the queue's own
	if r := s.Apply(enqueueCmd("q", "", "", 4), nil); !errors.Is(r.Err, fsm.ErrInvalid) {
		t.Fatalf("enqueue changing max attempts: %v", r.Err)
	}
	for attempt := uint32(1); attempt <= 3; attempt++ {
		d := qapply(t, s, dequeueCmd("q", 0))
		if d.ID != id || d.Attempt != attempt {
			t.Fatalf("delivery %+v, want item %d attempt %d", d, id, attempt)
		}
		qapply(t, s, nackCmd("q", d.ID, d.Token))
	}
	if st := s.QueueStats("q"); st.Dead != 1 || st.Ready != 1 || st.MaxAttempts != 3 {
		t.Fatalf("stats after 3 failed deliveries: %+v", st)
	}
	dl := slices.Collect(s.DeadLetters("q", 0))
	if len(dl) != 1 || dl[0].ID != id || string(dl[0].Payload) != "poison" || dl[0].Attempts != 3 {
		t.Fatalf("dead letters %+v", dl)
	}
	if dl := slices.Collect(s.DeadLetters("q", id)); len(dl) != 0 {
		t.Fatalf("page after the last id: %+v", dl)
	}
	if r := qapply(t, s, requeueCmd("q")); r.Requeued != 1 {
		t.Fatalf("requeue: %+v", r)
	}
	d := qapply(t, s, dequeueCmd("q", 0))
	if d.ID != id || d.Attempt != 1 {
		t.Fatalf("requeued item back at its place with attempts reset: %+v", d)
	}
}

func TestQueueSessionEndReturnsItsDeliveries(t *testing.T) {
	s := fsm.NewState()
	sess := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "c", TtlMs: 5000}}}, nil).Session
	a := qapply(t, s, enqueueCmd("q", "a", "", 0)).ID
	qapply(t, s, enqueueCmd("q", "b", "", 0))
	da := qapply(t, s, dequeueCmd("q", sess))
	db := qapply(t, s, dequeueCmd("q", 0)) // not under the session
	var evs []fsm.Event
	s.Apply(&fsmpb.Command{Op: &fsmpb.Command_ExpireSession{ExpireSession: &fsmpb.ExpireSession{Session: sess}}}, func(e fsm.Event) { evs = append(evs, e) })
	st := s.QueueStats("q")
	if st.Ready != 1 || st.InFlight != 1 {
		t.Fatalf("stats after the session ended: %+v", st)
	}
	var ready, settled int
	for _, e := range evs {
		switch e.Kind {
		case fsm.EventQueueReady:
			ready++
		case fsm.EventQueueSettled:
			settled++
			if e.Queue.ID != a || e.Queue.Token != da.Token {
				t.Fatalf("settled event %+v", e.Queue)
			}
		}
	}
	if ready != 1 || settled != 1 {
		t.Fatalf("events %+v", evs)
	}
	if r := qapply(t, s, ackCmd("q", a, da.Token)); !r.Stale {
		t.Fatalf("ack after the session ended: %+v", r)
	}
	if r := qapply(t, s, ackCmd("q", db.ID, db.Token)); r.Stale {
		t.Fatalf("ack of the delivery outside the session: %+v", r)
	}
	if r := s.Apply(dequeueCmd("q", sess), nil); !errors.Is(r.Err, fsm.ErrSessionNotFound) {
		t.Fatalf("dequeue under an ended session: %v", r.Err)
	}
}

func TestQueueValidation(t *testing.T) {
	s := fsm.NewState()
	big := string(make([]byte, fsm.MaxQueuePayload+1))
	for _, cmd := range []*fsmpb.Command{
		enqueueCmd("", "x", "", 0),
		enqueueCmd("q", big, "", 0),
		enqueueCmd("q", "x", "", fsm.MaxQueueAttempts+1),
		{Op: &fsmpb.Command_QueueDequeue{QueueDequeue: &fsmpb.QueueDequeue{Queue: "q", VisibilityMs: fsm.MinVisibilityMs - 1}}},
		{Op: &fsmpb.Command_QueueDequeue{QueueDequeue: &fsmpb.QueueDequeue{Queue: "q", VisibilityMs: fsm.MaxVisibilityMs + 1}}},
		extendCmd("q", 1, 1, 0),
		requeueCmd("q", make([]uint64, fsm.MaxRequeueBatch+1)...),
	} {
		if r := s.Apply(cmd, nil); !errors.Is(r.Err, fsm.ErrInvalid) {
			t.Errorf("%v: %v, want ErrInvalid", cmd, r.Err)
		}
	}
	if s.Revision() != 0 || s.QueueCount() != 0 {
		t.Fatalf("invalid commands changed the state (revision %d, %d queues)", s.Revision(), s.QueueCount())
	}
}

// TestQueueSnapshotIsPointInTime: the FSM's snapshot clones the queues
// under the lock and serialises them later; what it writes is the state at
// the moment of Snapshot, however many commands were applied meanwhile, and
// it restores to exactly that state.
func TestQueueSnapshotIsPointInTime(t *testing.T) {
	f := fsm.New(nil)
	apply := func(cmd *fsmpb.Command) fsm.Result {
		data, err := proto.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		return fsm.TakeResult(f.Apply(&raft.Log{Type: raft.LogCommand, Data: data}))
	}
	for i := range 500 {
		apply(enqueueCmd(fmt.Sprintf("q%d", i%3), fmt.Sprint(i), fmt.Sprint("op", i), 0))
	}
	for range 50 {
		d := apply(dequeueCmd("q1", 0)).Queue
		apply(ackCmd("q1", d.ID, d.Token))
		apply(dequeueCmd("q2", 0))
	}
	want := fsmExport(t, f)
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Change everything the snapshot covers before it is written.
	for i := range 300 {
		apply(enqueueCmd("q0", "later", fmt.Sprint("late", i), 0))
		d := apply(dequeueCmd("q2", 0)).Queue
		apply(nackCmd("q2", d.ID, d.Token))
		d = apply(dequeueCmd("q1", 0)).Queue
		apply(ackCmd("q1", d.ID, d.Token))
	}
	g := restored(t, snap)
	if got := fsmExport(t, g); !bytes.Equal(got, want) {
		t.Fatal("the persisted snapshot is not the state at the time of Snapshot")
	}
}

// The queue property test (about 0.5 s under -race) keeps a model of every item ever enqueued and
// checks, after each random step, that the state holds exactly the model's
// ready, in-flight and dead items (so no acknowledged enqueue is ever lost
// before it is acked or dead-lettered), that a dequeue hands out the oldest
// ready item (redelivered items back at their original place), that only
// the current delivery token settles a delivery, that an operation id is
// enqueued once, that delivery tokens only grow, that only the
// delivery's receipt settles it (a wrong one is refused and changes
// nothing), and that purge and delete remove exactly a queue's items
// (delete also its memories). Every few steps the state is replaced by its
// own snapshot, restored.

type qmState uint8

const (
	qmReady qmState = iota + 1
	qmInFlight
	qmDead
	qmAcked
	// qmGone: purged or deleted.
	qmGone
)

type qmItem struct {
	id       uint64
	queue    string
	state    qmState
	attempts uint32
	token    uint64   // current delivery, or the acking one
	tokens   []uint64 // every delivery token, in order
	session  uint64
	receipt  string // of the current delivery, or the acking one
	// forgotten: the item's queue was deleted after it was acked.
	forgotten bool
}

type queueModel struct {
	st       *fsm.State
	items    map[uint64]*qmItem
	ids      []uint64 // in enqueue order
	ops      map[string]uint64
	maxAtt   map[string]uint32
	live     []uint64
	maxToken uint64
}

var (
	qmQueues   = []string{"q1", "q2"}
	qmReceipts = []string{"r1", "r2", "r3"}
)

func (m *queueModel) byState(q string, want qmState) []uint64 {
	var out []uint64
	for _, id := range m.ids {
		if it := m.items[id]; it.queue == q && it.state == want {
			out = append(out, id)
		}
	}
	return out
}

func (m *queueModel) putBack(it *qmItem) {
	it.session = 0
	if it.attempts >= m.maxAtt[it.queue] {
		it.state = qmDead
	} else {
		it.state = qmReady
	}
}

func (m *queueModel) check(t *rapid.T) {
	snap := m.st.Export()
	got := make(map[string]*fsmpb.QueueState)
	for _, q := range snap.GetQueues() {
		got[q.GetName()] = q
	}
	ids := func(l []*fsmpb.QueueItemState) []uint64 {
		var out []uint64
		for _, it := range l {
			out = append(out, it.GetId())
		}
		return out
	}
	for _, q := range qmQueues {
		qs := got[q]
		ready, dead, err := fsm.QueueItemsOf(snap, q)
		if err != nil {
			t.Fatalf("queue %s: %v", q, err)
		}
		for _, c := range []struct {
			what  string
			state qmState
			have  []*fsmpb.QueueItemState
		}{{"ready", qmReady, ready}, {"in flight", qmInFlight, qs.GetInFlight()}, {"dead", qmDead, dead}} {
			if want := m.byState(q, c.state); !slices.Equal(ids(c.have), want) {
				t.Fatalf("queue %s %s: state has %v, model %v", q, c.what, ids(c.have), want)
			}
			for _, it := range c.have {
				mi := m.items[it.GetId()]
				if it.GetAttempts() != mi.attempts || (c.state == qmInFlight && (it.GetDeliveryToken() != mi.token || it.GetSession() != mi.session || !bytes.Equal(it.GetReceiptHash(), receiptHash(mi.receipt)))) {
					t.Fatalf("queue %s item %d: state %v, model %+v", q, it.GetId(), it, mi)
				}
			}
		}
	}
}

func TestQueueProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := &queueModel{st: fsm.NewState(), items: make(map[uint64]*qmItem), ops: make(map[string]uint64), maxAtt: map[string]uint32{"q1": fsm.DefaultMaxAttempts, "q2": 2}}
		// q2 is created with 2 attempts, fixed by its first enqueue.
		r := m.st.Apply(enqueueCmd("q2", "", "", 2), nil)
		m.items[r.Queue.ID] = &qmItem{id: r.Queue.ID, queue: "q2", state: qmReady}
		m.ids = append(m.ids, r.Queue.ID)
		// pickItem prefers items in flight; pickToken the current token.
		pickItem := func(t *rapid.T) *qmItem {
			var inflight []uint64
			for _, id := range m.ids {
				if m.items[id].state == qmInFlight {
					inflight = append(inflight, id)
				}
			}
			if len(inflight) > 0 && rapid.IntRange(0, 3).Draw(t, "any") > 0 {
				return m.items[rapid.SampledFrom(inflight).Draw(t, "in flight")]
			}
			return m.items[rapid.SampledFrom(m.ids).Draw(t, "item")]
		}
		pickToken := func(t *rapid.T, it *qmItem) uint64 {
			if rapid.IntRange(0, 3).Draw(t, "other token") > 0 {
				return it.token
			}
			choices := append([]uint64{0, it.token + 1}, it.tokens...)
			return rapid.SampledFrom(choices).Draw(t, "token")
		}
		// pickReceipt prefers the delivery's own receipt.
		pickReceipt := func(t *rapid.T, it *qmItem) string {
			if rapid.IntRange(0, 3).Draw(t, "other receipt") > 0 {
				return it.receipt
			}
			return rapid.SampledFrom(append([]string{""}, qmReceipts...)).Draw(t, "receipt")
		}
		// denied checks that r refused the command for its receipt.
		denied := func(t *rapid.T, what string, r fsm.Result) {
			if !errors.Is(r.Err, fsm.ErrPermissionDenied) {
				t.Fatalf("%s with a wrong receipt: %+v %v, want permission denied", what, r.Queue, r.Err)
			}
		}
		actions := map[string]func(*rapid.T){
			"enqueue": func(t *rapid.T) {
				q := rapid.SampledFrom(qmQueues).Draw(t, "queue")
				op := rapid.SampledFrom([]string{"", "", "a", "b", "c", "d"}).Draw(t, "op")
				r := m.st.Apply(enqueueCmd(q, "p", op, 0), nil)
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				key := q + "/" + op
				if first, seen := m.ops[key]; op != "" && seen {
					if !r.Queue.Duplicate || r.Queue.ID != first {
						t.Fatalf("retried op %s: %+v, want duplicate of %d", key, r.Queue, first)
					}
					return
				}
				if r.Queue.Duplicate || (len(m.ids) > 0 && r.Queue.ID <= m.ids[len(m.ids)-1]) {
					t.Fatalf("enqueue: %+v after ids %v", r.Queue, m.ids)
				}
				if op != "" {
					m.ops[key] = r.Queue.ID
				}
				m.items[r.Queue.ID] = &qmItem{id: r.Queue.ID, queue: q, state: qmReady}
				m.ids = append(m.ids, r.Queue.ID)
			},
			"dequeue": func(t *rapid.T) {
				q := rapid.SampledFrom(qmQueues).Draw(t, "queue")
				var sess uint64
				if len(m.live) > 0 && rapid.Bool().Draw(t, "under session") {
					sess = rapid.SampledFrom(m.live).Draw(t, "session")
				}
				rc := rapid.SampledFrom(qmReceipts).Draw(t, "receipt")
				r := m.st.Apply(dequeueWith(q, sess, rc), nil)
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				ready := m.byState(q, qmReady)
				if len(ready) == 0 {
					if !r.Queue.Empty {
						t.Fatalf("dequeue from empty %s: %+v", q, r.Queue)
					}
					return
				}
				it := m.items[ready[0]]
				if r.Queue.ID != it.id || r.Queue.Attempt != it.attempts+1 || r.Queue.Token <= m.maxToken {
					t.Fatalf("dequeue %s: %+v, want item %d attempt %d token above %d", q, r.Queue, it.id, it.attempts+1, m.maxToken)
				}
				m.maxToken = r.Queue.Token
				it.state, it.attempts, it.token, it.session, it.receipt = qmInFlight, it.attempts+1, r.Queue.Token, sess, rc
				it.tokens = append(it.tokens, r.Queue.Token)
			},
			"ack": func(t *rapid.T) {
				it := pickItem(t)
				tok, rc := pickToken(t, it), pickReceipt(t, it)
				r := m.st.Apply(ackWith(it.queue, it.id, tok, rc), nil)
				switch {
				case it.state == qmInFlight && tok == it.token && tok != 0 && rc != it.receipt:
					denied(t, "ack", r)
				case it.state == qmInFlight && tok == it.token && tok != 0:
					if r.Err != nil || r.Queue.Stale || r.Queue.Duplicate {
						t.Fatalf("ack of the current delivery: %+v %v", r.Queue, r.Err)
					}
					it.state, it.session = qmAcked, 0
				case it.state == qmAcked && !it.forgotten && tok == it.token && rc != it.receipt:
					denied(t, "repeated ack", r)
				case it.state == qmAcked && !it.forgotten && tok == it.token:
					if r.Err != nil || !r.Queue.Duplicate {
						t.Fatalf("repeated ack: %+v %v", r.Queue, r.Err)
					}
				default:
					if r.Err != nil || !r.Queue.Stale {
						t.Fatalf("ack of %+v with token %d: %+v %v, want stale", it, tok, r.Queue, r.Err)
					}
				}
			},
			"nack or expire": func(t *rapid.T) {
				it := pickItem(t)
				tok, rc := pickToken(t, it), pickReceipt(t, it)
				cmd, expire := nackWith(it.queue, it.id, tok, rc), rapid.Bool().Draw(t, "expire")
				if expire { // the leader's expiry needs no receipt
					cmd = expireCmd(it.queue, it.id, tok)
				}
				r := m.st.Apply(cmd, nil)
				switch {
				case it.state == qmInFlight && tok == it.token && tok != 0 && !expire && rc != it.receipt:
					denied(t, "nack", r)
				case it.state == qmInFlight && tok == it.token && tok != 0:
					if r.Err != nil || r.Queue.Stale {
						t.Fatalf("%v of the current delivery: %+v %v", cmd, r.Queue, r.Err)
					}
					m.putBack(it)
				default:
					if r.Err != nil || !r.Queue.Stale {
						t.Fatalf("%v of %+v: %+v %v, want stale", cmd, it, r.Queue, r.Err)
					}
				}
			},
			"extend": func(t *rapid.T) {
				it := pickItem(t)
				tok, rc := pickToken(t, it), pickReceipt(t, it)
				r := m.st.Apply(extendWith(it.queue, it.id, tok, 5000, rc), nil)
				current := it.state == qmInFlight && tok == it.token && tok != 0
				switch {
				case current && rc != it.receipt:
					denied(t, "extend", r)
				case r.Err != nil || r.Queue.Stale == current:
					t.Fatalf("extend of %+v with %d: %+v %v", it, tok, r.Queue, r.Err)
				}
			},
			"session": func(t *rapid.T) {
				if len(m.live) < 3 && rapid.Bool().Draw(t, "create") {
					r := m.st.Apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "o", TtlMs: 5000}}}, nil)
					m.live = append(m.live, r.Session)
					return
				}
				if len(m.live) == 0 {
					return
				}
				sess := rapid.SampledFrom(m.live).Draw(t, "end")
				m.st.Apply(&fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: sess}}}, nil)
				m.live = slices.DeleteFunc(m.live, func(x uint64) bool { return x == sess })
				for _, id := range m.ids { // the model's order is the state's (queue, id) order
					if it := m.items[id]; it.state == qmInFlight && it.session == sess {
						m.putBack(it)
					}
				}
			},
			"requeue dead": func(t *rapid.T) {
				q := rapid.SampledFrom(qmQueues).Draw(t, "queue")
				dead := m.byState(q, qmDead)
				r := m.st.Apply(requeueCmd(q), nil)
				if r.Err != nil || r.Queue.Requeued != len(dead) {
					t.Fatalf("requeue %s: %+v %v, want %d", q, r.Queue, r.Err, len(dead))
				}
				for _, id := range dead {
					m.items[id].state, m.items[id].attempts = qmReady, 0
				}
			},
			"purge or delete": func(t *rapid.T) {
				q := rapid.SampledFrom(qmQueues).Draw(t, "queue")
				del := rapid.Bool().Draw(t, "delete")
				cmd := &fsmpb.Command{Op: &fsmpb.Command_QueuePurge{QueuePurge: &fsmpb.QueuePurge{Queue: q}}}
				if del {
					cmd = &fsmpb.Command{Op: &fsmpb.Command_QueueDelete{QueueDelete: &fsmpb.QueueDelete{Queue: q}}}
				}
				r := m.st.Apply(cmd, nil)
				want := 0
				for _, id := range m.ids {
					it := m.items[id]
					if it.queue != q {
						continue
					}
					switch it.state {
					case qmReady, qmInFlight, qmDead:
						want++
						it.state, it.session = qmGone, 0
					case qmAcked:
						it.forgotten = it.forgotten || del
					}
				}
				if r.Err != nil || r.Queue.Removed != want {
					t.Fatalf("%v: %+v %v, want %d items removed", cmd, r.Queue, r.Err, want)
				}
				if del {
					for key := range m.ops {
						if strings.HasPrefix(key, q+"/") {
							delete(m.ops, key)
						}
					}
					m.maxAtt[q] = fsm.DefaultMaxAttempts // the next enqueue creates it anew
				}
			},
			"snapshot and restore": func(t *rapid.T) {
				before := m.st.Export()
				data, err := proto.MarshalOptions{Deterministic: true}.Marshal(before)
				if err != nil {
					t.Fatal(err)
				}
				decoded := &fsmpb.Snapshot{}
				if err := proto.Unmarshal(data, decoded); err != nil {
					t.Fatal(err)
				}
				restored, err := fsm.Import(decoded)
				if err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(restored.Export(), before) {
					t.Fatal("snapshot round trip changed the state")
				}
				m.st = restored
			},
			"enqueue batch": func(t *rapid.T) {
				q := rapid.SampledFrom(qmQueues).Draw(t, "queue")
				ops := rapid.SliceOfN(rapid.SampledFrom([]string{"", "", "a", "b", "c", "d"}), 1, 4).Draw(t, "ops")
				var items []item
				for _, op := range ops {
					items = append(items, item{"p", op})
				}
				r := m.st.Apply(enqueueBatchCmd(q, 0, items...), nil)
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				var prevNew uint64
				for i, op := range ops {
					got, key := r.Queue.Enqueued[i], q+"/"+op
					if first, seen := m.ops[key]; op != "" && seen {
						if !got.Duplicate || got.ID != first {
							t.Fatalf("batch item %d with op %s: %+v, want duplicate of %d", i, key, got, first)
						}
						continue
					}
					// New items take consecutive revisions.
					if got.Duplicate || (len(m.ids) > 0 && got.ID <= m.ids[len(m.ids)-1]) || (prevNew != 0 && got.ID != prevNew+1) {
						t.Fatalf("batch item %d: %+v after ids %v", i, got, m.ids)
					}
					prevNew = got.ID
					if op != "" {
						m.ops[key] = got.ID
					}
					m.items[got.ID] = &qmItem{id: got.ID, queue: q, state: qmReady}
					m.ids = append(m.ids, got.ID)
				}
			},
			"dequeue batch": func(t *rapid.T) {
				q := rapid.SampledFrom(qmQueues).Draw(t, "queue")
				var sess uint64
				if len(m.live) > 0 && rapid.Bool().Draw(t, "under session") {
					sess = rapid.SampledFrom(m.live).Draw(t, "session")
				}
				rcs := rapid.SliceOfN(rapid.SampledFrom(qmReceipts), 1, 4).Draw(t, "receipts")
				r := m.st.Apply(dequeueBatchCmd(q, sess, rcs...), nil)
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				ready := m.byState(q, qmReady)
				if want := min(len(rcs), len(ready)); len(r.Queue.Items) != want || r.Queue.Empty != (want == 0) {
					t.Fatalf("dequeue batch of %d from %s with %d ready: %+v", len(rcs), q, len(ready), r.Queue)
				}
				for i, d := range r.Queue.Items {
					it := m.items[ready[i]]
					if d.ID != it.id || d.Attempt != it.attempts+1 || d.Token <= m.maxToken {
						t.Fatalf("dequeue batch item %d: %+v, want item %d attempt %d token above %d", i, d, it.id, it.attempts+1, m.maxToken)
					}
					m.maxToken = d.Token
					it.state, it.attempts, it.token, it.session, it.receipt = qmInFlight, it.attempts+1, d.Token, sess, rcs[i]
					it.tokens = append(it.tokens, d.Token)
				}
			},
			"settle batch": func(t *rapid.T) {
				q := rapid.SampledFrom(qmQueues).Draw(t, "queue")
				var mine []*qmItem
				for k := rapid.IntRange(1, 4).Draw(t, "size"); len(mine) < k; {
					if it := pickItem(t); it.queue == q {
						mine = append(mine, it)
					} else if rapid.Bool().Draw(t, "stop") {
						break
					}
				}
				if len(mine) == 0 {
					return
				}
				ack := rapid.Bool().Draw(t, "ack")
				ds := make([]delivery, len(mine))
				for i, it := range mine {
					ds[i] = delivery{it.id, pickToken(t, it), pickReceipt(t, it)}
				}
				r := m.st.Apply(settleBatchCmd(q, ack, ds...), nil)
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				for i, it := range mine {
					got, d := r.Queue.Items[i], ds[i]
					current := it.state == qmInFlight && d.token == it.token && d.token != 0
					switch {
					case current && d.receipt != it.receipt, ack && it.state == qmAcked && !it.forgotten && d.token == it.token && d.receipt != it.receipt:
						if !errors.Is(got.Err, fsm.ErrPermissionDenied) {
							t.Fatalf("batch item %d (%+v) with a wrong receipt: %+v", i, it, got)
						}
					case current:
						if got.Err != nil || got.Stale || got.Duplicate {
							t.Fatalf("batch item %d of the current delivery: %+v", i, got)
						}
						if ack {
							it.state, it.session = qmAcked, 0
						} else {
							m.putBack(it)
						}
					case ack && it.state == qmAcked && !it.forgotten && d.token == it.token:
						if got.Err != nil || !got.Duplicate {
							t.Fatalf("batch item %d, a repeated ack: %+v", i, got)
						}
					default:
						if got.Err != nil || !got.Stale {
							t.Fatalf("batch item %d (%+v) with token %d: %+v, want stale", i, it, d.token, got)
						}
					}
				}
			},
			"": func(t *rapid.T) { m.check(t) },
		}
		actions["dequeue2"] = actions["dequeue"]
		actions["nack or expire2"] = actions["nack or expire"]
		for range propRounds {
			t.Repeat(actions)
		}
	})
}
