package fsm

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// ErrLimit: a command would take the state past one of the replicated
// admission limits. The message names the limit, its value and how to
// raise it. Nothing was changed.
var ErrLimit = errors.New("tenure: limit reached")

// Limits are the replicated admission limits. They are part of the state
// (identical on every replica, in every snapshot) and enforced by Apply,
// so concurrent requests cannot race past them: of N commands that would
// each add one session with one left, exactly one succeeds.
type Limits struct {
	MaxSessions      uint64
	MaxWaiters       uint64
	MaxTotalWaiters  uint64
	MaxLocks         uint64
	MaxRegisters     uint64
	MaxRegisterBytes uint64
	MaxQueues        uint64
	MaxQueueLength   uint64
	MaxKeys          uint64
	MaxKVBytes       uint64
	MaxEtcdLeases    uint64
	// The history window of the key-value store (kvhistory.go).
	MaxKVHistoryRevisions uint64
	MaxKVHistoryBytes     uint64
}

// LimitSpec describes one replicated limit: its name (the flag of
// `tenure serve` and `tenure limits set`), its JSON field, what it bounds,
// its default and where it lives in Limits.
type LimitSpec struct {
	Name    string // flag name, e.g. "max-sessions"
	Help    string
	Default uint64
	Field   func(*Limits) *uint64
}

// JSON is the limit's field name in JSON output ("max_sessions").
func (s LimitSpec) JSON() string { return strings.ReplaceAll(s.Name, "-", "_") }

// LimitSpecs lists every replicated limit, in the order they are shown.
var LimitSpecs = []LimitSpec{
	{"max-sessions", "live sessions (etcd leases count against --max-etcd-leases instead)", 100_000, func(l *Limits) *uint64 { return &l.MaxSessions }},
	{"max-waiters", "queued acquires per lock, semaphore, read-write lock or election", 10_000, func(l *Limits) *uint64 { return &l.MaxWaiters }},
	{"max-total-waiters", "queued acquires on all locks together", 100_000, func(l *Limits) *uint64 { return &l.MaxTotalWaiters }},
	{"max-locks", "locks, semaphores, read-write locks and elections in use (with a holder, a waiter or a lock-delay)", 1_000_000, func(l *Limits) *uint64 { return &l.MaxLocks }},
	{"max-registers", "fenced registers", 100_000, func(l *Limits) *uint64 { return &l.MaxRegisters }},
	{"max-register-bytes", "bytes of all fenced registers' keys and values together", 256 << 20, func(l *Limits) *uint64 { return &l.MaxRegisterBytes }},
	{"max-queues", "queues holding items", 10_000, func(l *Limits) *uint64 { return &l.MaxQueues }},
	{"max-queue-length", "items one queue stores (ready, in flight and dead)", 2_000_000, func(l *Limits) *uint64 { return &l.MaxQueueLength }},
	{"max-keys", "keys of the key-value store", 1_000_000, func(l *Limits) *uint64 { return &l.MaxKeys }},
	{"max-kv-bytes", "bytes of all keys and values of the key-value store together", 1 << 30, func(l *Limits) *uint64 { return &l.MaxKVBytes }},
	{"max-etcd-leases", "live leases of the etcd API (apart from --max-sessions, which counts Tenure's own sessions)", 10_000, func(l *Limits) *uint64 { return &l.MaxEtcdLeases }},
	{"max-kv-history-revisions", "revisions the etcd API's history of past key versions spans (older ones are compacted as keys change)", 100_000, func(l *Limits) *uint64 { return &l.MaxKVHistoryRevisions }},
	{"max-kv-history-bytes", "bytes the etcd API's history of past key versions holds (the oldest revisions are compacted past it)", 128 << 20, func(l *Limits) *uint64 { return &l.MaxKVHistoryBytes }},
}

// DefaultLimits are the limits of a new state.
func DefaultLimits() Limits {
	var l Limits
	for _, spec := range LimitSpecs {
		*spec.Field(&l) = spec.Default
	}
	return l
}

// LimitsToProto converts l for the log or a snapshot.
func LimitsToProto(l Limits) *fsmpb.Limits {
	p := &fsmpb.Limits{}
	LimitsToMessage(l, p)
	return p
}

// LimitsFromProto converts p; absent fields are 0.
func LimitsFromProto(p *fsmpb.Limits) Limits { return LimitsFromMessage(p) }

// LimitsToMessage sets the fields of m named after each limit's JSON name
// (max_sessions, ...): fsmpb.Limits and the API's ClusterLimits have the
// same field names, so one table converts both.
func LimitsToMessage(l Limits, m proto.Message) {
	r := m.ProtoReflect()
	for _, spec := range LimitSpecs {
		r.Set(limitField(r, spec), protoreflect.ValueOfUint64(*spec.Field(&l)))
	}
}

// LimitsFromMessage reads a message written by LimitsToMessage; a nil
// message gives zero limits.
func LimitsFromMessage(m proto.Message) Limits {
	var l Limits
	r := m.ProtoReflect()
	if !r.IsValid() {
		return l
	}
	for _, spec := range LimitSpecs {
		*spec.Field(&l) = r.Get(limitField(r, spec)).Uint()
	}
	return l
}

func limitField(r protoreflect.Message, spec LimitSpec) protoreflect.FieldDescriptor {
	fd := r.Descriptor().Fields().ByName(protoreflect.Name(spec.JSON()))
	if fd == nil || fd.Kind() != protoreflect.Uint64Kind {
		panic(fmt.Sprintf("fsm: %s has no uint64 field %s", r.Descriptor().FullName(), spec.JSON()))
	}
	return fd
}

// Merge returns l with every non-zero field of change applied.
func (l Limits) Merge(change Limits) Limits {
	for _, spec := range LimitSpecs {
		if v := *spec.Field(&change); v != 0 {
			*spec.Field(&l) = v
		}
	}
	return l
}

// IsZero reports whether no field is set.
func (l Limits) IsZero() bool { return l == Limits{} }

// Limits returns the state's replicated admission limits.
func (s *State) Limits() Limits { return s.limits }

func (s *State) setLimits(c *fsmpb.SetLimits) Result {
	s.bump()
	change := LimitsFromProto(c.GetLimits())
	if !s.at(2) {
		change.MaxEtcdLeases = 0 // came with version 2 (version.go): ignored, as older members do
	}
	if !s.at(historyVersion) {
		change.MaxKVHistoryRevisions, change.MaxKVHistoryBytes = 0, 0
	}
	s.limits = s.limits.Merge(change)
	return Result{}
}

// overLimit returns the ErrLimit of the limit called name (value limit)
// when the state's have plus the command's add would pass it, or nil.
// what says what is counted ("sessions").
func overLimit(name string, limit uint64, what string, have, add uint64) error {
	if have+add <= limit {
		return nil
	}
	return fmt.Errorf("%w: %s: %d, the limit is %d (raise it with `tenure limits set --%s N`, or `tenure serve --%s N`)", ErrLimit, what, have, limit, name, name)
}
