package fsm

import (
	"fmt"
	"maps"
	"slices"

	"github.com/google/btree"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// exportCoreSorted is exportCore as it was before it walked the ordered
// indexes: it sorts the keys of the session, lock and register maps, all
// under the state lock. It is kept as the reference that the snapshot
// bytes must match (TestSnapshotBytesMatchSortedExport) and as the
// "before" of BenchmarkSnapshotStall.
func (s *State) exportCoreSorted() *fsmpb.Snapshot {
	snap := &fsmpb.Snapshot{Revision: s.revision, FenceFloor: s.fenceFloor, Retention: &fsmpb.Retention{LockHistory: uint32(s.historyLimit), RegisterOpMemory: uint32(s.opMemory)}, Limits: LimitsToProto(s.limits)}
	for _, id := range slices.Sorted(maps.Keys(s.sessions)) {
		ss := s.sessions[id]
		snap.Sessions = append(snap.Sessions, &fsmpb.SessionState{Id: id, Owner: ss.owner, TtlMs: ss.ttlMs, SecretHash: ss.secretHashBytes(), Identity: ss.identity, EtcdLease: ss.etcdLease})
	}
	for _, name := range slices.Sorted(maps.Keys(s.locks)) {
		l := s.locks[name]
		ls := &fsmpb.LockState{Name: name, Delayed: l.delayed, DelayGeneration: l.delayGen, DelayMs: l.delayMs, Permits: uint32(l.permits), Election: l.election}
		for _, g := range l.holders {
			ls.Holders = append(ls.Holders, &fsmpb.GrantState{Session: g.sess.id, Owner: g.sess.owner, Token: g.token, AcquireRevision: g.acqRev, LockDelayMs: g.delayMs, Shared: g.shared, Value: g.value})
		}
		for w := l.head; w != nil; w = w.next {
			ls.Waiters = append(ls.Waiters, &fsmpb.WaiterState{Session: w.sess.id, AcquireRevision: w.acqRev, LockDelayMs: w.delayMs, Shared: w.shared, Value: w.value})
		}
		for _, h := range l.history {
			ls.History = append(ls.History, histToProto("", h))
		}
		snap.Locks = append(snap.Locks, ls)
	}
	s.past.each(func(r pastRec) {
		snap.RemovedLockHistory = append(snap.RemovedLockHistory, histToProto(r.name, r.histRec))
	})
	for _, key := range slices.Sorted(maps.Keys(s.registers)) {
		r := s.registers[key]
		rs := &fsmpb.RegisterState{Key: key, Value: r.value, Token: r.token, ModRevision: r.modRev, Lock: r.lock}
		for _, op := range r.opsInOrder() {
			rs.Ops = append(rs.Ops, &fsmpb.OpRecord{OperationId: op.id, Result: uint32(op.result), Token: op.token})
		}
		snap.Registers = append(snap.Registers, rs)
	}
	s.deleted.each(func(key string, token uint64, lock string) {
		snap.DeletedRegisters = append(snap.DeletedRegisters, &fsmpb.DeletedRegister{Key: key, Token: token, Lock: lock})
	})
	snap.RegisterFloor = s.deleted.floor
	snap.Security = exportSecurity(s.sec)
	snap.EtcdUrls = exportEtcdURLs(s.etcdURLs)
	snap.ClientAddrs = exportEtcdURLs(s.clientAddrs)
	return snap
}

// ExportSorted is State.Export with exportCoreSorted.
func (s *State) ExportSorted() *fsmpb.Snapshot {
	snap := s.exportCoreSorted()
	exportKV(snap, s.kv.tree)
	exportQueues(snap, s.CloneQueues())
	return snap
}

// SnapshotSorted is FSM.Snapshot as it was before coreCopy: the whole
// message but the key-value store and the queues is built, sorting, under
// the state lock.
func (f *FSM) SnapshotSorted() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	if f.fatal != nil {
		err := f.fatal
		f.mu.Unlock()
		return nil, fmt.Errorf("fsm: no snapshot of a stopped state machine: %w", err)
	}
	snap := f.state.exportCoreSorted()
	kv := f.state.kv.tree.Clone()
	queues := f.state.CloneQueues()
	f.mu.Unlock()
	return &sortedSnapshot{snap: snap, kv: kv, queues: queues}, nil
}

type sortedSnapshot struct {
	snap   *fsmpb.Snapshot
	kv     *btree.BTreeG[KV]
	queues QueueSnapshot
}

func (s *sortedSnapshot) Persist(sink raft.SnapshotSink) error {
	exportKV(s.snap, s.kv)
	s.snap.Queues = s.queues.Export()
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.snap)
	if err == nil {
		_, err = sink.Write(data)
	}
	if err == nil {
		err = s.queues.WriteItems(sink)
	}
	if err != nil {
		sink.Cancel()
		return fmt.Errorf("fsm: writing snapshot: %w", err)
	}
	return sink.Close()
}

func (s *sortedSnapshot) Release() {}
