package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Observer receives measurements of a node's work (Config.Observer). Its
// methods are called on the node's own goroutines, raft's included: they
// must be quick and must not block. It is how the metrics learn what
// only the node sees; the state machine's own counts are read from the
// state.
type Observer interface {
	// LogAppend: one append to the raft log store, fsync included, took d.
	LogAppend(d time.Duration)
	// Batch: the batcher wrote one log entry of n commands.
	Batch(n int)
	// GroupCommitWait: the batcher waited for more proposals before
	// writing a batch smaller than the one before (group commit);
	// gained says whether any came.
	GroupCommitWait(gained bool)
	// LeaderChanged: this node saw a new leader (a non-empty id).
	LeaderChanged(leader string)
}

// observeLeaders registers a raft observer that publishes the node's
// Leadership each time raft changes its state or the leader it knows of,
// on raft's goroutine as it changes them, and reports and logs every new
// leader. It sends nothing on a channel: the filter itself publishes, and
// returns false.
func (n *Node) observeLeaders() {
	n.raft.RegisterObserver(raft.NewObserver(nil, false, func(o *raft.Observation) bool {
		switch d := o.Data.(type) {
		case raft.RaftState:
			n.publish(nil)
		case raft.LeaderObservation:
			v := n.publish(nil)
			if d.LeaderID == "" {
				n.cfg.Logger.Info("no leader", "term", v.Term)
				return false
			}
			n.cfg.Logger.Info("leader changed", "leader", string(d.LeaderID), "term", v.Term, "self", d.LeaderID == raft.ServerID(n.cfg.NodeID))
			if n.cfg.Observer != nil {
				n.cfg.Observer.LeaderChanged(string(d.LeaderID))
			}
		}
		return false
	}))
}

// loggedNames bounds the lock names a log record lists.
const loggedNames = 100

// proposeForLessor is Propose for the lessor's commands. Each session an
// ExpireSessions ended is logged with its owner and what it held and
// waited for, and then each lock-delay its expiry started.
func (n *Node) proposeForLessor(ctx context.Context, cmd *fsmpb.Command) (fsm.Result, error) {
	ids := cmd.GetExpireSessions().GetSessions()
	if len(ids) == 0 {
		return n.Propose(ctx, cmd)
	}
	views := make([]fsm.SessionView, 0, len(ids))
	n.fsm.Read(func(s *fsm.State) {
		for _, id := range ids {
			for sv := range s.SessionsAfter(id-1, loggedNames) {
				if sv.ID == id {
					views = append(views, sv)
				}
				break
			}
		}
	})
	res, err := n.Propose(ctx, cmd)
	if err != nil {
		return res, err
	}
	var gone []fsm.SessionView // the sessions this command ended
	n.fsm.Read(func(s *fsm.State) {
		for _, v := range views {
			if _, live := s.Session(v.ID); !live {
				gone = append(gone, v)
			}
		}
	})
	for _, v := range gone {
		n.cfg.Logger.Info("session expired", "session", v.ID, "owner", v.Owner, "ttl_ms", v.TTLMs, "held", v.Held, "held_count", v.HeldCount, "waiting", v.Waiting, "waiting_count", v.WaitingCount)
		var delayed []fsm.LockSummary
		n.fsm.Read(func(s *fsm.State) {
			for _, name := range v.Held {
				if l := s.LockSummary(name); l.Delayed {
					delayed = append(delayed, l)
				}
			}
		})
		for _, l := range delayed {
			n.cfg.Logger.Info("lock-delay started", "lock", l.Name, "delay_ms", l.DelayMs, "session", v.ID, "owner", v.Owner)
		}
	}
	return res, nil
}

// Logger is the node's logger, for the service it runs.
func (n *Node) Logger() *slog.Logger { return n.cfg.Logger }

// RaftStats is raft's view of this node, for monitoring.
type RaftStats struct {
	IsLeader                  bool
	Term                      uint64
	CommitIndex, AppliedIndex uint64
	LastIndex                 uint64
}

// RaftStats reads raft's view without waiting for anything; IsLeader and
// Term are the node's Leadership.
func (n *Node) RaftStats() RaftStats {
	lead := n.Leadership()
	return RaftStats{
		IsLeader: lead.Leading, Term: lead.Term,
		CommitIndex: n.raft.CommitIndex(), AppliedIndex: n.appliedIndex(), LastIndex: n.raft.LastIndex(),
	}
}

// appliedIndex is the highest log index applied: raft's own count, or the
// state machine's when it is ahead. Raft counts a batch as applied only
// after handing it to the state machine, which may already have applied it
// and answered its proposers; a read of raft's count alone just after a
// commit could find this node behind although it is not.
func (n *Node) appliedIndex() uint64 {
	applied := n.raft.AppliedIndex()
	if done := n.fsmApplied.Load(); done != appliedUnknown && done > applied {
		return done
	}
	return applied
}

// Health is what a node's readiness is decided on (see Ready).
type Health struct {
	// Term, Leader and IsLeader are the node's Leadership: its term, the
	// leader it knows of ("" none) and whether it leads; a leader is
	// CaughtUp only once it serves (Leadership.Serving).
	Term     uint64
	Leader   string
	IsLeader bool
	// CommitIndex and AppliedIndex: raft's, read together.
	CommitIndex, AppliedIndex uint64
	// StartIndex: the highest index this node had applied before it
	// started (its applied record, record.go).
	StartIndex uint64
	// CaughtUp: this node's state holds everything it knows is
	// committed, and at least what it held before it started: its
	// snapshot and log are loaded.
	CaughtUp bool
	// Storage: nil when the data directory accepted a write and an fsync
	// just now, else what went wrong.
	Storage error
}

// Ready reports whether the node can serve: it knows a leader, has
// loaded its state and applied what is committed, and its storage is
// writable.
func (h Health) Ready() bool { return h.Leader != "" && h.CaughtUp && h.Storage == nil }

// Reason says why the node is not ready ("" when it is).
func (h Health) Reason() string {
	switch {
	case h.Leader == "":
		return "no leader"
	case !h.CaughtUp && h.AppliedIndex < h.StartIndex:
		return fmt.Sprintf("loading its state: applied index %d of the %d it had applied before it started", h.AppliedIndex, h.StartIndex)
	case !h.CaughtUp:
		return fmt.Sprintf("catching up: applied index %d, commit index %d", h.AppliedIndex, h.CommitIndex)
	case h.Storage != nil:
		return fmt.Sprintf("storage not writable: %v", h.Storage)
	}
	return ""
}

// caughtUpScan bounds how many entries caughtUp reads.
const caughtUpScan = 1024

// appliedUnknown is Node.fsmApplied after a snapshot installed at run time.
const appliedUnknown = ^uint64(0)

// caughtUp reports whether the state machine has applied every entry up
// to applied, raft's applied index. That index counts entries raft has
// handed to the state machine, which may still be applying them (a
// restart's log replay, a follower catching up); and the state machine
// sees only commands and configuration changes, so its own last index may
// stay below raft's when no-ops and barriers follow. So: caught up when
// none of the entries after the state machine's last one, up to applied,
// is one it still has to apply. Not caught up when there are more than
// caughtUpScan of them. After a snapshot installed at run time the state
// machine's index is unknown (0) until its next entry: raft's is taken.
func (n *Node) caughtUp(applied uint64) bool {
	done := n.fsmApplied.Load()
	switch {
	case done == appliedUnknown || done >= applied:
		return true
	case applied-done > caughtUpScan:
		return false
	}
	for i := done + 1; i <= applied; i++ {
		var l raft.Log
		if err := n.stores.Log.GetLog(i, &l); err != nil {
			continue // compacted into a snapshot: applied
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return false
		}
	}
	return true
}

// probeFile is written and removed by each storage check.
const probeFile = ".probe"

// Health checks this node now. The storage check writes, fsyncs and
// removes a small file beside the raft log, so it costs one fsync.
func (n *Node) Health() Health {
	lead := n.Leadership()
	h := Health{Term: lead.Term, Leader: lead.Leader, IsLeader: lead.Leading, CommitIndex: n.raft.CommitIndex(), AppliedIndex: n.appliedIndex(), StartIndex: n.startIndex}
	h.CaughtUp = h.AppliedIndex >= max(h.CommitIndex, h.StartIndex) && n.caughtUp(h.AppliedIndex) && (!lead.Leading || lead.Serving())
	// The log's own last write first (a full disk, an I/O error), then a
	// probe: a node can be idle with a disk that fails.
	if h.Storage = n.stores.Failure(); h.Storage == nil {
		h.Storage = probeWritable(filepath.Join(n.cfg.DataDir, "raft", probeFile))
	}
	return h
}

// probeWritable creates path, writes and fsyncs a byte and removes it.
func probeWritable(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write([]byte{0})
	serr := f.Sync()
	cerr := f.Close()
	rerr := os.Remove(path)
	return errors.Join(werr, serr, cerr, rerr)
}

// SessionsTimeLeft reports, on the leader, how long each session of ids
// has before it expires without a keepalive (-1: not timed); ok is false
// on a follower, which keeps no deadlines.
func (n *Node) SessionsTimeLeft(ids []uint64) (left []time.Duration, ok bool) {
	return n.lessor.TimesLeft(ids)
}

// ID is this node's id.
func (n *Node) ID() string { return n.cfg.NodeID }

// DataSize is the size in bytes of the files in this node's data
// directory (its raft log, stable store and snapshots).
func (n *Node) DataSize() int64 {
	var size int64
	_ = filepath.WalkDir(n.cfg.DataDir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, ierr := d.Info(); ierr == nil {
				size += info.Size()
			}
		}
		return nil
	})
	return size
}
