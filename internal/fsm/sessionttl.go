package fsm

import (
	"fmt"

	"github.com/google/btree"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// EventSessionTTL: Session's TTL is now TTLMs (SetSessionTTL); the
// leader times the session with it from then on.
const EventSessionTTL EventKind = 180

// sessionTTL is a TTL that SetSessionTTL gave a session. Kept by value
// in State.ttls, apart from the session, so that a snapshot's clone of
// the index keeps the TTLs of the moment it was taken while later
// commands change them (a session's own fields never change: snapcore.go).
type sessionTTL struct {
	id    uint64
	ttlMs int64
}

func newSessionTTLs() *btree.BTreeG[sessionTTL] {
	return btree.NewG(32, func(a, b sessionTTL) bool { return a.id < b.id })
}

// ttlOf is ss's TTL now: the one SetSessionTTL last gave it, else the one
// it was created (or restored from a snapshot) with. It costs nothing
// while no session's TTL was changed.
func (s *State) ttlOf(ss *session) int64 {
	return ttlIn(s.ttls, ss)
}

// ttlIn is ttlOf read from ttls, an index of State.ttls or a clone.
func ttlIn(ttls *btree.BTreeG[sessionTTL], ss *session) int64 {
	if ttls.Len() > 0 {
		if t, ok := ttls.Get(sessionTTL{id: ss.id}); ok {
			return t.ttlMs
		}
	}
	return ss.ttlMs
}

// ValidateSessionTTL checks the arguments of SetSessionTTL: the TTL is
// within a session's bounds (MinSessionTTLMs..MaxSessionTTLMs), as
// CreateSession's.
func ValidateSessionTTL(id uint64, ttlMs int64) error {
	if id == 0 {
		return fmt.Errorf("%w: no session", ErrInvalid)
	}
	if ttlMs < MinSessionTTLMs || ttlMs > MaxSessionTTLMs {
		return fmt.Errorf("%w: session TTL %dms is outside 1s..1h", ErrInvalid, ttlMs)
	}
	return nil
}

// setSessionTTL gives a live session a new TTL (SetSessionTTL). It
// changes no revision: a TTL is not part of what tokens and revisions
// order, as a keepalive is not, and a member that refuses the command
// (below cluster version 3) keeps the same revisions as one that
// applies it. ErrSessionNotFound if the session does not exist;
// ErrInvalid for a TTL out of bounds or an etcd lease (whose TTL, as
// etcd's, never changes).
func (s *State) setSessionTTL(c *fsmpb.SetSessionTTL, emit EventSink) Result {
	if err := ValidateSessionTTL(c.GetSession(), c.GetTtlMs()); err != nil {
		return Result{Err: err}
	}
	ss, ok := s.sessions[c.GetSession()]
	if !ok {
		return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.GetSession())}
	}
	if ss.etcdLease {
		return Result{Err: fmt.Errorf("%w: lease %d: an etcd lease's TTL never changes", ErrInvalid, ss.id)}
	}
	if c.GetTtlMs() == ss.ttlMs {
		s.ttls.Delete(sessionTTL{id: ss.id})
	} else {
		s.ttls.ReplaceOrInsert(sessionTTL{id: ss.id, ttlMs: c.GetTtlMs()})
	}
	emit(Event{Kind: EventSessionTTL, Session: ss.id, TTLMs: c.GetTtlMs()})
	return Result{}
}
