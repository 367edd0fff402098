package fsm_test

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// noReceipt is a settle command carrying no receipt hash at all, as a
// hand-made proposal could; the server always hashes what it gets.
func noReceipt(cmd *fsmpb.Command) *fsmpb.Command {
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_QueueAck:
		op.QueueAck.ReceiptHash = nil
	case *fsmpb.Command_QueueNack:
		op.QueueNack.ReceiptHash = nil
	case *fsmpb.Command_QueueExtend:
		op.QueueExtend.ReceiptHash = nil
	}
	return cmd
}

// TestQueueDeliveryBelongsToItsReceipt: another consumer that knows the
// item id and the delivery token (both easy to guess) but not the receipt
// can neither ack, nack nor extend the delivery; the item stays in flight
// and the real consumer's ack then succeeds. A stranger's repeated ack is
// refused too, while the consumer's own repeat answers acked again.
func TestQueueDeliveryBelongsToItsReceipt(t *testing.T) {
	s := fsm.NewState()
	id := qapply(t, s, enqueueCmd("q", "x", "", 0)).ID
	d := qapply(t, s, dequeueWith("q", 0, "mine"))
	rev := s.Revision()
	for _, cmd := range []*fsmpb.Command{
		ackWith("q", id, d.Token, "guess"), nackWith("q", id, d.Token, "guess"), extendWith("q", id, d.Token, 60_000, "guess"),
		ackWith("q", id, d.Token, ""), nackWith("q", id, d.Token, ""), extendWith("q", id, d.Token, 60_000, ""),
		noReceipt(ackWith("q", id, d.Token, "")), noReceipt(nackWith("q", id, d.Token, "")), noReceipt(extendWith("q", id, d.Token, 60_000, "")),
	} {
		var evs []fsm.Event
		r := s.Apply(cmd, func(e fsm.Event) { evs = append(evs, e) })
		if !errors.Is(r.Err, fsm.ErrPermissionDenied) {
			t.Fatalf("%v by a stranger: %+v %v, want permission denied", cmd, r.Queue, r.Err)
		}
		if s.Revision() != rev || len(evs) != 0 {
			t.Fatalf("%v by a stranger changed the state: revision %d → %d, events %+v", cmd, rev, s.Revision(), evs)
		}
	}
	if st := s.QueueStats("q"); st.InFlight != 1 || st.Ready != 0 {
		t.Fatalf("stats after the stranger's attempts: %+v", st)
	}
	if r := qapply(t, s, ackWith("q", id, d.Token, "mine")); r.Stale || r.Duplicate {
		t.Fatalf("the consumer's ack: %+v", r)
	}
	rev = s.Revision()
	if r := s.Apply(ackWith("q", id, d.Token, "guess"), nil); !errors.Is(r.Err, fsm.ErrPermissionDenied) || s.Revision() != rev {
		t.Fatalf("a stranger repeating the ack: %+v %v, want permission denied", r.Queue, r.Err)
	}
	if r := qapply(t, s, ackWith("q", id, d.Token, "mine")); !r.Duplicate || s.Revision() != rev {
		t.Fatalf("the consumer repeating its ack: %+v", r)
	}
}

// TestQueueLateAckWithOwnReceiptIsStale: after the visibility ran out and
// the item was delivered again, the first consumer's ack (its own token
// and receipt) is stale, never OK; the first receipt does not settle the
// new delivery either.
func TestQueueLateAckWithOwnReceiptIsStale(t *testing.T) {
	s := fsm.NewState()
	id := qapply(t, s, enqueueCmd("q", "x", "", 0)).ID
	d1 := qapply(t, s, dequeueWith("q", 0, "first"))
	qapply(t, s, expireCmd("q", id, d1.Token)) // the leader's expiry: no receipt
	d2 := qapply(t, s, dequeueWith("q", 0, "second"))
	for _, cmd := range []*fsmpb.Command{ackWith("q", id, d1.Token, "first"), nackWith("q", id, d1.Token, "first"), extendWith("q", id, d1.Token, 1000, "first")} {
		if r := qapply(t, s, cmd); !r.Stale {
			t.Fatalf("%v late: %+v, want stale", cmd, r)
		}
	}
	if r := s.Apply(ackWith("q", id, d2.Token, "first"), nil); !errors.Is(r.Err, fsm.ErrPermissionDenied) {
		t.Fatalf("the first receipt on the second delivery: %v", r.Err)
	}
	if r := qapply(t, s, ackWith("q", id, d2.Token, "second")); r.Stale || r.Duplicate {
		t.Fatalf("the second consumer's ack: %+v", r)
	}
	if r := qapply(t, s, ackWith("q", id, d1.Token, "first")); !r.Stale {
		t.Fatalf("late ack after the item was acked: %+v", r)
	}
}

// TestQueueReceiptsSurviveSnapshot: the receipt hashes of deliveries in
// flight and of remembered acks are in the snapshot, so after a restore
// the stranger is still refused and the owners still settle.
func TestQueueReceiptsSurviveSnapshot(t *testing.T) {
	s := fsm.NewState()
	qapply(t, s, enqueueCmd("q", "a", "", 0))
	qapply(t, s, enqueueCmd("q", "b", "", 0))
	da := qapply(t, s, dequeueWith("q", 0, "ra"))
	db := qapply(t, s, dequeueWith("q", 0, "rb"))
	qapply(t, s, ackWith("q", da.ID, da.Token, "ra"))
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
	if !proto.Equal(r.Export(), s.Export()) {
		t.Fatal("the round trip changed the state")
	}
	for _, cmd := range []*fsmpb.Command{ackWith("q", db.ID, db.Token, "ra"), extendWith("q", db.ID, db.Token, 1000, ""), ackWith("q", da.ID, da.Token, "rb")} {
		if res := r.Apply(cmd, nil); !errors.Is(res.Err, fsm.ErrPermissionDenied) {
			t.Fatalf("%v after the restore: %+v %v, want permission denied", cmd, res.Queue, res.Err)
		}
	}
	if res := qapply(t, r, ackWith("q", da.ID, da.Token, "ra")); !res.Duplicate {
		t.Fatalf("repeated ack after the restore: %+v", res)
	}
	if res := qapply(t, r, ackWith("q", db.ID, db.Token, "rb")); res.Stale || res.Duplicate {
		t.Fatalf("ack of the delivery in flight after the restore: %+v", res)
	}
}

// TestQueueDequeueReceiptHashIsChecked: a dequeue whose receipt hash is not
// a SHA-256 is refused.
func TestQueueDequeueReceiptHashIsChecked(t *testing.T) {
	s := fsm.NewState()
	qapply(t, s, enqueueCmd("q", "x", "", 0))
	rev := s.Revision()
	r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_QueueDequeue{QueueDequeue: &fsmpb.QueueDequeue{Queue: "q", VisibilityMs: 1000, ReceiptHash: []byte("short")}}}, nil)
	if !errors.Is(r.Err, fsm.ErrInvalid) || s.Revision() != rev {
		t.Fatalf("dequeue with a 5-byte receipt hash: %v", r.Err)
	}
}
