package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// item is one item of an enqueue batch: payload and operation id.
type item struct{ payload, op string }

func enqueueBatchCmd(q string, maxAttempts uint32, items ...item) *fsmpb.Command {
	c := &fsmpb.QueueEnqueueBatch{Queue: q, MaxAttempts: maxAttempts}
	for _, it := range items {
		c.Items = fsm.AppendBatchItem(c.Items, []byte(it.payload), it.op)
	}
	return &fsmpb.Command{Op: &fsmpb.Command_QueueEnqueueBatch{QueueEnqueueBatch: c}}
}

// dequeueBatchCmd hands out up to len(receipts) items, the i-th with
// receipt receipts[i].
func dequeueBatchCmd(q string, session uint64, receipts ...string) *fsmpb.Command {
	c := &fsmpb.QueueDequeueBatch{Queue: q, Session: session, VisibilityMs: 30_000}
	for _, r := range receipts {
		c.ReceiptHashes = append(c.ReceiptHashes, receiptHash(r))
	}
	return &fsmpb.Command{Op: &fsmpb.Command_QueueDequeueBatch{QueueDequeueBatch: c}}
}

// delivery names one delivery to settle: id, token and receipt.
type delivery struct {
	id, token uint64
	receipt   string
}

func settleBatchCmd(q string, ack bool, ds ...delivery) *fsmpb.Command {
	c := &fsmpb.QueueSettleBatch{Queue: q}
	for _, d := range ds {
		c.Items = append(c.Items, &fsmpb.QueueSettleItem{Id: d.id, DeliveryToken: d.token, ReceiptHash: receiptHash(d.receipt)})
	}
	if ack {
		return &fsmpb.Command{Op: &fsmpb.Command_QueueAckBatch{QueueAckBatch: c}}
	}
	return &fsmpb.Command{Op: &fsmpb.Command_QueueNackBatch{QueueNackBatch: c}}
}

func deliveriesOf(items []fsm.QueueItemResult, receipts ...string) []delivery {
	out := make([]delivery, len(items))
	for i, it := range items {
		out[i] = delivery{it.ID, it.Token, receipts[i]}
	}
	return out
}

func TestQueueEnqueueBatch(t *testing.T) {
	s := fsm.NewState()
	qapply(t, s, enqueueCmd("q", "before", "op-old", 0))
	rev := s.Revision()
	r := qapply(t, s, enqueueBatchCmd("q", 0, item{"a", ""}, item{"b", "op-b"}, item{"again", "op-old"}, item{"c", ""}, item{"b twice", "op-b"}))
	if len(r.Enqueued) != 5 {
		t.Fatalf("%d results for 5 items", len(r.Enqueued))
	}
	a, b, old, c, b2 := r.Enqueued[0], r.Enqueued[1], r.Enqueued[2], r.Enqueued[3], r.Enqueued[4]
	// The new items take one revision each, in order.
	if a.ID != rev+1 || b.ID != rev+2 || c.ID != rev+3 || a.Duplicate || b.Duplicate || c.Duplicate || s.Revision() != rev+3 {
		t.Fatalf("new items %+v %+v %+v (revision %d → %d)", a, b, c, rev, s.Revision())
	}
	if !old.Duplicate || old.ID != 1 || !b2.Duplicate || b2.ID != b.ID {
		t.Fatalf("duplicates %+v %+v, want of 1 and of %d", old, b2, b.ID)
	}
	var got []string
	for range 4 {
		got = append(got, string(qapply(t, s, dequeueCmd("q", 0)).Payload))
	}
	if want := []string{"before", "a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("dequeued %v, want %v", got, want)
	}
	// A batch of duplicates only changes nothing.
	rev = s.Revision()
	if r := qapply(t, s, enqueueBatchCmd("q", 0, item{"x", "op-b"})); !r.Enqueued[0].Duplicate || r.Enqueued[0].ID != b.ID || s.Revision() != rev {
		t.Fatalf("retried batch: %+v (revision %d → %d)", r.Enqueued, rev, s.Revision())
	}
}

// TestQueueEnqueueBatchIsAllOrNothing: a batch with one bad item, or one
// that would pass a limit, adds none of its items.
func TestQueueEnqueueBatchIsAllOrNothing(t *testing.T) {
	s := fsm.NewState()
	s.Apply(&fsmpb.Command{Op: &fsmpb.Command_SetLimits{SetLimits: &fsmpb.SetLimits{Limits: &fsmpb.Limits{MaxQueueLength: 4}}}}, nil)
	qapply(t, s, enqueueCmd("q", "x", "", 0))
	rev := s.Revision()
	big := string(make([]byte, fsm.MaxQueuePayload+1))
	many := make([]item, fsm.MaxQueueBatch+1)
	for _, c := range []struct {
		name string
		cmd  *fsmpb.Command
		want error
	}{
		{"payload too large", enqueueBatchCmd("q", 0, item{"ok", "op-1"}, item{big, ""}), fsm.ErrInvalid},
		{"too many items", enqueueBatchCmd("q", 0, many...), fsm.ErrInvalid},
		{"no item", enqueueBatchCmd("q", 0), fsm.ErrInvalid},
		{"items cut short", func() *fsmpb.Command {
			c := enqueueBatchCmd("q", 0, item{"ok", ""}, item{"cut", "op"})
			b := c.GetQueueEnqueueBatch()
			b.Items = b.Items[:len(b.Items)-1]
			return c
		}(), fsm.ErrInvalid},
		{"other max attempts", enqueueBatchCmd("q", 2, item{"ok", ""}), fsm.ErrInvalid},
		{"past max-queue-length", enqueueBatchCmd("q", 0, item{"1", "op-1"}, item{"2", ""}, item{"3", ""}, item{"4", ""}), fsm.ErrLimit},
	} {
		r := s.Apply(c.cmd, nil)
		if !errors.Is(r.Err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, r.Err, c.want)
		}
		if s.Revision() != rev || s.QueueLen("q") != 1 {
			t.Fatalf("%s changed the state: revision %d → %d, %d items", c.name, rev, s.Revision(), s.QueueLen("q"))
		}
	}
	// The operation id of a refused batch was not remembered.
	if r := qapply(t, s, enqueueBatchCmd("q", 0, item{"1", "op-1"}, item{"2", ""}, item{"3", ""})); r.Enqueued[0].Duplicate || s.QueueLen("q") != 4 {
		t.Fatalf("batch up to the limit: %+v, %d items", r.Enqueued, s.QueueLen("q"))
	}
}

func TestQueueDequeueBatch(t *testing.T) {
	s := fsm.NewState()
	sess := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "c", TtlMs: 5000}}}, nil).Session
	ids := make([]uint64, 5)
	for i := range ids {
		ids[i] = qapply(t, s, enqueueCmd("q", fmt.Sprint(i), "", 0)).ID
	}
	var leased []fsm.Event
	r := s.Apply(dequeueBatchCmd("q", sess, "r0", "r1", "r2"), func(e fsm.Event) {
		if e.Kind == fsm.EventQueueLeased {
			leased = append(leased, e)
		}
	})
	if r.Err != nil || len(r.Queue.Items) != 3 {
		t.Fatalf("dequeue of 3: %+v %v", r.Queue, r.Err)
	}
	var last uint64
	for i, d := range r.Queue.Items {
		// Oldest first, each with its own token (a revision of its own).
		if d.ID != ids[i] || string(d.Payload) != fmt.Sprint(i) || d.Attempt != 1 || d.Token <= last || d.Token <= ids[4] {
			t.Fatalf("item %d: %+v", i, d)
		}
		last = d.Token
		if e := leased[i]; e.Queue.ID != d.ID || e.Queue.Token != d.Token || e.Queue.VisibilityMs != 30_000 {
			t.Fatalf("leased event %d: %+v for %+v", i, e.Queue, d)
		}
	}
	if s.Revision() != last {
		t.Fatalf("revision %d after tokens up to %d", s.Revision(), last)
	}
	// Each delivery settles with its own receipt only.
	ds := deliveriesOf(r.Queue.Items, "r0", "r1", "r2")
	if r := s.Apply(ackWith("q", ds[1].id, ds[1].token, "r0"), nil); !errors.Is(r.Err, fsm.ErrPermissionDenied) {
		t.Fatalf("ack of item 1 with item 0's receipt: %+v %v", r.Queue, r.Err)
	}
	// Fewer ready than asked: what there is.
	rest := qapply(t, s, dequeueBatchCmd("q", 0, "a", "b", "c", "d"))
	if len(rest.Items) != 2 || rest.Items[0].ID != ids[3] || rest.Items[1].ID != ids[4] || rest.Empty {
		t.Fatalf("dequeue of 4 from 2 ready: %+v", rest)
	}
	if r := qapply(t, s, dequeueBatchCmd("q", 0, "a")); !r.Empty || len(r.Items) != 0 {
		t.Fatalf("dequeue from an empty queue: %+v", r)
	}
	if r := qapply(t, s, dequeueBatchCmd("nothing", 0, "a")); !r.Empty {
		t.Fatalf("dequeue from an unknown queue: %+v", r)
	}
	// The session's end returns all three of its deliveries, in id order.
	s.Apply(&fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: sess}}}, nil)
	back := qapply(t, s, dequeueBatchCmd("q", 0, "x", "y", "z", "w"))
	if len(back.Items) != 3 || back.Items[0].ID != ids[0] || back.Items[2].ID != ids[2] || back.Items[0].Attempt != 2 {
		t.Fatalf("after the session ended: %+v", back.Items)
	}
}

func TestQueueDequeueBatchStopsAtItsByteBudget(t *testing.T) {
	s := fsm.NewState()
	third := string(make([]byte, fsm.MaxQueueBatchBytes/3+1))
	for range 4 {
		qapply(t, s, enqueueCmd("q", third, "", 0))
	}
	if r := qapply(t, s, dequeueBatchCmd("q", 0, "a", "b", "c", "d")); len(r.Items) != 2 {
		t.Fatalf("%d items of %d bytes in one batch, the budget is %d", len(r.Items), len(third), fsm.MaxQueueBatchBytes)
	}
	s2 := fsm.NewState()
	qapply(t, s2, enqueueCmd("q", string(make([]byte, fsm.MaxQueuePayload)), "", 0))
	qapply(t, s2, enqueueCmd("q", "small", "", 0))
	if r := qapply(t, s2, dequeueBatchCmd("q", 0, "a", "b")); len(r.Items) != 1 {
		t.Fatalf("a batch starting with a payload at the budget holds %d items, want 1", len(r.Items))
	}
}

func TestQueueDequeueBatchValidation(t *testing.T) {
	s := fsm.NewState()
	qapply(t, s, enqueueCmd("q", "x", "", 0))
	rev := s.Revision()
	short := dequeueBatchCmd("q", 0, "a")
	short.GetQueueDequeueBatch().ReceiptHashes = append(short.GetQueueDequeueBatch().ReceiptHashes, []byte("short"))
	many := dequeueBatchCmd("q", 0, make([]string, fsm.MaxQueueBatch+1)...)
	bad := dequeueBatchCmd("q", 0, "a")
	bad.GetQueueDequeueBatch().VisibilityMs = 1
	for name, cmd := range map[string]*fsmpb.Command{"no receipt": dequeueBatchCmd("q", 0), "short hash": short, "too many": many, "visibility": bad, "no name": dequeueBatchCmd("", 0, "a")} {
		if r := s.Apply(cmd, nil); !errors.Is(r.Err, fsm.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, r.Err)
		}
	}
	if r := s.Apply(dequeueBatchCmd("q", 99, "a"), nil); !errors.Is(r.Err, fsm.ErrSessionNotFound) {
		t.Errorf("unknown session: %v", r.Err)
	}
	if s.Revision() != rev {
		t.Fatalf("refused dequeues changed the revision %d → %d", rev, s.Revision())
	}
}

// TestQueueSettleBatchIsPerItem: every delivery of an ack batch is
// settled, found stale or refused on its own, and the batch takes one
// revision.
func TestQueueSettleBatchIsPerItem(t *testing.T) {
	s := fsm.NewState()
	for i := range 4 {
		qapply(t, s, enqueueCmd("q", fmt.Sprint(i), "", 0))
	}
	ds := deliveriesOf(qapply(t, s, dequeueBatchCmd("q", 0, "r0", "r1", "r2", "r3")).Items, "r0", "r1", "r2", "r3")
	qapply(t, s, ackWith("q", ds[3].id, ds[3].token, "r3"))
	rev := s.Revision()
	r := qapply(t, s, settleBatchCmd("q", true,
		ds[0], // acks
		delivery{ds[1].id, ds[1].token + 100, "r1"}, // stale token
		delivery{ds[2].id, ds[2].token, "r0"},       // not its receipt
		ds[3],                                       // acked before: duplicate
		ds[0],                                       // acked earlier in this batch
	))
	res := r.Items
	switch {
	case len(res) != 5:
		t.Fatalf("%d results", len(res))
	case res[0].Err != nil || res[0].Stale || res[0].Duplicate:
		t.Errorf("ack: %+v", res[0])
	case !res[1].Stale:
		t.Errorf("stale: %+v", res[1])
	case !errors.Is(res[2].Err, fsm.ErrPermissionDenied):
		t.Errorf("wrong receipt: %+v", res[2])
	case !res[3].Duplicate || !res[4].Duplicate:
		t.Errorf("repeated acks: %+v %+v", res[3], res[4])
	}
	if s.Revision() != rev+1 {
		t.Fatalf("an ack batch took revisions %d → %d, want one", rev, s.Revision())
	}
	if st := s.QueueStats("q"); st.InFlight != 2 {
		t.Fatalf("in flight after the batch: %+v", st)
	}
	// A batch that changes nothing takes no revision.
	rev = s.Revision()
	if r := qapply(t, s, settleBatchCmd("q", true, delivery{ds[1].id, 1, "r1"})); !r.Items[0].Stale || s.Revision() != rev {
		t.Fatalf("stale batch: %+v, revision %d → %d", r.Items, rev, s.Revision())
	}
	// The refused delivery is still settled by its own receipt.
	if r := qapply(t, s, settleBatchCmd("q", true, ds[1], ds[2])); r.Items[0].Err != nil || r.Items[1].Err != nil || r.Items[0].Stale || r.Items[1].Stale {
		t.Fatalf("acks with the right receipts: %+v", r.Items)
	}
	if s.QueueLen("q") != 0 {
		t.Fatalf("%d items left", s.QueueLen("q"))
	}
}

// TestQueueNackBatchDeadLettersEachItemOnItsOwn: items of one batch go
// back to their own places, and each is dead-lettered when it has had its
// own max attempts.
func TestQueueNackBatchDeadLettersEachItemOnItsOwn(t *testing.T) {
	s := fsm.NewState()
	a := qapply(t, s, enqueueCmd("q", "a", "", 2)).ID
	d := qapply(t, s, dequeueCmd("q", 0))
	qapply(t, s, nackCmd("q", d.ID, d.Token)) // a: one attempt so far
	b := qapply(t, s, enqueueCmd("q", "b", "", 0)).ID
	c := qapply(t, s, enqueueCmd("q", "c", "", 0)).ID
	got := qapply(t, s, dequeueBatchCmd("q", 0, "1", "2", "3")).Items
	if got[0].ID != a || got[0].Attempt != 2 || got[1].ID != b || got[1].Attempt != 1 || got[2].ID != c {
		t.Fatalf("batch %+v", got)
	}
	qapply(t, s, settleBatchCmd("q", false, deliveriesOf(got, "1", "2", "3")...))
	if st := s.QueueStats("q"); st.Dead != 1 || st.Ready != 2 || st.InFlight != 0 {
		t.Fatalf("after the nack batch: %+v", st)
	}
	if dl := slices.Collect(s.DeadLetters("q", 0)); len(dl) != 1 || dl[0].ID != a || dl[0].Attempts != 2 {
		t.Fatalf("dead letters %+v", dl)
	}
	again := qapply(t, s, dequeueBatchCmd("q", 0, "x", "y"))
	if len(again.Items) != 2 || again.Items[0].ID != b || again.Items[0].Attempt != 2 || again.Items[1].ID != c {
		t.Fatalf("redelivery %+v", again.Items)
	}
}

func TestQueueSettleBatchValidation(t *testing.T) {
	s := fsm.NewState()
	many := make([]delivery, fsm.MaxQueueBatch+1)
	for name, cmd := range map[string]*fsmpb.Command{"empty": settleBatchCmd("q", true), "too many": settleBatchCmd("q", false, many...), "no name": settleBatchCmd("", true, delivery{1, 1, "r"})} {
		if r := s.Apply(cmd, nil); !errors.Is(r.Err, fsm.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, r.Err)
		}
	}
}

// TestQueueSnapshotPacksItems: ready and dead items are written packed in
// chunks and read back, redelivered ones in their places, from the
// message as from Persist's stream; the listed form of earlier snapshots
// is read too, and damaged chunks are refused.
func TestQueueSnapshotPacksItems(t *testing.T) {
	f := fsm.New(nil)
	apply := func(cmd *fsmpb.Command) *fsm.QueueResult {
		t.Helper()
		r := applyLogged(t, f, cmd)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		return r.Queue
	}
	const n = 30_000 // more than one chunk
	for i := 0; i < n; i += fsm.MaxQueueBatch {
		var items []item
		for j := i; j < i+fsm.MaxQueueBatch; j++ {
			items = append(items, item{fmt.Sprintf("item %05d %090d", j, 0), ""})
		}
		apply(enqueueBatchCmd("q", 1, items...))
	}
	apply(enqueueCmd("other", "x", "", 0))
	d := apply(dequeueCmd("q", 0)) // dead after its nack
	apply(nackCmd("q", d.ID, d.Token))
	ds := apply(dequeueBatchCmd("q", 0, "a", "b", "c"))
	apply(ackWith("q", ds.Items[0].ID, ds.Items[0].Token, "a"))
	apply(expireCmd("q", ds.Items[2].ID, ds.Items[2].Token)) // dead too
	var snap *fsmpb.Snapshot
	f.Read(func(s *fsm.State) { snap = s.Export() })
	var chunks, dead int
	for _, c := range snap.GetQueueItems() {
		chunks++
		if c.GetDead() {
			dead++
		}
	}
	for _, q := range snap.GetQueues() {
		if len(q.GetReady()) != 0 || len(q.GetDead()) != 0 {
			t.Fatalf("queue %s lists its items", q.GetName())
		}
	}
	if chunks < 4 || dead != 1 { // other's, q's ready ones (more than one), q's dead
		t.Fatalf("%d chunks, %d of dead items", chunks, dead)
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	if perItem := float64(len(data)) / n; perItem > float64(len(fmt.Sprintf("item 00000 %090d", 0)))+4 {
		t.Errorf("the snapshot takes %.1f bytes per item", perItem)
	}
	check := func(what string, st *fsm.State) {
		t.Helper()
		if !proto.Equal(st.Export(), snap) {
			t.Fatalf("%s: another state", what)
		}
		if got := qapply(t, st, dequeueCmd("q", 0)); string(got.Payload) != fmt.Sprintf("item 00004 %090d", 0) {
			t.Fatalf("%s: first dequeue %q", what, got.Payload)
		}
	}
	back := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(data, back); err != nil {
		t.Fatal(err)
	}
	restored, err := fsm.Import(back)
	if err != nil {
		t.Fatal(err)
	}
	check("imported", restored)
	fromStream, err := fsm.ReadSnapshot(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	check("read from the message's encoding", fromStream)
	s, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := s.Persist(sink); err != nil {
		t.Fatal(err)
	}
	persisted, err := fsm.ReadSnapshot(bytes.NewReader(sink.buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	check("persisted", persisted)
	viaProto := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(sink.buf.Bytes(), viaProto); err != nil || !proto.Equal(viaProto, snap) {
		t.Fatalf("Persist's stream is not the snapshot's message: %v", err)
	}

	// The listed form.
	listed := proto.Clone(snap).(*fsmpb.Snapshot)
	listed.QueueItems = nil
	for _, q := range listed.GetQueues() {
		if q.Ready, q.Dead, err = fsm.QueueItemsOf(snap, q.GetName()); err != nil {
			t.Fatal(err)
		}
	}
	fromListed, err := fsm.Import(listed)
	if err != nil {
		t.Fatal(err)
	}
	check("listed", fromListed)

	// Damage.
	for name, damage := range map[string]func(*fsmpb.Snapshot){
		"cut short":           func(s *fsmpb.Snapshot) { c := s.QueueItems[0]; c.Packed = c.Packed[:len(c.Packed)-1] },
		"ids not rising":      func(s *fsmpb.Snapshot) { s.QueueItems[0].Packed = append(s.QueueItems[0].Packed, 0, 0, 0) },
		"chunks out of order": func(s *fsmpb.Snapshot) { s.QueueItems[1], s.QueueItems[2] = s.QueueItems[2], s.QueueItems[1] }, // q's first two
		"above revision": func(s *fsmpb.Snapshot) {
			s.QueueItems = append(s.QueueItems, &fsmpb.QueueItems{Queue: "other", Packed: []byte{0xff, 0xff, 0x03, 0, 0}})
		},
		"too many attempts": func(s *fsmpb.Snapshot) {
			s.QueueItems = append(s.QueueItems, &fsmpb.QueueItems{Queue: "q", Dead: true, Packed: []byte{0xff, 0xff, 0x03, 0xff, 0x7f, 0}})
		},
		"unknown queue": func(s *fsmpb.Snapshot) {
			s.QueueItems = append(s.QueueItems, &fsmpb.QueueItems{Queue: "nobody", Packed: []byte{1, 0, 0}})
		},
	} {
		bad := proto.Clone(snap).(*fsmpb.Snapshot)
		damage(bad)
		if _, err := fsm.Import(bad); err == nil {
			t.Errorf("%s: imported", name)
		}
		data, err := proto.Marshal(bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fsm.ReadSnapshot(bytes.NewReader(data)); err == nil {
			t.Errorf("%s: read", name)
		}
	}
	if _, err := fsm.ReadSnapshot(bytes.NewReader(sink.buf.Bytes()[:sink.buf.Len()-1])); err == nil {
		t.Error("a snapshot cut short was read")
	}
}

// applyLogged applies cmd to f as a log entry.
func applyLogged(t *testing.T, f *fsm.FSM, cmd *fsmpb.Command) fsm.Result {
	t.Helper()
	return fsm.TakeResult(f.Apply(logOf(t, 1, cmd)))
}
