package fsm

import (
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

type session struct {
	id    uint64
	owner string
	ttlMs int64
	held  map[string]struct{}
	waits map[string]*waiter
}

// ValidateSession checks the arguments of CreateSession.
func ValidateSession(owner string, ttlMs int64) error {
	if ttlMs < MinSessionTTLMs || ttlMs > MaxSessionTTLMs {
		return fmt.Errorf("%w: session TTL %dms is outside 1s..1h", ErrInvalid, ttlMs)
	}
	if len(owner) > MaxOwnerLen {
		return fmt.Errorf("%w: owner is %d bytes, the limit is %d", ErrInvalid, len(owner), MaxOwnerLen)
	}
	return nil
}

func (s *State) createSession(c *fsmpb.CreateSession, emit EventSink) Result {
	if err := ValidateSession(c.GetOwner(), c.GetTtlMs()); err != nil {
		return Result{Err: err}
	}
	id := s.bump()
	s.addSession(&session{
		id: id, owner: c.GetOwner(), ttlMs: c.GetTtlMs(),
		held: make(map[string]struct{}), waits: make(map[string]*waiter),
	})
	emit(Event{Kind: EventSessionCreated, Session: id, TTLMs: c.GetTtlMs()})
	return Result{Session: id}
}

// endSession removes the session's waits first (so no hand-off below can
// grant to the dying session), then ends its grants in name order.
func (s *State) endSession(id uint64, expired bool, emit EventSink) Result {
	sess, ok := s.sessions[id]
	if !ok {
		return Result{Err: ErrSessionNotFound}
	}
	s.bump()
	for _, name := range sortedKeys(sess.waits) {
		w := sess.waits[name]
		s.locks[name].unlink(w)
		delete(sess.waits, name)
		emit(Event{Kind: EventWaitEnded, Session: id, Name: name, AcquireRevision: w.acqRev, Expired: expired})
	}
	ended := "released"
	if expired {
		ended = "expired"
	}
	for _, name := range sortedKeys(sess.held) {
		l := s.locks[name]
		g := l.holderOf(sess)
		delayMs := g.delayMs
		s.endGrant(l, g, ended, emit)
		if expired && delayMs > 0 {
			l.delayed = true
			l.delayGen++
			l.delayMs = delayMs
			emit(Event{Kind: EventDelayStarted, Name: name, DelayMs: delayMs, Generation: l.delayGen})
			continue
		}
		s.handOff(l, emit)
	}
	s.kvEndSession(id, emit)
	s.queueSessionEnded(id, emit)
	s.removeSession(sess)
	emit(Event{Kind: EventSessionEnded, Session: id, Expired: expired})
	return Result{}
}
