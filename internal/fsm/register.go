package fsm

import (
	"fmt"

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
}

func (s *State) fencedPut(c *fsmpb.FencedPut) Result {
	if r, stale := s.belowFenceFloor(c.GetKey(), c.GetToken()); stale {
		return r
	}
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
