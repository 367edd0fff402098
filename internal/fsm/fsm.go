// Package fsm is Tenure's replicated state machine: sessions, locks with
// FIFO waiters, grant history, fenced registers and a key-value store
// (kv.go).
//
// # The raft contract
//
// hashicorp/raft calls Apply, ApplyBatch, Snapshot and Restore from one
// goroutine; FSMSnapshot.Persist runs concurrently with later Applies, so
// Snapshot copies what Persist writes. Apply is pure and deterministic: it
// reads no clock, draws no random number and does no I/O. Everything that
// depends on time (session expiry, the end of a lock-delay) arrives as a log
// entry proposed by the leader's timer loop. Every replica that applies the
// same log therefore reaches the same state and emits the same events.
//
// # Why fencing tokens only grow
//
// A token is the state's revision at the moment of the grant. The revision
// is a counter inside the replicated state: every state change increments
// it, it is part of every snapshot, and it is rebuilt on restart by
// restoring the latest snapshot and re-applying the committed log after it.
// A new leader has every committed entry (raft's leader completeness), so it
// continues from the same revision. No token is ever issued from anything
// but the applied log, so tokens are unique and strictly increasing across
// restarts and leader changes. It follows that a token above the current
// revision was never issued: a fenced write carrying one is refused
// (UnissuedTokenError) and stores nothing, so a made-up token cannot lock
// honest holders out of a register.
// A restore never lowers the revision either, and its fence floor keeps
// tokens issued before it stale (fencefloor.go).
package fsm

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/google/btree"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// FSM adapts State to raft.FSM and raft.BatchingFSM, and lets readers look
// at the state concurrently with Apply. Events are delivered to the sink
// after the state lock is released, in log order.
type FSM struct {
	sink EventSink

	// mu guards state, framed and fatal.
	mu    sync.RWMutex
	state *State
	// framed: an entry in the framed format has been applied, so a bare
	// one after it is damaged (see entry.go).
	framed bool
	// fatal is the first corrupt entry or snapshot met; from then on
	// nothing is applied, snapshotted or restored (see Err).
	fatal error

	// failed is closed when fatal is set.
	failed     chan struct{}
	failedOnce sync.Once

	// sec is the state's Security, published after every apply (it is
	// immutable), so that readers need not take mu.
	sec atomic.Pointer[Security]
	// clusterVersion is the state's cluster version, published after
	// every apply and restore for the proposal gate.
	clusterVersion atomic.Uint32

	// hintMu guards hints: commands this node proposed, by the first byte
	// of their encoding (see Hint).
	hintMu sync.Mutex
	hints  map[*byte]hint
}

type hint struct {
	n   int
	cmd *fsmpb.Command
}

// Hint tells the state machine that data encodes cmd, so that when the
// very same bytes reach Apply (as they do on the node that proposed them:
// raft hands its own entry to its state machine) Apply may use cmd instead
// of decoding data again. A hint only saves work: the result is the same
// with or without it, and every other replica decodes. cmd must not change
// afterwards. Unhint drops a hint Apply did not use.
func (f *FSM) Hint(data []byte, cmd *fsmpb.Command) {
	if len(data) == 0 {
		return
	}
	f.hintMu.Lock()
	if f.hints == nil {
		f.hints = make(map[*byte]hint)
	}
	f.hints[&data[0]] = hint{len(data), cmd}
	f.hintMu.Unlock()
}

// Unhint drops data's hint, if Apply has not used it.
func (f *FSM) Unhint(data []byte) {
	if len(data) == 0 {
		return
	}
	f.hintMu.Lock()
	delete(f.hints, &data[0])
	f.hintMu.Unlock()
}

// takeHint returns (and drops) the command hinted for data, or nil.
func (f *FSM) takeHint(data []byte) *fsmpb.Command {
	if len(data) == 0 {
		return nil
	}
	f.hintMu.Lock()
	defer f.hintMu.Unlock()
	h, ok := f.hints[&data[0]]
	if !ok || h.n != len(data) {
		return nil
	}
	delete(f.hints, &data[0])
	return h.cmd
}

// New returns an FSM with an empty state. sink receives every event of
// every applied entry, on raft's apply goroutine; it must not block.
func New(sink EventSink) *FSM {
	if sink == nil {
		sink = func(Event) {}
	}
	st := NewState()
	st.clusterVersion = 1 // until the log or a snapshot says otherwise
	f := &FSM{sink: sink, state: st, failed: make(chan struct{})}
	f.sec.Store(f.state.sec)
	f.clusterVersion.Store(1)
	return f
}

// Err returns the error that stopped the state machine: the first log
// entry that failed its checksum or did not decode, or the first snapshot
// that did not decode (both wrap ErrCorrupt). It is nil while the state
// machine runs. Once it is set, ApplyBatch applies nothing (every entry's
// Result carries the error), Snapshot and Restore fail, and the state stays
// as it was before the bad entry: the node must stop.
func (f *FSM) Err() error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.fatal
}

// Failed is closed when Err becomes non-nil.
func (f *FSM) Failed() <-chan struct{} { return f.failed }

// failLocked records err as the fatal error, unless there is one already,
// and returns the fatal error. f.mu must be held for writing.
func (f *FSM) failLocked(err error) error {
	if f.fatal == nil {
		f.fatal = err
		f.failedOnce.Do(func() { close(f.failed) })
	}
	return f.fatal
}

// Security returns the replicated ACLs and signing keys as of the last
// applied entry, without taking the state lock. It is immutable.
func (f *FSM) Security() *Security { return f.sec.Load() }

// Read runs fn with the state locked for reading. fn must not keep
// references into the state.
func (f *FSM) Read(fn func(*State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.state)
}

// Apply implements raft.FSM.
func (f *FSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch implements raft.BatchingFSM. Each entry's response is a
// *Result, which the proposer reads with TakeResult. An entry that fails
// its checksum or does not decode is not applied, and neither is anything
// after it: the state machine stops (see Err).
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	var events []Event
	emit := func(e Event) { events = append(events, e) }
	cmd := &fsmpb.Command{}
	f.mu.Lock()
	for i, l := range logs {
		var r Result
		switch {
		case f.fatal != nil:
			r = Result{Err: f.fatal, Revision: f.state.revision}
		case l.Type != raft.LogCommand:
			r = Result{Revision: f.state.revision}
		default:
			c := f.takeHint(l.Data)
			if c == nil {
				cmd.Reset()
				err := DecodeEntry(l.Data, cmd)
				if err == nil && f.framed && !Framed(l.Data) {
					err = errors.New("is not framed, yet follows framed entries (its first byte is damaged)")
				}
				var fe *FormatError
				if errors.As(err, &fe) {
					fe.Index = l.Index
					r = Result{Err: f.failLocked(fe), Revision: f.state.revision}
					break
				}
				if err != nil {
					r = Result{Err: f.failLocked(&CorruptEntryError{Index: l.Index, Reason: err.Error()}), Revision: f.state.revision}
					break
				}
				c = cmd
			}
			f.framed = f.framed || Framed(l.Data)
			r = f.state.Apply(c, emit)
			if fe := formatErrorOf(r); fe != nil {
				// A command this build does not know: never skipped.
				fe.What, fe.Index = "log entry", l.Index
				r = Result{Err: f.failLocked(fe), Revision: f.state.revision}
			}
		}
		out[i] = &r
	}
	emit(Event{Kind: EventApplied, Revision: f.state.revision})
	f.clusterVersion.Store(f.state.ClusterVersion())
	if f.state.sec != f.sec.Load() {
		f.sec.Store(f.state.sec)
	}
	f.mu.Unlock()
	for _, e := range events {
		f.sink(e)
	}
	return out
}

// formatErrorOf returns the FormatError of r or of one of its batch's
// results (nil: none).
func formatErrorOf(r Result) *FormatError {
	var fe *FormatError
	if errors.As(r.Err, &fe) {
		return fe
	}
	for _, b := range r.Batch {
		if errors.As(b.Err, &fe) {
			return fe
		}
	}
	return nil
}

// ClusterVersion is the cluster version in effect as of the last applied
// entry (version.go).
func (f *FSM) ClusterVersion() uint32 { return f.clusterVersion.Load() }

// TakeResult returns the Result of a response of Apply or ApplyBatch and
// clears it. Raft keeps each entry's future, response included, for as
// long as the entry is in its log cache; clearing the response keeps
// what that pins small (a batch's results can be large).
func TakeResult(resp interface{}) Result {
	p, ok := resp.(*Result)
	if !ok || p == nil {
		return Result{Err: fmt.Errorf("fsm: unexpected response %T", resp)}
	}
	r := *p
	*p = Result{}
	return r
}

// Snapshot implements raft.FSM: it copies the state for Persist to write
// while Apply goes on. It runs on raft's apply goroutine, so every apply
// waits for it: the sessions, the key-value store and the queues are
// cloned copy-on-write, the locks and registers copied flat in the order
// of their indexes, without a sort (coreCopy, snapcore.go), and the
// message is built and serialised by Persist, outside the lock.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock() // cloning marks the trees copy-on-write: not alongside readers
	if f.fatal != nil {
		// The state lacks the corrupt entry: a snapshot of it would let
		// raft drop the log that still holds the truth.
		err := f.fatal
		f.mu.Unlock()
		return nil, fmt.Errorf("fsm: no snapshot of a stopped state machine: %w", err)
	}
	core := f.state.copyCore()
	kv := f.state.kv.tree.Clone()
	hist := f.state.copyKVHistory() // O(1): the records are shared
	queues := f.state.CloneQueues() // O(1) per queue: serialised in Persist
	f.mu.Unlock()
	return &fsmSnapshot{core: core, kv: kv, hist: hist, queues: queues}, nil
}

// ConsistentExport returns the whole state like State.Export, holding the
// state lock only to copy it (the key-value store and the queues are
// cloned copy-on-write and serialised after the lock is released).
func (f *FSM) ConsistentExport() *fsmpb.Snapshot {
	f.mu.Lock()
	core := f.state.copyCore()
	kv := f.state.kv.tree.Clone()
	hist := f.state.copyKVHistory()
	queues := f.state.CloneQueues()
	f.mu.Unlock()
	snap := core.export()
	exportKV(snap, kv)
	exportKVHistory(snap, hist)
	exportQueues(snap, queues)
	return snap
}

// Restore implements raft.FSM. It reads the snapshot as a stream
// (ReadSnapshot). A snapshot that does not decode stops the state machine
// (see Err) rather than let raft fall back to an older one.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.Err(); err != nil {
		return fmt.Errorf("fsm: no restore into a stopped state machine: %w", err)
	}
	st, err := ReadSnapshot(rc)
	if err != nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		var fe *FormatError
		if errors.As(err, &fe) {
			return f.failLocked(fe) // not damaged: newer than this build
		}
		return f.failLocked(fmt.Errorf("%w: the snapshot does not decode: %v", ErrCorrupt, err))
	}
	f.mu.Lock()
	st.faults = f.state.faults     // a switch of this process, not replicated state
	st.counters = f.state.counters // this process's counts go on across a restore
	f.state = st
	f.sec.Store(st.sec)
	f.clusterVersion.Store(st.ClusterVersion())
	f.mu.Unlock()
	f.sink(Event{Kind: EventRestored, Revision: st.revision})
	return nil
}

type fsmSnapshot struct {
	core   *coreCopy
	kv     *btree.BTreeG[KV]
	hist   historyCopy
	queues QueueSnapshot
}

// Persist writes the snapshot: every field but the queues' items as one
// message, then the items chunk by chunk (queue_snapshot.go).
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	snap := s.core.export()
	exportKV(snap, s.kv)
	exportKVHistory(snap, s.hist)
	snap.Queues = s.queues.Export()
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
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

func (s *fsmSnapshot) Release() {}
