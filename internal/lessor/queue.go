package lessor

// Visibility timers of queue deliveries. A delivery (queue, id, token) in
// flight has a deadline on the leader's monotonic clock; when it passes,
// the leader proposes QueueExpire(queue, id, token), which the state
// machine ignores unless the item is still in flight under that token (an
// ack, a nack or a redelivery ended it; an Extend re-arms the timer). A new
// leader re-arms every delivery with its full visibility: a lease never
// ends early because leadership moved.
//
// Deadlines are kept in a B-tree ordered by time, so arming, settling and
// finding what is due cost O(log n) however many items are in flight.

import (
	"context"
	"math"
	"time"

	"github.com/google/btree"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

type qkey struct {
	queue string
	id    uint64
}

type qtimer struct {
	at    tick
	key   qkey
	token uint64
}

func qtimerLess(a, b qtimer) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.key.queue != b.key.queue {
		return a.key.queue < b.key.queue
	}
	return a.key.id < b.key.id
}

// queueTimers is guarded by Lessor.mu. Its times are on the lessor's
// clock (see Lessor.stalled), so a stall moves them without touching them.
type queueTimers struct {
	byKey  map[qkey]qtimer
	byTime *btree.BTreeG[qtimer]
	// wakeAt is the earliest deadline when the loop last looked (noWake:
	// none). Only a deadline before it needs to wake the loop: a busy
	// queue then costs the loop nothing between its own deadlines.
	wakeAt tick
}

// noWake is queueTimers.wakeAt when no deadline is armed.
const noWake = tick(math.MaxInt64)

func (t *queueTimers) reset() {
	t.byKey = make(map[qkey]qtimer)
	t.byTime = btree.NewG(32, qtimerLess)
	t.wakeAt = noWake
}

func (t *queueTimers) arm(k qkey, token uint64, at tick) {
	if t.byKey == nil {
		t.reset()
	}
	if old, ok := t.byKey[k]; ok {
		t.byTime.Delete(old)
	}
	e := qtimer{at: at, key: k, token: token}
	t.byKey[k] = e
	t.byTime.ReplaceOrInsert(e)
}

func (t *queueTimers) disarm(k qkey, token uint64) {
	if old, ok := t.byKey[k]; ok && old.token == token {
		delete(t.byKey, k)
		t.byTime.Delete(old)
	}
}

// maxQueueExpiries bounds the expiries proposed in one round.
const maxQueueExpiries = 1024

// due removes and returns the timers that have passed, and how long until
// the next one.
func (t *queueTimers) due(now tick) (out []qtimer, next time.Duration) {
	next = time.Hour
	if t.byTime == nil {
		return nil, next
	}
	for len(out) < maxQueueExpiries {
		e, ok := t.byTime.Min()
		if !ok {
			break
		}
		if left := e.at.sub(now); left > 0 {
			next = left
			t.wakeAt = e.at
			return out, next
		}
		t.byTime.DeleteMin()
		delete(t.byKey, e.key)
		out = append(out, e)
	}
	t.wakeAt = noWake
	if e, ok := t.byTime.Min(); ok {
		t.wakeAt = e.at
	}
	return out, next
}

// promoteQueues re-arms every delivery in flight with its full visibility
// from now. The caller holds l.mu.
func (l *Lessor) promoteQueues(now tick, s *fsm.State) {
	l.queue.reset()
	s.InFlight(func(v fsm.InFlightView) {
		l.queue.arm(qkey{v.Queue, v.ID}, v.Token, now.add(time.Duration(v.VisibilityMs)*time.Millisecond))
	})
}

// observeQueue follows deliveries. The caller holds l.mu.
func (l *Lessor) observeQueue(now tick, e fsm.Event) {
	switch e.Kind {
	case fsm.EventQueueLeased:
		at := now.add(time.Duration(e.Queue.VisibilityMs) * time.Millisecond)
		l.queue.arm(qkey{e.Name, e.Queue.ID}, e.Queue.Token, at)
		if at < l.queue.wakeAt {
			l.queue.wakeAt = at
			l.poke()
		}
	case fsm.EventQueueSettled:
		l.queue.disarm(qkey{e.Name, e.Queue.ID}, e.Queue.Token)
	}
}

func (l *Lessor) dueQueue() ([]qtimer, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.actingLocked() {
		return nil, time.Hour
	}
	return l.queue.due(l.nowLocked())
}

// expireDelivery proposes the expiry of one delivery and re-arms it,
// after a short backoff, if the proposal failed.
func (l *Lessor) expireDelivery(ctx context.Context, e qtimer) {
	cmd := &fsmpb.Command{Op: &fsmpb.Command_QueueExpire{QueueExpire: &fsmpb.QueueSettle{Queue: e.key.queue, Id: e.key.id, DeliveryToken: e.token}}}
	if _, err := l.propose(ctx, cmd); err != nil && ctx.Err() == nil {
		l.mu.Lock()
		if _, rearmed := l.queue.byKey[e.key]; l.term != 0 && !rearmed {
			l.queue.arm(e.key, e.token, l.nowLocked().add(retryBackoff))
		}
		l.mu.Unlock()
	}
}
