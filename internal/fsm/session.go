package fsm

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"maps"
	"slices"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// session is a live session. Its fields above held never change once it
// is created: a snapshot reads them after the state lock is released
// (coreCopy, snapcore.go).
type session struct {
	id         uint64
	owner      string
	ttlMs      int64
	secretHash *[sha256.Size]byte // HashSecret of the session's secret; nil: none (made before secrets)
	identity   string             // who created it (with auth); see CheckSession
	etcdLease  bool               // a lease of the etcd API: no secret (see CheckEtcdLease)
	// held and waits are the names the session holds and waits on; nil
	// while it has none (most sessions, most of the time), so that an
	// idle session costs no map.
	held  map[string]struct{}
	waits map[string]*waiter
}

// hold notes that ss holds name.
func (ss *session) hold(name string) {
	if ss.held == nil {
		ss.held = make(map[string]struct{})
	}
	ss.held[name] = struct{}{}
}

// unhold notes that ss no longer holds name.
func (ss *session) unhold(name string) {
	delete(ss.held, name)
	if len(ss.held) == 0 {
		ss.held = nil
	}
}

// wait notes that ss waits on name as w.
func (ss *session) wait(name string, w *waiter) {
	if ss.waits == nil {
		ss.waits = make(map[string]*waiter)
	}
	ss.waits[name] = w
}

// unwait notes that ss no longer waits on name.
func (ss *session) unwait(name string) {
	delete(ss.waits, name)
	if len(ss.waits) == 0 {
		ss.waits = nil
	}
}

// secretHashOf is what a session keeps of a secret's hash h, which is
// empty (none) or sha256.Size bytes.
func secretHashOf(h []byte) (*[sha256.Size]byte, error) {
	switch len(h) {
	case 0:
		return nil, nil
	case sha256.Size:
		return (*[sha256.Size]byte)(append([]byte(nil), h...)), nil
	}
	return nil, fmt.Errorf("%w: a secret hash is %d bytes, not %d", ErrInvalid, len(h), sha256.Size)
}

// secretHashBytes is ss's secret hash as bytes, nil for none.
func (ss *session) secretHashBytes() []byte {
	if ss.secretHash == nil {
		return nil
	}
	return ss.secretHash[:]
}

// SecretBytes is the size of a session secret (128 random bits).
const SecretBytes = 16

// HashSecret is what the state keeps of a secret: its SHA-256. The
// proposer draws the secret, gives it to the client and puts only the
// hash in the log.
func HashSecret(secret []byte) []byte {
	h := sha256.Sum256(secret)
	return h[:]
}

// CheckSession verifies that secret is session id's: ErrSessionNotFound
// if the session does not exist, ErrPermissionDenied if the secret is
// missing or wrong (a session made before secrets existed accepts none).
func (s *State) CheckSession(id uint64, secret []byte) error {
	ss, ok := s.sessions[id]
	if !ok {
		return fmt.Errorf("%w: session %d", ErrSessionNotFound, id)
	}
	if ss.secretHash == nil || len(secret) == 0 || subtle.ConstantTimeCompare(ss.secretHash[:], HashSecret(secret)) != 1 {
		return fmt.Errorf("%w: session %d: the session's secret is missing or wrong (only the client that created a session can use it)", ErrPermissionDenied, id)
	}
	return nil
}

// CheckEtcdLease verifies that id is a live etcd lease: a session created
// with etcd_lease. Any other id, that of a Tenure session included, is
// ErrSessionNotFound: the etcd API, which acts on a lease by its id alone
// as etcd does, can never reach a session that has a secret. An etcd
// lease stays one for as long as it lives and ids are never reused, so a
// check before a proposal stays true when the command is applied (the
// lease may have ended by then, which the state machine answers).
func (s *State) CheckEtcdLease(id uint64) error {
	if ss, ok := s.sessions[id]; ok && ss.etcdLease {
		return nil
	}
	return fmt.Errorf("%w: lease %d", ErrSessionNotFound, id)
}

// EtcdLease returns the TTL an etcd lease was granted, and whether id is
// a live etcd lease.
func (s *State) EtcdLease(id uint64) (ttlMs int64, ok bool) {
	if ss, found := s.sessions[id]; found && ss.etcdLease {
		return ss.ttlMs, true
	}
	return 0, false
}

// EtcdLeases returns the ids of every live etcd lease, in order.
func (s *State) EtcdLeases() []uint64 {
	var ids []uint64
	s.sessionOrder.Ascend(func(ss *session) bool {
		if ss.etcdLease {
			ids = append(ids, ss.id)
		}
		return true
	})
	return ids
}

// SessionKeys returns the keys bound to a session or etcd lease, in order.
func (s *State) SessionKeys(id uint64) []string {
	return sortedKeys(s.kv.ephemeral[id])
}

// ValidateEtcdLease checks the arguments of a CreateSession of an etcd
// lease: its TTL may be up to MaxEtcdLeaseTTLMs (etcd's maximum).
func ValidateEtcdLease(owner string, ttlMs int64) error {
	if ttlMs < MinSessionTTLMs || ttlMs > MaxEtcdLeaseTTLMs {
		return fmt.Errorf("%w: lease TTL %dms is outside %dms..%dms", ErrInvalid, ttlMs, MinSessionTTLMs, int64(MaxEtcdLeaseTTLMs))
	}
	if len(owner) > MaxOwnerLen {
		return fmt.Errorf("%w: owner is %d bytes, the limit is %d", ErrInvalid, len(owner), MaxOwnerLen)
	}
	return nil
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
	validate := ValidateSession
	if c.GetEtcdLease() {
		validate = ValidateEtcdLease
		if len(c.GetSecretHash()) != 0 {
			return Result{Err: fmt.Errorf("%w: an etcd lease has no secret", ErrInvalid)}
		}
	}
	if err := validate(c.GetOwner(), c.GetTtlMs()); err != nil {
		return Result{Err: err}
	}
	// etcd leases and Tenure's sessions have limits of their own, so
	// that clients of the one API cannot take all the other's.
	limitErr := overLimit("max-sessions", s.limits.MaxSessions, "live sessions", uint64(len(s.sessions))-s.etcdLeases, 1)
	switch {
	case !s.at(2):
		// Before version 2 every session, etcd lease or not, counted
		// against max-sessions (version.go).
		limitErr = overLimit("max-sessions", s.limits.MaxSessions, "live sessions", uint64(len(s.sessions)), 1)
	case c.GetEtcdLease():
		limitErr = overLimit("max-etcd-leases", s.limits.MaxEtcdLeases, "live etcd leases", s.etcdLeases, 1)
	}
	if limitErr != nil {
		return Result{Err: limitErr}
	}
	id := s.bump()
	hash, err := secretHashOf(c.GetSecretHash())
	if err != nil {
		return Result{Err: err}
	}
	s.addSession(&session{
		id: id, owner: c.GetOwner(), ttlMs: c.GetTtlMs(), secretHash: hash, identity: c.GetIdentity(), etcdLease: c.GetEtcdLease(),
	})
	emit(Event{Kind: EventSessionCreated, Session: id, TTLMs: c.GetTtlMs()})
	return Result{Session: id}
}

// endSession removes the session's waits first (so no hand-off below can
// grant to the dying session), then ends its grants in name order.
// MaxExpiryBatch is the most sessions one ExpireSessions may end: it
// bounds the log entry (a few bytes a session) and how long applying it
// holds the state.
const MaxExpiryBatch = 16384

// expireSessions ends each session of ids by expiry, in order, skipping
// those already gone; Result.Expired counts the sessions it ended.
func (s *State) expireSessions(ids []uint64, emit EventSink) Result {
	if len(ids) > MaxExpiryBatch {
		return Result{Err: fmt.Errorf("%w: %d sessions in one expiry, the limit is %d", ErrInvalid, len(ids), MaxExpiryBatch)}
	}
	var r Result
	for _, id := range ids {
		if s.endSession(id, true, emit).Err == nil {
			r.Expired++
		}
	}
	return r
}

func (s *State) endSession(id uint64, expired bool, emit EventSink) Result {
	sess, ok := s.sessions[id]
	if !ok {
		return Result{Err: ErrSessionNotFound}
	}
	s.bump()
	for _, name := range slices.Sorted(maps.Keys(sess.waits)) {
		w := sess.waits[name]
		l := s.locks[name]
		s.removeWaiter(l, w)
		emit(Event{Kind: EventWaitEnded, Session: id, Name: name, AcquireRevision: w.acqRev, Expired: expired})
		s.handOff(l, emit) // a writer that left the head may have held back readers
		s.forget(l)
	}
	ended := "released"
	if expired {
		ended = "expired"
	}
	for _, name := range slices.Sorted(maps.Keys(sess.held)) {
		l := s.locks[name]
		g := l.holderOf(sess)
		delayMs := g.delayMs
		s.endGrant(l, g, ended, emit)
		if expired && delayMs > 0 {
			if !l.delayed {
				s.delayedLocks++
			}
			l.delayed = true
			l.delayGen = s.revision // unique, even across a removal of the lock
			l.delayMs = delayMs
			emit(Event{Kind: EventDelayStarted, Name: name, DelayMs: delayMs, Generation: l.delayGen})
			continue
		}
		s.handOff(l, emit)
		s.forget(l)
	}
	s.kvEndSession(id, emit)
	s.zkEndSession(id, emit)
	s.queueSessionEnded(id, emit)
	s.removeSession(sess)
	s.counters.sessionEnded(expired)
	emit(Event{Kind: EventSessionEnded, Session: id, Expired: expired})
	return Result{}
}
