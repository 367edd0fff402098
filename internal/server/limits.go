package server

import (
	"errors"
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm"
)

// ErrLimit: a request would take the service past one of its configured
// limits. The message names the limit, its value and the flag that sets it.
var ErrLimit = errors.New("tenure: limit reached")

// Limits are the admission limits the leader enforces before proposing:
// the coordinator is not a database. Zero means the default. Requests
// within the limits keep being served when a limit is reached.
type Limits struct {
	// MaxSessions bounds the number of live sessions (--max-sessions).
	MaxSessions int
	// MaxWaiters bounds the number of queued acquires per lock
	// (--max-waiters).
	MaxWaiters int
	// MaxNameBytes bounds lock, semaphore, election and fenced register
	// names (--max-name-len; at most fsm.MaxNameLen).
	MaxNameBytes int
	// MaxRegisterValueBytes bounds a fenced register's value
	// (--max-register-value-len; at most fsm.MaxValueLen).
	MaxRegisterValueBytes int

	// Key-value store and watch (kv.go, watch.go).
	KV KVLimits
	// MaxQueuePayload bounds a queue item's payload in bytes
	// (--max-queue-payload; at most fsm.MaxQueuePayload).
	MaxQueuePayload int
	// MaxQueueLength bounds the items one queue stores, ready, in flight
	// and dead (--max-queue-length).
	MaxQueueLength int
	// MaxQueues bounds the number of queues (--max-queues).
	MaxQueues int
	// Restore bounds the snapshot restore streams (cluster.go).
	Restore RestoreLimits
}

// DefaultLimits are the limits `tenure serve` runs with.
func DefaultLimits() Limits {
	return Limits{MaxSessions: 100_000, MaxWaiters: 10_000, MaxNameBytes: fsm.MaxNameLen, MaxRegisterValueBytes: fsm.MaxValueLen, KV: DefaultKVLimits()}
}

// Validate reports a limit set beyond what the state machine accepts.
func (l Limits) Validate() error {
	if l.MaxNameBytes > fsm.MaxNameLen {
		return fmt.Errorf("%w: --max-name-len %d is above the largest name the service stores, %d", fsm.ErrInvalid, l.MaxNameBytes, fsm.MaxNameLen)
	}
	if l.MaxRegisterValueBytes > fsm.MaxValueLen {
		return fmt.Errorf("%w: --max-register-value-len %d is above the largest value the service stores, %d", fsm.ErrInvalid, l.MaxRegisterValueBytes, fsm.MaxValueLen)
	}
	if err := l.KV.Validate(); err != nil {
		return err
	}
	return l.validateQueue()
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxSessions <= 0 {
		l.MaxSessions = d.MaxSessions
	}
	if l.MaxWaiters <= 0 {
		l.MaxWaiters = d.MaxWaiters
	}
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = d.MaxNameBytes
	}
	if l.MaxRegisterValueBytes <= 0 {
		l.MaxRegisterValueBytes = d.MaxRegisterValueBytes
	}
	l.KV = l.KV.withDefaults()
	l.Restore = l.Restore.withDefaults()
	return l.withQueueDefaults()
}

// checkName validates a lock, semaphore, election or register name and
// applies --max-name-len.
func (s *Server) checkName(kind, name string) error {
	if err := fsm.ValidateName(kind, name); err != nil {
		return err
	}
	if len(name) > s.limits.MaxNameBytes {
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d (--max-name-len)", fsm.ErrInvalid, kind, len(name), s.limits.MaxNameBytes)
	}
	return nil
}

// admitSession refuses a new session past MaxSessions.
func (s *Server) admitSession() error {
	n := 0
	s.node.Read(func(st *fsm.State) { n = st.SessionCount() })
	if n >= s.limits.MaxSessions {
		return fmt.Errorf("%w: %d sessions, the limit is %d (--max-sessions)", ErrLimit, n, s.limits.MaxSessions)
	}
	return nil
}

// involved reports whether session already holds or waits for name.
func (s *Server) involved(session uint64, name string) bool {
	in := false
	s.node.Read(func(st *fsm.State) { in = st.Involved(session, name) })
	return in
}

// admitWaiter refuses to queue one more acquire on name past MaxWaiters.
func (s *Server) admitWaiter(name string) error {
	n := 0
	s.node.Read(func(st *fsm.State) { n = st.WaiterCount(name) })
	if n >= s.limits.MaxWaiters {
		return fmt.Errorf("%w: %q has %d waiters, the limit is %d (--max-waiters)", ErrLimit, name, n, s.limits.MaxWaiters)
	}
	return nil
}
