package fsm

import (
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

type waiter struct {
	sess       *session
	acqRev     uint64
	delayMs    int64
	shared     bool
	value      []byte
	prev, next *waiter
}

type grant struct {
	sess    *session
	token   uint64
	acqRev  uint64
	delayMs int64
	shared  bool
	value   []byte
}

type histRec struct {
	owner      string
	session    uint64
	token      uint64
	grantedRev uint64
	ended      string
	endedRev   uint64
}

type lock struct {
	name        string
	permits     int      // 1 for a mutex
	holders     []*grant // in grant order: at most permits, or any number of readers
	nshared     int      // holders that are readers
	election    bool     // report holder changes (EventHolderChanged)
	head, tail  *waiter
	nwait       int
	nwaitShared int // waiters that are readers
	delayed     bool
	delayGen    uint64
	delayMs     int64
	history     []histRec
}

func (s *State) acquire(c *fsmpb.Acquire, emit EventSink) Result {
	if err := ValidateName("lock name", c.GetName()); err != nil {
		return Result{Err: err}
	}
	if c.GetLockDelayMs() < 0 || c.GetLockDelayMs() > MaxLockDelayMs {
		return Result{Err: fmt.Errorf("%w: lock delay %dms is outside 0..%dms", ErrInvalid, c.GetLockDelayMs(), MaxLockDelayMs)}
	}
	permits := int(max(c.GetPermits(), 1))
	if permits > MaxPermits {
		return Result{Err: fmt.Errorf("%w: %d permits, the limit is %d", ErrInvalid, permits, MaxPermits)}
	}
	if len(c.GetValue()) > MaxValueLen {
		return Result{Err: fmt.Errorf("%w: value is %d bytes, the limit is %d", ErrInvalid, len(c.GetValue()), MaxValueLen)}
	}
	if c.GetShared() && permits > 1 {
		return Result{Err: fmt.Errorf("%w: a shared (read) acquire is for read-write locks, which have one writer permit, not %d", ErrInvalid, permits)}
	}
	sess, ok := s.sessions[c.GetSession()]
	if !ok {
		return Result{Err: ErrSessionNotFound}
	}
	name := c.GetName()
	if _, held := sess.held[name]; held {
		if c.GetResume() {
			g := s.locks[name].holderOf(sess)
			return Result{Granted: true, Token: g.token, AcquireRevision: g.acqRev}
		}
		return Result{Err: ErrAlreadyHeld}
	}
	if w, waiting := sess.waits[name]; waiting {
		if c.GetResume() {
			pos := uint32(1)
			for x := s.locks[name].head; x != w; x = x.next {
				pos++
			}
			return Result{Queued: true, Position: pos, AcquireRevision: w.acqRev}
		}
		return Result{Err: ErrAlreadyHeld}
	}
	l := s.locks[name]
	if l != nil && l.permits != permits {
		kind := "semaphore"
		if l.permits == 1 {
			kind = "mutex"
		}
		return Result{Err: fmt.Errorf("%w: %q is a %s with %d permit(s); this acquire asks for %d", ErrInvalid, name, kind, l.permits, permits)}
	}
	free := l == nil || (l.head == nil && l.admits(c.GetShared()))
	if !free && !c.GetWait() {
		return Result{Err: ErrBusy}
	}
	if l == nil {
		if err := overLimit("max-locks", s.limits.MaxLocks, "locks in use", uint64(len(s.locks)), 1); err != nil {
			return Result{Err: err}
		}
	}
	if !free {
		if err := overLimit("max-waiters", s.limits.MaxWaiters, fmt.Sprintf("waiters on %q", name), uint64(l.nwait), 1); err != nil {
			return Result{Err: err}
		}
		if err := overLimit("max-total-waiters", s.limits.MaxTotalWaiters, "waiters on all locks", s.waiting, 1); err != nil {
			return Result{Err: err}
		}
	}
	// Admitted: only now does the acquire change the lock.
	if l == nil {
		l = &lock{name: name, permits: permits}
		s.addLock(l)
	}
	if c.GetElection() {
		l.election = true
	}
	rev := s.bump()
	if free {
		g := s.grant(l, sess, rev, c.GetLockDelayMs(), c.GetShared())
		g.value = append([]byte(nil), c.GetValue()...)
		s.holderChanged(l, emit)
		return Result{Granted: true, Token: rev, AcquireRevision: rev}
	}
	w := &waiter{sess: sess, acqRev: rev, delayMs: c.GetLockDelayMs(), shared: c.GetShared(), value: append([]byte(nil), c.GetValue()...)}
	s.addWaiter(l, w)
	return Result{Queued: true, Position: uint32(l.nwait), AcquireRevision: rev}
}

// grant makes sess a holder of l with token = the current revision.
func (s *State) grant(l *lock, sess *session, acqRev uint64, delayMs int64, shared bool) *grant {
	token := s.revision
	g := &grant{sess: sess, token: token, acqRev: acqRev, delayMs: delayMs, shared: shared}
	if len(l.holders) == 0 {
		s.heldLocks++
	}
	s.counters.Grants++
	l.holders = append(l.holders, g)
	if shared {
		l.nshared++
	}
	sess.hold(l.name)
	l.history = append(l.history, histRec{owner: sess.owner, session: sess.id, token: token, grantedRev: token, ended: "held"})
	if len(l.history) > s.historyLimit {
		l.history = append(l.history[:0], l.history[len(l.history)-s.historyLimit:]...)
	}
	return g
}

// admits reports whether a grant of the given kind may be made now
// (waiters aside): readers only without a writer, a writer only without
// readers and within the permits.
func (l *lock) admits(shared bool) bool {
	if l.delayed {
		return false
	}
	if shared {
		return l.nshared == len(l.holders)
	}
	return l.nshared == 0 && len(l.holders) < l.permits
}

// holderOf returns sess's grant of l, or nil (a scan of at most permits).
func (l *lock) holderOf(sess *session) *grant {
	for _, g := range l.holders {
		if g.sess == sess {
			return g
		}
	}
	return nil
}

// endGrant ends grant g of l, recording how.
func (s *State) endGrant(l *lock, g *grant, how string, emit EventSink) {
	first := len(l.holders) > 0 && l.holders[0] == g
	for i := len(l.history) - 1; i >= 0; i-- {
		if l.history[i].token == g.token {
			l.history[i].ended = how
			l.history[i].endedRev = s.revision
			break
		}
	}
	g.sess.unhold(l.name)
	for i, h := range l.holders {
		if h == g {
			l.holders = append(l.holders[:i], l.holders[i+1:]...)
			if g.shared {
				l.nshared--
			}
			break
		}
	}
	if len(l.holders) == 0 {
		s.heldLocks--
	}
	if first {
		s.holderChanged(l, emit)
	}
}

// handOff grants l to its first waiters, in order, while the head can be
// admitted (free permits, or a run of readers): O(1) work and exactly one
// event per grant. A waiting writer at the head stops readers behind it.
func (s *State) handOff(l *lock, emit EventSink) {
	for l.head != nil && l.admits(l.head.shared) {
		w := l.head
		s.removeWaiter(l, w)
		s.bump()
		s.counters.Handoffs++
		g := s.grant(l, w.sess, w.acqRev, w.delayMs, w.shared)
		g.value = w.value
		emit(Event{Kind: EventGranted, Session: w.sess.id, Name: l.name, Token: g.token, AcquireRevision: w.acqRev})
		if len(l.holders) == 1 {
			s.holderChanged(l, emit)
		}
	}
}

func (s *State) cancelAcquire(c *fsmpb.CancelAcquire, emit EventSink) Result {
	sess, ok := s.sessions[c.GetSession()]
	if !ok {
		return Result{Err: ErrSessionNotFound}
	}
	name := c.GetName()
	if w, ok := sess.waits[name]; ok && w.acqRev == c.GetAcquireRevision() {
		s.bump()
		l := s.locks[name]
		s.removeWaiter(l, w)
		s.handOff(l, emit) // a writer that left the head may have held back readers
		s.forget(l)
		return Result{}
	}
	if l := s.locks[name]; l != nil {
		if g := l.holderOf(sess); g != nil && g.acqRev == c.GetAcquireRevision() {
			s.bump()
			s.endGrant(l, g, "released", emit)
			s.handOff(l, emit)
			s.forget(l)
			return Result{}
		}
	}
	return Result{Err: ErrNotHeld}
}

// heldGrant finds the grant named by the handle (session, token) on lock
// name; nil unless that handle is a current holder.
func (s *State) heldGrant(name string, session, token uint64) (*lock, *grant) {
	l := s.locks[name]
	sess := s.sessions[session]
	if l == nil || sess == nil {
		return nil, nil
	}
	g := l.holderOf(sess)
	if g == nil || g.token != token {
		return nil, nil
	}
	return l, g
}

func (s *State) release(c *fsmpb.Release, emit EventSink) Result {
	l, g := s.heldGrant(c.GetName(), c.GetSession(), c.GetToken())
	if g == nil {
		return Result{Err: ErrNotHeld}
	}
	s.bump()
	s.endGrant(l, g, "released", emit)
	s.handOff(l, emit)
	s.forget(l)
	return Result{}
}

func (s *State) endLockDelay(c *fsmpb.EndLockDelay, emit EventSink) Result {
	l := s.locks[c.GetName()]
	if l == nil || !l.delayed || l.delayGen != c.GetGeneration() {
		return Result{} // already ended: harmless
	}
	s.bump()
	l.delayed = false
	l.delayMs = 0
	s.delayedLocks--
	s.handOff(l, emit)
	s.forget(l)
	return Result{}
}

// addWaiter queues w at the tail of l.
func (s *State) addWaiter(l *lock, w *waiter) {
	w.prev = l.tail
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.nwait++
	if w.shared {
		l.nwaitShared++
	}
	s.waiting++
	w.sess.wait(l.name, w)
}

// removeWaiter takes w out of l's queue, wherever it is: O(1).
func (s *State) removeWaiter(l *lock, w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next = nil, nil
	l.nwait--
	if w.shared {
		l.nwaitShared--
	}
	s.waiting--
	w.sess.unwait(l.name)
}

// forget removes l once nothing keeps it (no holder, no waiter, no
// lock-delay), so that the state shrinks when names are no longer used
// and a name's permits are fixed only while it is in use. Its grant
// records move to the history of removed locks.
func (s *State) forget(l *lock) {
	if len(l.holders) > 0 || l.head != nil || l.delayed {
		return
	}
	s.past.add(l.name, l.history)
	s.removeLock(l)
}

// holderChanged reports l's first holder (an election's leader) and value.
func (s *State) holderChanged(l *lock, emit EventSink) {
	if !l.election {
		return
	}
	e := Event{Kind: EventHolderChanged, Name: l.name, Revision: s.revision}
	if len(l.holders) > 0 {
		g := l.holders[0]
		e.Session, e.Owner, e.Token, e.Value = g.sess.id, g.sess.owner, g.token, g.value
	}
	emit(e)
}

func (s *State) proclaim(c *fsmpb.Proclaim, emit EventSink) Result {
	if len(c.GetValue()) > MaxValueLen {
		return Result{Err: fmt.Errorf("%w: value is %d bytes, the limit is %d", ErrInvalid, len(c.GetValue()), MaxValueLen)}
	}
	l, g := s.heldGrant(c.GetName(), c.GetSession(), c.GetToken())
	if g == nil {
		return Result{Err: ErrNotHeld}
	}
	s.bump()
	g.value = append([]byte(nil), c.GetValue()...)
	if l.holders[0] == g {
		s.holderChanged(l, emit)
	}
	return Result{}
}
