package fsm

import (
	"errors"
	"fmt"
	"sort"
	"unicode/utf8"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Limits the state machine enforces on every command. They are part of the
// replicated contract: changing them changes how the log is interpreted, so
// they are constants, not configuration.
const (
	MinSessionTTLMs = 1_000     // 1 s
	MaxSessionTTLMs = 3_600_000 // 1 h
	MaxNameLen      = 512       // lock names and register keys, bytes
	MaxOwnerLen     = 256       // bytes
	MaxValueLen     = 64 << 10  // fenced register values and proclaimed values, bytes
	MaxOpIDLen      = 256       // bytes
	MaxLockDelayMs  = 60_000    // 1 min, as Chubby's upper bound
	MaxPermits      = 10_000    // permits of one semaphore
	// HistoryLimit is how many grant records each lock keeps by default
	// (SetRetention changes it, up to MaxHistoryLimit).
	HistoryLimit    = 32
	MaxHistoryLimit = 10_000
	// OpMemory is how many recent operation ids each fenced register
	// remembers by default; a replay of an id older than that is applied as
	// new. SetRetention changes it, up to MaxOpMemory.
	OpMemory    = 128
	MaxOpMemory = 100_000
)

// Sentinel errors returned in Result.Err. The RPC layer maps each to one
// gRPC code in one place.
var (
	// ErrInvalid: the command's arguments are out of range.
	ErrInvalid = errors.New("tenure: invalid argument")
	// ErrSessionNotFound: the session was closed or has expired.
	ErrSessionNotFound = errors.New("tenure: session expired or not found")
	// ErrBusy: a try-once acquire found the lock held.
	ErrBusy = errors.New("tenure: lock is held")
	// ErrNotHeld: the handle (session, token) is not the lock's current holder.
	ErrNotHeld = errors.New("tenure: lock not held by this handle")
	// ErrAlreadyHeld: the session already holds or waits for this lock.
	ErrAlreadyHeld = errors.New("tenure: session already holds or waits for this lock")
)

// PutOutcome is what a FencedPut did.
type PutOutcome uint32

// The values of PutOutcome; they match the API's PutResult numbers.
const (
	PutAccepted PutOutcome = 1
	PutStale    PutOutcome = 2
)

// Result is what applying one command returns to the proposer.
type Result struct {
	Err      error
	Revision uint64 // the state's revision after the command

	Session uint64 // CreateSession: the new session's id

	// Acquire: either Granted with Token, or Queued at Position.
	Granted         bool
	Token           uint64
	Queued          bool
	Position        uint32
	AcquireRevision uint64

	// FencedPut
	Put           PutOutcome
	Duplicate     bool
	AcceptedToken uint64

	// Batch: one result per command, in order.
	Batch []Result

	// KV: the result of a key-value command (kv.go).
	KV *KVResult
	// Queue: the result of a queue command (see queue.go).
	Queue *QueueResult
}

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds.
const (
	// EventGranted: a queued acquisition (Session, Name, AcquireRevision) was
	// granted with Token by someone else's command.
	EventGranted EventKind = iota + 1
	// EventWaitEnded: a queued acquisition was removed without a grant
	// because its session ended.
	EventWaitEnded
	// EventSessionCreated: Session with TTLMs now exists.
	EventSessionCreated
	// EventSessionEnded: Session ended; Expired says whether by expiry.
	EventSessionEnded
	// EventDelayStarted: lock Name is held back for DelayMs; the leader
	// proposes EndLockDelay(Name, Generation) when it has passed.
	EventDelayStarted
	// EventHolderChanged: lock Name's first holder (an election's leader)
	// or its value changed; Session/Owner/Token/Value describe the new
	// first holder (Session 0: none), Revision orders the changes.
	EventHolderChanged
)

// Event is a side effect of Apply that waiting clients or the leader's
// timers must learn about. Events are derived from the log alone, so every
// replica emits the same ones.
type Event struct {
	Kind            EventKind
	Session         uint64
	Name            string
	Token           uint64
	AcquireRevision uint64
	TTLMs           int64
	DelayMs         int64
	Generation      uint64
	Expired         bool
	Owner           string
	Value           []byte
	Revision        uint64
	// KV: the key of EventKVPut / EventKVDelete (kv.go).
	KV *KV
	// Queue: the details of a queue event (see queue.go).
	Queue *QueueEvent
}

type session struct {
	id    uint64
	owner string
	ttlMs int64
	held  map[string]struct{}
	waits map[string]*waiter
}

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
	name       string
	permits    int      // 1 for a mutex
	holders    []*grant // in grant order: at most permits, or any number of readers
	nshared    int      // holders that are readers
	election   bool     // report holder changes (EventHolderChanged)
	head, tail *waiter
	nwait      int
	delayed    bool
	delayGen   uint64
	delayMs    int64
	history    []histRec
}

type opRec struct {
	id     string
	result PutOutcome
	token  uint64
}

type register struct {
	value  []byte
	token  uint64
	modRev uint64
	ops    []opRec // ring of at most OpMemory; ops[oldest] is the oldest once full
	oldest int
	opIdx  map[string]int // operation id -> slot in ops
}

// State is the pure, deterministic lock authority: sessions, locks with FIFO
// waiters, and fenced registers. It is not safe for concurrent use; FSM
// serialises access to it.
type State struct {
	// UnsafeSkipFenceCheck makes fenced registers accept every token. It
	// exists only so that the fault-injection suite can prove its checker
	// catches stale writes; never set it in production.
	UnsafeSkipFenceCheck bool

	revision     uint64
	historyLimit int // grant records kept per lock
	opMemory     int // operation ids remembered per fenced register
	sessions     map[uint64]*session
	locks        map[string]*lock
	registers    map[string]*register
	kv           kvStore
	queues       queueSet // see queue.go
}

// NewState returns an empty state at revision 0.
func NewState() *State {
	return &State{
		historyLimit: HistoryLimit,
		opMemory:     OpMemory,
		sessions:     make(map[uint64]*session),
		locks:        make(map[string]*lock),
		registers:    make(map[string]*register),
		kv:           newKVStore(),
	}
}

// Revision is the number of state changes applied so far.
func (s *State) Revision() uint64 { return s.revision }

func (s *State) bump() uint64 {
	s.revision++
	return s.revision
}

// EventSink receives the events of Apply, in order. It may be nil.
type EventSink func(Event)

// Apply executes one command. It reads nothing but the state and the
// command, so every replica that applies the same log reaches the same state.
func (s *State) Apply(cmd *fsmpb.Command, emit EventSink) Result {
	if emit == nil {
		emit = func(Event) {}
	}
	var r Result
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_CreateSession:
		r = s.createSession(op.CreateSession, emit)
	case *fsmpb.Command_CloseSession:
		r = s.endSession(op.CloseSession.GetSession(), false, emit)
	case *fsmpb.Command_ExpireSession:
		r = s.endSession(op.ExpireSession.GetSession(), true, emit)
	case *fsmpb.Command_Acquire:
		r = s.acquire(op.Acquire, emit)
	case *fsmpb.Command_CancelAcquire:
		r = s.cancelAcquire(op.CancelAcquire, emit)
	case *fsmpb.Command_Release:
		r = s.release(op.Release, emit)
	case *fsmpb.Command_EndLockDelay:
		r = s.endLockDelay(op.EndLockDelay, emit)
	case *fsmpb.Command_FencedPut:
		r = s.fencedPut(op.FencedPut)
	case *fsmpb.Command_Proclaim:
		r = s.proclaim(op.Proclaim, emit)
	case *fsmpb.Command_SetRetention:
		r = s.setRetention(op.SetRetention)
	case *fsmpb.Command_KvPut:
		r = s.kvApplyPut(op.KvPut, emit)
	case *fsmpb.Command_KvDelete:
		r = s.kvApplyDelete(op.KvDelete, emit)
	case *fsmpb.Command_KvTxn:
		r = s.kvApplyTxn(op.KvTxn, emit)
	case *fsmpb.Command_Batch:
		r.Batch = make([]Result, len(op.Batch.GetCommands()))
		for i, c := range op.Batch.GetCommands() {
			if _, nested := c.GetOp().(*fsmpb.Command_Batch); nested {
				r.Batch[i] = Result{Err: fmt.Errorf("%w: nested batch", ErrInvalid), Revision: s.revision}
				continue
			}
			r.Batch[i] = s.Apply(c, emit)
		}
	default:
		var ok bool
		if r, ok = s.applyQueue(cmd, emit); !ok {
			r.Err = fmt.Errorf("%w: unknown command", ErrInvalid)
		}
	}
	r.Revision = s.revision
	return r
}

// ValidateName checks a lock name or register key.
func ValidateName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s must not be empty", ErrInvalid, kind)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrInvalid, kind, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, kind)
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
	if err := ValidateSession(c.GetOwner(), c.GetTtlMs()); err != nil {
		return Result{Err: err}
	}
	id := s.bump()
	s.sessions[id] = &session{
		id: id, owner: c.GetOwner(), ttlMs: c.GetTtlMs(),
		held: make(map[string]struct{}), waits: make(map[string]*waiter),
	}
	emit(Event{Kind: EventSessionCreated, Session: id, TTLMs: c.GetTtlMs()})
	return Result{Session: id}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
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
	delete(s.sessions, id)
	emit(Event{Kind: EventSessionEnded, Session: id, Expired: expired})
	return Result{}
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
	if l == nil {
		l = &lock{name: name, permits: permits}
		s.locks[name] = l
	}
	if c.GetElection() {
		l.election = true
	}
	if l.permits != permits {
		kind := "semaphore"
		if l.permits == 1 {
			kind = "mutex"
		}
		return Result{Err: fmt.Errorf("%w: %q is a %s with %d permit(s); this acquire asks for %d", ErrInvalid, name, kind, l.permits, permits)}
	}
	if l.head == nil && l.admits(c.GetShared()) {
		rev := s.bump()
		g := s.grant(l, sess, rev, c.GetLockDelayMs(), c.GetShared())
		g.value = append([]byte(nil), c.GetValue()...)
		s.holderChanged(l, emit)
		return Result{Granted: true, Token: rev, AcquireRevision: rev}
	}
	if !c.GetWait() {
		return Result{Err: ErrBusy}
	}
	rev := s.bump()
	w := &waiter{sess: sess, acqRev: rev, delayMs: c.GetLockDelayMs(), shared: c.GetShared(), value: append([]byte(nil), c.GetValue()...)}
	l.push(w)
	sess.waits[name] = w
	return Result{Queued: true, Position: uint32(l.nwait), AcquireRevision: rev}
}

// grant makes sess a holder of l with token = the current revision.
func (s *State) grant(l *lock, sess *session, acqRev uint64, delayMs int64, shared bool) *grant {
	token := s.revision
	g := &grant{sess: sess, token: token, acqRev: acqRev, delayMs: delayMs, shared: shared}
	l.holders = append(l.holders, g)
	if shared {
		l.nshared++
	}
	sess.held[l.name] = struct{}{}
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
	delete(g.sess.held, l.name)
	for i, h := range l.holders {
		if h == g {
			l.holders = append(l.holders[:i], l.holders[i+1:]...)
			if g.shared {
				l.nshared--
			}
			break
		}
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
		l.unlink(w)
		delete(w.sess.waits, l.name)
		s.bump()
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
		s.locks[name].unlink(w)
		delete(sess.waits, name)
		return Result{}
	}
	if l := s.locks[name]; l != nil {
		if g := l.holderOf(sess); g != nil && g.acqRev == c.GetAcquireRevision() {
			s.bump()
			s.endGrant(l, g, "released", emit)
			s.handOff(l, emit)
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
	s.handOff(l, emit)
	return Result{}
}

func (s *State) fencedPut(c *fsmpb.FencedPut) Result {
	if err := ValidateName("register key", c.GetKey()); err != nil {
		return Result{Err: err}
	}
	if c.GetToken() == 0 {
		return Result{Err: fmt.Errorf("%w: fence token must be positive", ErrInvalid)}
	}
	if len(c.GetValue()) > MaxValueLen {
		return Result{Err: fmt.Errorf("%w: value is %d bytes, the limit is %d", ErrInvalid, len(c.GetValue()), MaxValueLen)}
	}
	if len(c.GetOperationId()) > MaxOpIDLen {
		return Result{Err: fmt.Errorf("%w: operation id is %d bytes, the limit is %d", ErrInvalid, len(c.GetOperationId()), MaxOpIDLen)}
	}
	reg := s.registers[c.GetKey()]
	if reg == nil {
		reg = &register{opIdx: make(map[string]int)}
		s.registers[c.GetKey()] = reg
	}
	opID := c.GetOperationId()
	if opID != "" {
		if i, seen := reg.opIdx[opID]; seen {
			return Result{Put: reg.ops[i].result, Duplicate: true, AcceptedToken: reg.token}
		}
	}
	out := PutStale
	if c.GetToken() >= reg.token || s.UnsafeSkipFenceCheck {
		out = PutAccepted
		reg.modRev = s.bump()
		reg.value = append([]byte(nil), c.GetValue()...)
		reg.token = c.GetToken()
	}
	if opID != "" {
		if out == PutStale {
			s.bump()
		}
		reg.remember(opRec{id: opID, result: out, token: c.GetToken()}, s.opMemory)
	}
	return Result{Put: out, AcceptedToken: reg.token}
}

// remember records op in a ring of capacity slots, evicting the oldest.
// The ring is full or linear (oldest 0): retain keeps it so when the
// capacity changes.
func (r *register) remember(op opRec, capacity int) {
	if len(r.ops) < capacity {
		r.opIdx[op.id] = len(r.ops)
		r.ops = append(r.ops, op)
		return
	}
	delete(r.opIdx, r.ops[r.oldest].id)
	r.ops[r.oldest] = op
	r.opIdx[op.id] = r.oldest
	r.oldest = (r.oldest + 1) % len(r.ops)
}

// retain rewrites the ring linearly with at most the newest capacity ops.
func (r *register) retain(capacity int) {
	ops := r.opsInOrder()
	if len(ops) > capacity {
		ops = ops[len(ops)-capacity:]
	}
	r.ops, r.oldest = ops, 0
	clear(r.opIdx)
	for i, op := range ops {
		r.opIdx[op.id] = i
	}
}

// ValidateRetention checks the arguments of SetRetention (0 = unchanged).
func ValidateRetention(lockHistory, opMemory int) error {
	if lockHistory < 0 || lockHistory > MaxHistoryLimit {
		return fmt.Errorf("%w: lock history %d is outside 1..%d", ErrInvalid, lockHistory, MaxHistoryLimit)
	}
	if opMemory < 0 || opMemory > MaxOpMemory {
		return fmt.Errorf("%w: register operation memory %d is outside 1..%d", ErrInvalid, opMemory, MaxOpMemory)
	}
	return nil
}

// Retention is how much history the state keeps: grant records per lock
// and operation ids per fenced register.
func (s *State) Retention() (lockHistory, opMemory int) { return s.historyLimit, s.opMemory }

func (s *State) setRetention(c *fsmpb.SetRetention) Result {
	h, m := int(c.GetLockHistory()), int(c.GetRegisterOpMemory())
	if err := ValidateRetention(h, m); err != nil {
		return Result{Err: err}
	}
	s.bump()
	if h > 0 && h != s.historyLimit {
		s.historyLimit = h
		for _, name := range sortedKeys(s.locks) {
			l := s.locks[name]
			if len(l.history) > h {
				l.history = append(l.history[:0], l.history[len(l.history)-h:]...)
			}
		}
	}
	if m > 0 && m != s.opMemory {
		s.opMemory = m
		for _, key := range sortedKeys(s.registers) {
			s.registers[key].retain(m)
		}
	}
	return Result{}
}

// opsInOrder returns the remembered operations, oldest first.
func (r *register) opsInOrder() []opRec {
	return append(append([]opRec(nil), r.ops[r.oldest:]...), r.ops[:r.oldest]...)
}

func (l *lock) push(w *waiter) {
	w.prev = l.tail
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.nwait++
}

func (l *lock) unlink(w *waiter) {
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
