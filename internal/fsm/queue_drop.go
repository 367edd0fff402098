package fsm

// Purge and delete: removing a queue's items, or the queue itself.

// purgeQueue removes every item of the named queue (ready, in flight and
// dead) and keeps the queue: its max attempts, operation ids and acks. The
// queue becomes the newest empty one. A queue that is unknown or holds
// nothing is left as it is (no revision).
func (s *State) purgeQueue(name string, emit EventSink) Result {
	if err := ValidateQueueName(name); err != nil {
		return Result{Err: err}
	}
	q := s.queues.byName[name]
	if q == nil || q.length() == 0 {
		return Result{Queue: &QueueResult{}}
	}
	s.bump()
	had := q.length()
	s.dropItems(q, emit)
	s.queueResized(q, had)
	return Result{Queue: &QueueResult{Removed: had}}
}

// deleteQueue removes the named queue entirely: its items and its
// memories. An unknown queue is left as it is (no revision).
func (s *State) deleteQueue(name string, emit EventSink) Result {
	if err := ValidateQueueName(name); err != nil {
		return Result{Err: err}
	}
	q := s.queues.byName[name]
	if q == nil {
		return Result{Queue: &QueueResult{}}
	}
	s.bump()
	had := q.length()
	if had > 0 {
		s.dropItems(q, emit)
		s.queues.nonEmpty--
	} else {
		s.queues.empty.Delete(emptyRef{q.emptySince, q.name})
	}
	delete(s.queues.byName, name)
	return Result{Queue: &QueueResult{Deleted: true, Removed: had}}
}

// dropItems empties q's trees. Every delivery in flight ends: it leaves
// its session's holdings, and EventQueueSettled tells the leader's timer
// that it is moot. Waiting consumers need nothing: no item became ready.
// The caller keeps the counters right.
func (s *State) dropItems(q *queue, emit EventSink) {
	q.inflight.Ascend(func(it qFlight) bool {
		s.queues.unhold(it.session, qref{q.name, it.id})
		emit(Event{Kind: EventQueueSettled, Name: q.name, Queue: &QueueEvent{ID: it.id, Token: it.token}})
		return true
	})
	// Fresh trees: O(1); a snapshot's clones keep the old ones.
	q.ready = newReadySet()
	q.inflight = newFlightTree()
	q.dead = newItemTree()
}
