package fsm

import (
	"cmp"
	"fmt"
	"sort"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

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
	// lock is the lock the register is bound to ("" none): set by its
	// first accepted write that names a lock, kept across a delete
	// (deletedRegs), and checked on every later write (checkFenced).
	lock string
}

// UnissuedTokenError is the ErrInvalid of a fenced write whose token is
// above the state's revision. A token is the revision at its grant, so no
// grant can have carried it; the write is refused and changes nothing.
type UnissuedTokenError struct {
	Token    uint64
	Revision uint64 // the state's revision when the write was refused
}

func (e *UnissuedTokenError) Error() string {
	return fmt.Sprintf("%v: token %d was never issued (the current revision is %d)", ErrInvalid, e.Token, e.Revision)
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *UnissuedTokenError) Unwrap() error { return ErrInvalid }

// WrongLockError is the ErrInvalid of a fenced write that names a lock
// other than the one its register is bound to. The resource, not the
// sender, decides which lock a token is checked against: a register is
// bound to the lock named by its first accepted write that names one, and
// a write naming another lock is refused and changes nothing, whatever
// its token.
type WrongLockError struct {
	Key      string
	Bound    string // the register's lock
	Lock     string // the lock the write named
	Token    uint64 // the write's token
	Revision uint64 // the state's revision when the write was refused
}

func (e *WrongLockError) Error() string {
	return fmt.Sprintf("%v: register %q is bound to lock %q and takes its tokens only, not lock %q's", ErrInvalid, e.Key, e.Bound, e.Lock)
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *WrongLockError) Unwrap() error { return ErrInvalid }

// fencedWrite is what a fenced put and a fenced delete have in common.
type fencedWrite struct {
	key   string
	token uint64
	lock  string // if set, token must be a current grant of this lock
	opID  string
	// bind is the lock the key's register is bound to after the write, if
	// it is accepted: its binding, or else the lock the write names
	// (checkFenced sets it).
	bind string
}

// checkFenced makes every check a fenced write (put or delete) goes
// through before it may change anything, in this order: its arguments,
// that its token was issued, a replayed operation id, the lock the key is
// bound to (a write naming another is invalid), then the fence (the fence
// floor a restore set, the register's token or its deleted key's, and the
// grant of the key's lock: the one it is bound to, or else the one the
// write names). It sets w.bind and returns the key's register (nil: none)
// and either the final result (done: an error or a duplicate, and nothing
// may change) or the outcome the write has: PutAccepted or PutStale.
func (s *State) checkFenced(w *fencedWrite) (reg *register, out PutOutcome, final Result, done bool) {
	if err := ValidateName("register key", w.key); err != nil {
		return nil, 0, Result{Err: err}, true
	}
	if w.token == 0 {
		return nil, 0, Result{Err: fmt.Errorf("%w: fence token must be positive", ErrInvalid)}, true
	}
	if len(w.opID) > MaxOpIDLen {
		return nil, 0, Result{Err: fmt.Errorf("%w: operation id is %d bytes, the limit is %d", ErrInvalid, len(w.opID), MaxOpIDLen)}, true
	}
	if w.lock != "" {
		if err := ValidateName("lock name", w.lock); err != nil {
			return nil, 0, Result{Err: err}, true
		}
	}
	if w.token > s.revision {
		return nil, 0, Result{Err: &UnissuedTokenError{Token: w.token, Revision: s.revision}}, true
	}
	reg = s.registers[w.key]
	if reg != nil && w.opID != "" {
		if i, seen := reg.opIdx[w.opID]; seen {
			return reg, 0, Result{Put: reg.ops[i].result, Duplicate: true, AcceptedToken: reg.token}, true
		}
	}
	// Registers are bound to a lock from version 2 on (version.go): before,
	// the token is checked against the lock the write names, and a binding
	// is kept as it is, neither checked nor made.
	check, bound := w.lock, s.boundLock(w.key, reg)
	w.bind = bound
	if s.at(2) {
		if bound != "" && w.lock != "" && w.lock != bound {
			return reg, 0, Result{Err: &WrongLockError{Key: w.key, Bound: bound, Lock: w.lock, Token: w.token, Revision: s.revision}}, true
		}
		w.bind = cmp.Or(bound, w.lock)
		check = w.bind
	}
	pass := w.token > s.fenceFloor && w.token >= s.fenceOf(w.key, reg) && (check == "" || s.isGrant(check, w.token))
	if pass || s.faults.skipFenceCheck() {
		return reg, PutAccepted, Result{}, false
	}
	return reg, PutStale, Result{}, false
}

// fenceOf is the token a write to key must reach: its register's accepted
// token, or for a key without one its remembered delete's and the floor.
func (s *State) fenceOf(key string, reg *register) uint64 {
	if reg != nil {
		return reg.token
	}
	return s.deleted.fence(key)
}

// boundLock is the lock key is bound to: its register's, or for a key
// without one its remembered delete's ("" none).
func (s *State) boundLock(key string, reg *register) string {
	if reg != nil {
		return reg.lock
	}
	return s.deleted.lockOf(key)
}

// isGrant reports whether token is a current grant of lock name (any of
// its holders). Holders are in grant order, so their tokens increase.
func (s *State) isGrant(name string, token uint64) bool {
	l := s.locks[name]
	if l == nil {
		return false
	}
	i := sort.Search(len(l.holders), func(i int) bool { return l.holders[i].token >= token })
	return i < len(l.holders) && l.holders[i].token == token
}

// staleFenced answers a stale fenced write. It changes nothing, except
// that an operation id on an existing register is remembered with its
// outcome, so that its replay answers stale too.
func (s *State) staleFenced(w fencedWrite, reg *register) Result {
	if reg != nil && w.opID != "" {
		s.bump()
		reg.remember(opRec{id: w.opID, result: PutStale, token: w.token}, s.opMemory)
	}
	return Result{Put: PutStale, AcceptedToken: s.fenceOf(w.key, reg)}
}

func (s *State) fencedPut(c *fsmpb.FencedPut) Result {
	if len(c.GetValue()) > MaxValueLen {
		return Result{Err: fmt.Errorf("%w: value is %d bytes, the limit is %d", ErrInvalid, len(c.GetValue()), MaxValueLen)}
	}
	w := fencedWrite{key: c.GetKey(), token: c.GetToken(), lock: c.GetLock(), opID: c.GetOperationId()}
	reg, out, final, done := s.checkFenced(&w)
	if done {
		return final
	}
	if out == PutStale {
		return s.staleFenced(w, reg)
	}
	if err := s.admitRegisterWrite(reg, w.key, len(c.GetValue())); err != nil {
		return Result{Err: err}
	}
	if reg == nil {
		reg = &register{opIdx: make(map[string]int)}
		s.addRegister(w.key, reg)
		s.registerBytes += uint64(len(w.key))
		s.deleted.forget(w.key) // the register's token now fences the key
	}
	reg.modRev = s.bump()
	s.registerBytes += uint64(len(c.GetValue()))
	s.registerBytes -= uint64(len(reg.value))
	reg.value = append([]byte(nil), c.GetValue()...)
	reg.token = w.token
	reg.lock = w.bind
	if w.opID != "" {
		reg.remember(opRec{id: w.opID, result: PutAccepted, token: w.token}, s.opMemory)
	}
	return Result{Put: PutAccepted, AcceptedToken: reg.token}
}

// fencedDelete removes a register with the checks of a fenced put. The
// key's token and lock are remembered (deletedRegs), so that a later write
// needs at least the delete's token and is checked against the same lock;
// the register's operation ids go with it.
func (s *State) fencedDelete(c *fsmpb.FencedDelete) Result {
	w := fencedWrite{key: c.GetKey(), token: c.GetToken(), lock: c.GetLock(), opID: c.GetOperationId()}
	reg, out, final, done := s.checkFenced(&w)
	if done {
		return final
	}
	if out == PutStale {
		return s.staleFenced(w, reg)
	}
	s.bump()
	token := w.token
	if reg != nil {
		token = max(token, reg.token) // w.token is at least reg.token, unless the fence check is off
		s.registerBytes -= uint64(len(w.key) + len(reg.value))
		s.removeRegister(w.key)
	}
	s.deleted.record(w.key, token, w.bind)
	return Result{Put: PutAccepted, AcceptedToken: s.deleted.fence(w.key)}
}

// admitRegisterWrite applies max-registers and max-register-bytes to an
// accepted write of n value bytes to reg (nil: a new register at key).
func (s *State) admitRegisterWrite(reg *register, key string, n int) error {
	add := uint64(n)
	if reg == nil {
		if err := overLimit("max-registers", s.limits.MaxRegisters, "fenced registers", uint64(len(s.registers)), 1); err != nil {
			return err
		}
		add += uint64(len(key))
	} else if n <= len(reg.value) {
		return nil // a write that does not grow is always admitted
	} else {
		add -= uint64(len(reg.value))
	}
	return overLimit("max-register-bytes", s.limits.MaxRegisterBytes, "bytes in fenced registers", s.registerBytes, add)
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
		s.lockOrder.Ascend(func(l *lock) bool {
			if len(l.history) > h {
				l.history = append(l.history[:0], l.history[len(l.history)-h:]...)
			}
			return true
		})
	}
	if m > 0 && m != s.opMemory {
		s.opMemory = m
		s.registerOrder.Ascend(func(key string) bool {
			s.registers[key].retain(m)
			return true
		})
	}
	return Result{}
}

// opsInOrder returns the remembered operations, oldest first.
func (r *register) opsInOrder() []opRec {
	return append(append([]opRec(nil), r.ops[r.oldest:]...), r.ops[:r.oldest]...)
}
