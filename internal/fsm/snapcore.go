package fsm

import (
	"github.com/google/btree"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// coreCopy is what a snapshot takes of the state besides the key-value
// store and the queues (which are cloned copy-on-write): enough to build
// the snapshot's message after the state lock is released, while Apply
// goes on. FSM.Snapshot runs on raft's apply goroutine, so every apply
// waits for as long as it takes the copy; what the copy costs is kept to:
//
//   - sessions: O(1), a copy-on-write clone of the ordered index. The
//     fields a snapshot writes of a session (id, owner, TTL, secret hash,
//     identity, etcd lease) never change once it is created, so reading
//     them later races with nothing; a TTL that SetSessionTTL changed is
//     kept by value in an index of its own, cloned the same way, and
//     written as the session's TTL.
//   - locks and registers: one walk of their ordered indexes (index.go),
//     copying what a later Apply may change in place (holders, waiters,
//     grant records, remembered operations) by value into a few flat
//     slices, with no sort and no allocation per lock or register. Values
//     ([]byte) are shared, not copied: Apply replaces them, never writes
//     into them.
//   - the rest (grant records of removed locks, remembered deletes,
//     security, etcd URLs) is bounded by constants and built as is.
//
// The message that export builds is the same, list for list, as sorting
// the maps' keys would give: the indexes are ordered by the same keys.
type coreCopy struct {
	snap     *fsmpb.Snapshot // every field but sessions, locks and registers
	sessions *btree.BTreeG[*session]
	ttls     *btree.BTreeG[sessionTTL] // the TTLs SetSessionTTL changed

	locks   []lockCopy
	holders []grant   // of every lock, lock by lock, in grant order
	waiters []waiter  // of every lock, lock by lock, oldest first (prev and next unset)
	history []histRec // of every lock, lock by lock, oldest first

	registers []registerCopy
	ops       []opRec // of every register, register by register, oldest first
}

// lockCopy is a lock as a snapshot writes it; its holders, waiters and
// grant records are the next nholders, nwaiters and nhistory entries of
// coreCopy's slices.
type lockCopy struct {
	name                         string
	delayed                      bool
	delayGen                     uint64
	delayMs                      int64
	permits                      int
	election                     bool
	nholders, nwaiters, nhistory int
}

// registerCopy is a register as a snapshot writes it; its remembered
// operations are the next nops entries of coreCopy.ops.
type registerCopy struct {
	key    string
	value  []byte
	token  uint64
	modRev uint64
	lock   string
	nops   int
}

// copyCore takes a coreCopy. The caller holds the state lock for writing
// (cloning marks the session index copy-on-write); the copy needs none.
func (s *State) copyCore() *coreCopy {
	return s.copyCoreWith(s.sessionOrder.Clone(), s.ttls.Clone())
}

// copyCoreWith is copyCore with the session indexes to export: clones of
// s.sessionOrder and s.ttls, or the indexes themselves if the copy is
// exported before the state changes (exportCore).
func (s *State) copyCoreWith(sessions *btree.BTreeG[*session], ttls *btree.BTreeG[sessionTTL]) *coreCopy {
	c := &coreCopy{
		snap:      &fsmpb.Snapshot{FormatVersion: s.ClusterVersion(), ClusterVersion: s.ClusterVersion(), Revision: s.revision, FenceFloor: s.fenceFloor, Retention: &fsmpb.Retention{LockHistory: uint32(s.historyLimit), RegisterOpMemory: uint32(s.opMemory)}, Limits: LimitsToProto(s.limits)},
		sessions:  sessions,
		ttls:      ttls,
		locks:     make([]lockCopy, 0, s.lockOrder.Len()),
		holders:   make([]grant, 0, s.lockOrder.Len()),
		waiters:   make([]waiter, 0, s.waiting),
		history:   make([]histRec, 0, s.lockOrder.Len()),
		registers: make([]registerCopy, 0, s.registerOrder.Len()),
	}
	s.lockOrder.Ascend(func(l *lock) bool {
		lc := lockCopy{name: l.name, delayed: l.delayed, delayGen: l.delayGen, delayMs: l.delayMs, permits: l.permits, election: l.election, nholders: len(l.holders), nhistory: len(l.history)}
		for _, g := range l.holders {
			c.holders = append(c.holders, *g)
		}
		for w := l.head; w != nil; w = w.next {
			c.waiters = append(c.waiters, waiter{sess: w.sess, acqRev: w.acqRev, delayMs: w.delayMs, shared: w.shared, value: w.value})
			lc.nwaiters++
		}
		c.history = append(c.history, l.history...)
		c.locks = append(c.locks, lc)
		return true
	})
	s.registerOrder.Ascend(func(key string) bool {
		r := s.registers[key]
		c.registers = append(c.registers, registerCopy{key: key, value: r.value, token: r.token, modRev: r.modRev, lock: r.lock, nops: len(r.ops)})
		c.ops = append(append(c.ops, r.ops[r.oldest:]...), r.ops[:r.oldest]...)
		return true
	})
	snap := c.snap
	s.past.each(func(r pastRec) {
		snap.RemovedLockHistory = append(snap.RemovedLockHistory, histToProto(r.name, r.histRec))
	})
	s.deleted.each(func(key string, token uint64, lock string) {
		snap.DeletedRegisters = append(snap.DeletedRegisters, &fsmpb.DeletedRegister{Key: key, Token: token, Lock: lock})
	})
	snap.RegisterFloor = s.deleted.floor
	snap.Security = exportSecurity(s.sec)
	snap.EtcdUrls = exportEtcdURLs(s.etcdURLs)
	snap.ClientAddrs = exportEtcdURLs(s.clientAddrs)
	s.exportZnodes(snap)
	return c
}

// export builds the snapshot message of the copy. It needs no lock and
// may run concurrently with Apply; it is called once per copy.
func (c *coreCopy) export() *fsmpb.Snapshot {
	snap := c.snap
	if n := c.sessions.Len(); n > 0 {
		snap.Sessions = make([]*fsmpb.SessionState, 0, n)
	}
	c.sessions.Ascend(func(ss *session) bool {
		snap.Sessions = append(snap.Sessions, &fsmpb.SessionState{Id: ss.id, Owner: ss.owner, TtlMs: ttlIn(c.ttls, ss), SecretHash: ss.secretHashBytes(), Identity: ss.identity, EtcdLease: ss.etcdLease})
		return true
	})
	if len(c.locks) > 0 {
		snap.Locks = make([]*fsmpb.LockState, 0, len(c.locks))
	}
	holders, waiters, history := c.holders, c.waiters, c.history
	for _, l := range c.locks {
		ls := &fsmpb.LockState{Name: l.name, Delayed: l.delayed, DelayGeneration: l.delayGen, DelayMs: l.delayMs, Permits: uint32(l.permits), Election: l.election}
		if l.nholders > 0 {
			ls.Holders = make([]*fsmpb.GrantState, l.nholders)
			for i, g := range holders[:l.nholders] {
				ls.Holders[i] = &fsmpb.GrantState{Session: g.sess.id, Owner: g.sess.owner, Token: g.token, AcquireRevision: g.acqRev, LockDelayMs: g.delayMs, Shared: g.shared, Value: g.value}
			}
			holders = holders[l.nholders:]
		}
		if l.nwaiters > 0 {
			ls.Waiters = make([]*fsmpb.WaiterState, l.nwaiters)
			for i, w := range waiters[:l.nwaiters] {
				ls.Waiters[i] = &fsmpb.WaiterState{Session: w.sess.id, AcquireRevision: w.acqRev, LockDelayMs: w.delayMs, Shared: w.shared, Value: w.value}
			}
			waiters = waiters[l.nwaiters:]
		}
		if l.nhistory > 0 {
			ls.History = make([]*fsmpb.HistoryRecord, l.nhistory)
			for i, h := range history[:l.nhistory] {
				ls.History[i] = histToProto("", h)
			}
			history = history[l.nhistory:]
		}
		snap.Locks = append(snap.Locks, ls)
	}
	if len(c.registers) > 0 {
		snap.Registers = make([]*fsmpb.RegisterState, 0, len(c.registers))
	}
	ops := c.ops
	for _, r := range c.registers {
		rs := &fsmpb.RegisterState{Key: r.key, Value: r.value, Token: r.token, ModRevision: r.modRev, Lock: r.lock}
		if r.nops > 0 {
			rs.Ops = make([]*fsmpb.OpRecord, r.nops)
			for i, op := range ops[:r.nops] {
				rs.Ops[i] = &fsmpb.OpRecord{OperationId: op.id, Result: uint32(op.result), Token: op.token}
			}
			ops = ops[r.nops:]
		}
		snap.Registers = append(snap.Registers, rs)
	}
	return snap
}
