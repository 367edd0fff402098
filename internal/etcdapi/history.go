package etcdapi

// The history of past revisions as etcd's API shows it: Compact, and
// automatic compaction (etcd's --auto-compaction-mode and
// --auto-compaction-retention). The history itself is the state
// machine's (fsm/kvhistory.go); a Range or a Txn reads it at a revision
// (kv.go, txn.go), a watch from before its start is answered "compacted"
// (watch.go).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

// Compact implements etcd's KV.Compact: it commits KVHistoryCompact, which
// moves the start of the history window to the revision on every member
// (physical is accepted: the window is in memory, so every compaction is
// physical once it is applied). A revision at or before the start answers
// etcd's "compacted", one after the current revision "future revision".
// Below cluster version 3, which keeps no history, a revision up to the
// current one is accepted and changes nothing, as before.
func (k *kvServer) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	s := k.s
	if err := s.authorize(ctx, "KV/Compact", server.ClusterWrite); err != nil {
		return nil, err
	}
	if fw, err := s.forward(ctx); err != nil || fw != nil {
		if err != nil {
			return nil, err
		}
		resp, err := pb.NewKVClient(fw.conn).Compact(fw.ctx, r)
		return relay(s, resp, err)
	}
	var kept bool
	var rev uint64
	s.front.Read(func(st *fsm.State) { kept, rev = st.KVHistoryKept(), st.Revision() })
	if !kept {
		if r.Revision > 0 && uint64(r.Revision) > rev {
			return nil, rpctypes.ErrGRPCFutureRev
		}
		return &pb.CompactionResponse{Header: s.header(rev)}, nil
	}
	if r.Revision < 0 {
		return nil, rpctypes.ErrGRPCCompacted
	}
	res, err := s.propose(ctx, &fsmpb.KVHistoryCompact{Revision: uint64(r.Revision)})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.CompactionResponse{Header: s.header(res.Revision)}, nil
}

// compactRevision is the start of the history window on this node (0:
// no history is kept, below cluster version 3).
func (s *Server) compactRevision() uint64 {
	var rev uint64
	s.front.Read(func(st *fsm.State) {
		if st.KVHistoryKept() {
			rev = st.KVCompactRevision()
		}
	})
	return rev
}

// Automatic compaction modes (etcd's --auto-compaction-mode).
const (
	CompactionPeriodic = "periodic"
	CompactionRevision = "revision"
)

// AutoCompaction is etcd's automatic compaction policy, run by the
// leader: it proposes Compact, so that the history window keeps about
// what the retention says (the replicated limits max-kv-history-revisions
// and max-kv-history-bytes bound it anyway). The zero value compacts
// nothing.
type AutoCompaction struct {
	// Mode is CompactionPeriodic or CompactionRevision ("": none).
	Mode string
	// Period (periodic): keep the history of the last Period; compact
	// every Period, or every hour when Period is longer.
	Period time.Duration
	// Revisions (revision): keep the last Revisions revisions; compact
	// every 5 minutes.
	Revisions uint64
}

// ParseAutoCompaction reads etcd's two flags: a mode, periodic or
// revision, and a retention: for periodic a duration ("30m", "1h") or a
// number of hours ("1", "0.5"), for revision a number of revisions. A
// retention of 0 disables compaction, as etcd's default does.
func ParseAutoCompaction(mode, retention string) (AutoCompaction, error) {
	switch mode {
	case CompactionPeriodic:
		if d, err := time.ParseDuration(retention); err == nil {
			if d < 0 {
				return AutoCompaction{}, fmt.Errorf("--auto-compaction-retention %q is negative", retention)
			}
			if d == 0 {
				return AutoCompaction{}, nil
			}
			return AutoCompaction{Mode: mode, Period: d}, nil
		}
		h, err := strconv.ParseFloat(retention, 64)
		if err != nil || h < 0 || h > 1e6 {
			return AutoCompaction{}, fmt.Errorf("--auto-compaction-retention %q is neither a duration (1h, 30m) nor a number of hours", retention)
		}
		if h == 0 {
			return AutoCompaction{}, nil
		}
		return AutoCompaction{Mode: mode, Period: time.Duration(h * float64(time.Hour))}, nil
	case CompactionRevision:
		n, err := strconv.ParseUint(retention, 10, 64)
		if err != nil {
			return AutoCompaction{}, fmt.Errorf("--auto-compaction-retention %q is not a number of revisions", retention)
		}
		if n == 0 {
			return AutoCompaction{}, nil
		}
		return AutoCompaction{Mode: mode, Revisions: n}, nil
	}
	return AutoCompaction{}, fmt.Errorf("--auto-compaction-mode %q is neither periodic nor revision", mode)
}

// revisionCompactInterval is how often the revision mode compacts, as
// etcd's.
const revisionCompactInterval = 5 * time.Minute

// interval is how often the policy samples the revision (periodic: a
// tenth of the period, at most 6 minutes, as etcd's) or compacts
// (revision).
func (a AutoCompaction) interval() time.Duration {
	if a.Mode == CompactionRevision {
		return revisionCompactInterval
	}
	return min(a.Period, time.Hour) / 10
}

// compactor is the policy's state on the leader: the revisions it
// sampled (periodic) and when it last compacted. It is reset when the
// node loses leadership. It is pure: tick decides from the time and the
// revision it is given.
type compactor struct {
	policy AutoCompaction
	// samples: the revision at each tick, oldest first (periodic).
	samples []sample
	start   time.Time // of the first tick as leader
	last    time.Time // of the last compaction (zero: none yet)
	lastRev uint64    // the revision it last compacted to
}

type sample struct {
	at  time.Time
	rev uint64
}

// reset forgets everything: leadership was lost.
func (c *compactor) reset() { *c = compactor{policy: c.policy} }

// tick takes the time and the current revision and says which revision
// to compact to, if any.
func (c *compactor) tick(now time.Time, rev uint64) (uint64, bool) {
	if c.start.IsZero() {
		c.start = now
	}
	switch c.policy.Mode {
	case CompactionRevision:
		if rev <= c.policy.Revisions || now.Sub(c.start) < revisionCompactInterval || (!c.last.IsZero() && now.Sub(c.last) < revisionCompactInterval) {
			return 0, false
		}
		return c.compacted(now, rev-c.policy.Revisions)
	case CompactionPeriodic:
		c.samples = append(c.samples, sample{now, rev})
		every := min(c.policy.Period, time.Hour)
		if now.Sub(c.start) < c.policy.Period || (!c.last.IsZero() && now.Sub(c.last) < every) {
			c.trim(now)
			return 0, false
		}
		// The newest revision sampled at least Period ago: what was
		// written since is kept.
		var target uint64
		for _, s := range c.samples {
			if now.Sub(s.at) >= c.policy.Period {
				target = s.rev
			}
		}
		c.trim(now)
		return c.compacted(now, target)
	}
	return 0, false
}

func (c *compactor) compacted(now time.Time, target uint64) (uint64, bool) {
	if target == 0 || target <= c.lastRev {
		return 0, false
	}
	c.last, c.lastRev = now, target
	return target, true
}

// trim keeps one sample at least Period old and every newer one.
func (c *compactor) trim(now time.Time) {
	i := 0
	for i+1 < len(c.samples) && now.Sub(c.samples[i+1].at) >= c.policy.Period {
		i++
	}
	c.samples = c.samples[i:]
}

// autoCompact runs the policy until ctx ends: on the leader, at every
// interval, it proposes the compaction the policy asks for.
func (s *Server) autoCompact(ctx context.Context) {
	p := s.cfg.AutoCompaction
	if p.Mode == "" {
		return
	}
	c := &compactor{policy: p}
	t := time.NewTicker(p.interval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !s.front.IsLeader() {
				c.reset()
				continue
			}
			var rev uint64
			var kept bool
			s.front.Read(func(st *fsm.State) { rev, kept = st.Revision(), st.KVHistoryKept() })
			if !kept {
				continue
			}
			target, ok := c.tick(now, rev)
			if !ok {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := s.propose(pctx, &fsmpb.KVHistoryCompact{Revision: target})
			cancel()
			switch {
			case err == nil:
				s.log.Info("auto-compaction: compacted the key-value history", "revision", target, "mode", p.Mode)
			case errors.Is(err, fsm.ErrCompactedRevision):
				// compacted further already (by a client or the bounds)
			default:
				s.log.Warn("auto-compaction failed", "revision", target, "err", err)
			}
		}
	}
}
