package lessor_test

import (
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func (h *harness) enqueueDequeue(q string, visibility time.Duration) (id, token uint64) {
	h.apply(&fsmpb.Command{Op: &fsmpb.Command_QueueEnqueue{QueueEnqueue: &fsmpb.QueueEnqueue{Queue: q, Payload: []byte("x")}}})
	res := h.apply(&fsmpb.Command{Op: &fsmpb.Command_QueueDequeue{QueueDequeue: &fsmpb.QueueDequeue{Queue: q, VisibilityMs: visibility.Milliseconds()}}})
	return res.Queue.ID, res.Queue.Token
}

// TestQueueVisibilityExpiresOnlyAfterFullLease: the leader proposes the
// expiry of a delivery once its visibility has passed, an Extend re-arms
// it, a settled delivery is never expired, and a new leader gives every
// delivery its full visibility again.
func TestQueueVisibilityExpiresOnlyAfterFullLease(t *testing.T) {
	h := newHarness(t)
	h.promote()
	var id, tok, acked, ackedTok uint64
	h.settle(func() { id, tok = h.enqueueDequeue("q", 5*time.Second) })
	acked, ackedTok = h.enqueueDequeue("q", 5*time.Second) // not earlier: no wake-up
	h.apply(&fsmpb.Command{Op: &fsmpb.Command_QueueAck{QueueAck: &fsmpb.QueueSettle{Queue: "q", Id: acked, DeliveryToken: ackedTok}}})
	if got := h.step(4 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v before the visibility ran out", got)
	}
	h.apply(&fsmpb.Command{Op: &fsmpb.Command_QueueExtend{QueueExtend: &fsmpb.QueueExtend{Queue: "q", Id: id, DeliveryToken: tok, VisibilityMs: 3000}}})
	if got := h.step(2 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v although the lease was extended by 3s 2s ago", got)
	}
	h.l.Demote()
	h.promote() // a new leader: the full 3 s again
	if got := h.step(2 * time.Second); len(got) != 0 {
		t.Fatalf("new leader expired a delivery early: %v", got)
	}
	got := h.stepWant(2*time.Second, 1)
	if len(got) != 1 {
		t.Fatalf("proposed %v, want one QueueExpire", got)
	}
	e := got[0].GetQueueExpire()
	if e.GetQueue() != "q" || e.GetId() != id || e.GetDeliveryToken() != tok {
		t.Fatalf("proposed %v, want QueueExpire(q, %d, %d)", got[0], id, tok)
	}
	h.mu.Lock()
	st := h.st.QueueStats("q")
	h.mu.Unlock()
	if st.Ready != 1 || st.InFlight != 0 {
		t.Fatalf("queue after the expiry: %+v", st)
	}
	if got := h.step(time.Minute); len(got) != 0 {
		t.Fatalf("proposed %v after everything settled", got)
	}
}

// TestQueueEarlierLeaseWakesTheLoop: a lease ending before every armed
// deadline wakes the timer loop, which then expires it on time.
func TestQueueEarlierLeaseWakesTheLoop(t *testing.T) {
	h := newHarness(t)
	h.promote()
	h.settle(func() { h.enqueueDequeue("q", 10*time.Second) })
	var id, tok uint64
	h.settle(func() { id, tok = h.enqueueDequeue("q", time.Second) })
	got := h.stepWant(1500*time.Millisecond, 1)
	if len(got) != 1 || got[0].GetQueueExpire().GetId() != id || got[0].GetQueueExpire().GetDeliveryToken() != tok {
		t.Fatalf("proposed %v, want QueueExpire(q, %d, %d)", got, id, tok)
	}
}
