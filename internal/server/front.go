package server

// The door for the node's other fronts (internal/etcdapi, and any
// protocol served beside Tenure's API): they translate their requests
// into these calls, never into the node's. Identity and rights are
// etcdauth.go's (ResolveCaller, Missing, Denied); a proposal goes through
// Front.Propose, which admits only the operations a front may propose,
// checks them against this node's limits, and builds the command in the
// one place commands are built (command.go).

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// The node's errors a front sees, as the server's: a front matches them
// with errors.Is and never imports the node.
var (
	// ErrNotLeader: this node does not lead (or has not confirmed its
	// leadership yet); nothing was proposed.
	ErrNotLeader = node.ErrNotLeader
	// ErrUnknownOutcome: the proposal may or may not have been committed
	// (leadership was lost while it was in flight); do not retry a write
	// that is not idempotent without reading first.
	ErrUnknownOutcome = node.ErrUnknownOutcome
	// ErrClosed: the node is shutting down.
	ErrClosed = node.ErrClosed
	// ErrStorageFull: the node's disk refused the write; nothing was
	// committed.
	ErrStorageFull = node.ErrStorageFull
)

// Member is a member of the raft configuration, as a front lists it.
type Member = node.Member

// RaftStats is raft's view of this node, read without waiting.
type RaftStats = node.RaftStats

// Front is the server as another front of the node uses it. It is safe
// for concurrent use; the zero Front is not usable (Server.Front).
type Front struct{ s *Server }

// Front returns the door of the node's other fronts to s.
func (s *Server) Front() Front { return Front{s} }

// Logger is the server's log.
func (f Front) Logger() *slog.Logger { return f.s.log }

// NodeID is this node's id.
func (f Front) NodeID() string { return f.s.node.ID() }

// Term is raft's current term on this node.
func (f Front) Term() uint64 { return f.s.node.Term() }

// Leader is the id of the leader this node knows, "" when it knows none.
func (f Front) Leader() string { return f.s.node.Leader() }

// IsLeader reports whether this node is raft's leader now (it may not
// have confirmed its leadership yet: a write it accepts may still fail
// with ErrNotLeader or ErrUnknownOutcome).
func (f Front) IsLeader() bool { return f.s.node.IsLeader() }

// CaughtUpLeader reports whether this node leads and its state holds
// every entry committed before its term: what it reads of the ACLs is
// then current, and a denial needs no catching up first.
func (f Front) CaughtUpLeader() bool { return f.s.node.CaughtUpLeader() }

// Members lists the raft configuration.
func (f Front) Members() ([]Member, error) { return f.s.node.Members() }

// RaftStats reads raft's view of this node without waiting.
func (f Front) RaftStats() RaftStats { return f.s.node.RaftStats() }

// DataSize is the size of this node's data directory, in bytes.
func (f Front) DataSize() int64 { return f.s.node.DataSize() }

// StorageError is the storage failure this node reports, "" when none.
func (f Front) StorageError() string { return f.s.node.Status().StorageError }

// Security is this node's current copy of the ACLs (it may lag the
// leader's: see CaughtUpLeader).
func (f Front) Security() *fsm.Security { return f.s.acls() }

// Read runs fn on this node's local state under its read lock; fn must
// not block or call back into the server.
func (f Front) Read(fn func(*fsm.State)) { f.s.node.Read(fn) }

// KVView returns a view of this node's key-value store and history
// window at its current revision, taken in O(1) and read without the
// state lock: a walk of every key (HashKV) reads it while writes go on.
func (f Front) KVView() *fsm.KVView { return f.s.node.KVView() }

// LinearizableRead returns once a Read sees every write completed before
// the call (ErrNotLeader on a node that does not lead).
func (f Front) LinearizableRead(ctx context.Context) error { return f.s.node.LinearizableRead(ctx) }

// KeepAlive renews session id on the leader and returns its TTL; the
// renewal is confirmed only while this node's leadership is.
func (f Front) KeepAlive(ctx context.Context, id uint64) (time.Duration, error) {
	return f.s.node.KeepAlive(ctx, id)
}

// SessionsTimeLeft is the time each session of ids has left on the
// leader's clock (negative: unknown); ok false off the leader.
func (f Front) SessionsTimeLeft(ids []uint64) ([]time.Duration, bool) {
	return f.s.node.SessionsTimeLeft(ids)
}

// Propose commits op, one of the operations a front may propose (the
// key-value store's writes and transactions, etcd leases as sessions, a
// member's etcd address, an etcd user's token), after checking it
// against this node's limits. The error is the proposal's (ErrNotLeader,
// ErrUnknownOutcome, ...) or the admission's (fsm.ErrInvalid); a refusal
// of the state machine is the result's Err.
func (f Front) Propose(ctx context.Context, op any) (fsm.Result, error) {
	if err := f.s.admitFront(op); err != nil {
		return fsm.Result{}, err
	}
	return f.s.proposeOp(ctx, op)
}

// ZkSetAddr is the operation that publishes a member's ZooKeeper
// listener address (fsmpb.Command.zk_set_addr).
type ZkSetAddr struct{ *fsmpb.SetEtcdURL }

// OnZnodeEvents makes fn receive, on the state machine's apply path and
// in log order, every EventZnode, EventSessionEnded, EventApplied and
// EventRestored (internal/zkapi's watches). fn must not block; one
// function at a time is set (nil removes it).
func (f Front) OnZnodeEvents(fn func(fsm.Event)) {
	if fn == nil {
		f.s.hub.znodes.Store(nil)
		return
	}
	f.s.hub.znodes.Store(&fn)
}

// admitFront checks an operation a front proposes: its kind, and the key
// and value limits of the key-value store (as Tenure's API applies them,
// admitKey and admitPut).
func (s *Server) admitFront(op any) error {
	switch o := op.(type) {
	case *fsmpb.KVPut:
		return s.admitFrontPut(o)
	case *fsmpb.KVDelete:
		return s.admitFrontDelete(o)
	case *fsmpb.KVTxn:
		return s.admitFrontTxn(o, 0)
	case *fsmpb.CreateSession, *fsmpb.CloseSession, *fsmpb.SetEtcdURL, *fsmpb.AclTokenUpdate, *fsmpb.KVHistoryCompact, *fsmpb.ZkTxn, ZkSetAddr:
		return nil
	case *fsmpb.SetSessionTTL:
		return fsm.ValidateSessionTTL(o.GetSession(), o.GetTtlMs())
	}
	return fmt.Errorf("%w: %T is not an operation a front proposes", errNoCommand, op)
}

// admitFrontTxn is admitFront of a transaction nested depth deep, its
// nested transactions' ops included.
func (s *Server) admitFrontTxn(o *fsmpb.KVTxn, depth int) error {
	if depth > fsm.MaxTxnDepth {
		return fmt.Errorf("%w: transactions nested more than %d deep", fsm.ErrInvalid, fsm.MaxTxnDepth)
	}
	for _, c := range o.GetCompares() {
		if err := s.admitKey(c.GetKey()); err != nil {
			return err
		}
	}
	for _, branch := range [][]*fsmpb.KVOp{o.GetSuccess(), o.GetFailure()} {
		for _, op := range branch {
			var err error
			switch {
			case op.GetPut() != nil:
				err = s.admitFrontPut(op.GetPut())
			case op.GetDelete() != nil:
				err = s.admitFrontDelete(op.GetDelete())
			case op.GetRange() != nil:
				err = s.admitKey(op.GetRange().GetKey())
			case op.GetTxn() != nil:
				err = s.admitFrontTxn(op.GetTxn(), depth+1)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Server) admitFrontPut(p *fsmpb.KVPut) error {
	if err := s.admitKey(p.GetKey()); err != nil {
		return err
	}
	return s.admitValue(p.GetValue())
}

func (s *Server) admitFrontDelete(d *fsmpb.KVDelete) error {
	if err := s.admitKey(d.GetKey()); err != nil {
		return err
	}
	return s.admitKey(string(d.GetRangeEnd()))
}
