package node

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Security returns the replicated ACLs and signing keys as of the last
// applied entry (immutable; no lock is taken).
func (n *Node) Security() *fsm.Security { return n.fsm.Security() }

// NewSigningKey draws a signing key, and a cluster id for a cluster that
// has none yet: randomness is the proposer's, never Apply's.
func NewSigningKey(onlyIfNone bool) (*fsmpb.AddSigningKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("node: drawing a signing key: %w", err)
	}
	id := make([]byte, fsm.ClusterIDBytes)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("node: drawing a cluster id: %w", err)
	}
	return &fsmpb.AddSigningKey{ClusterId: id, Key: &fsmpb.SigningKey{Id: fenceproof.KeyID(pub), Seed: priv.Seed()}, OnlyIfNone: onlyIfNone}, nil
}

// EnsureSigningKey gives a cluster without a signing key its first one
// (and its cluster id): a leader proposes it once it serves, and after a
// restore. Two leaders in a row may both propose; only the first applied
// adds a key. A failure is logged: the next leader tries again.
func (n *Node) EnsureSigningKey(ctx context.Context) {
	if _, ok := n.Security().ActiveKey(); ok {
		return
	}
	add, err := NewSigningKey(true)
	if err == nil {
		_, err = n.Propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_AddSigningKey{AddSigningKey: add}})
	}
	if err != nil {
		fmt.Fprintf(n.cfg.LogOutput, "tenure: creating the cluster's signing key: %v (the next leader tries again)\n", err)
	}
}

// keyRetireTick is how often the leader looks for retired signing keys
// whose grace has passed.
const keyRetireTick = time.Second

// retireKeys removes retired signing keys once their grace has passed,
// while this node leads, until ctx ends: it proposes RemoveSigningKey
// (time never enters Apply). The grace is measured on this node's clock
// from when it, as leader, first saw the key retired; a new leader, or a
// key retired again, starts it anew, so a key is never removed before its
// grace has passed (it may be removed up to a tick, or one leader change,
// later).
func (n *Node) retireKeys(ctx context.Context) {
	type retired struct {
		id  string
		rev uint64
	}
	seen := map[retired]time.Time{}
	var term uint64
	// The tick is wall time, not Config.Clock's timers: a test's fake
	// clock counts the timers the lessor makes; the grace is measured on
	// Config.Clock.
	tick := time.NewTicker(keyRetireTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.quit:
			return
		case <-tick.C:
		}
		if lead := n.Leadership(); !lead.Serving() || lead.Term != term {
			clear(seen)
			term = lead.Term
			continue
		}
		now := n.cfg.Clock.Now()
		keep := map[retired]time.Time{}
		for _, k := range n.Security().Keys {
			if k.RetiredRevision == 0 {
				continue
			}
			r := retired{k.ID, k.RetiredRevision}
			first, ok := seen[r]
			if !ok {
				first = now
			}
			keep[r] = first
			if now.Sub(first) < k.RetireGrace {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, n.cfg.ApplyTimeout)
			_, err := n.Propose(pctx, &fsmpb.Command{Op: &fsmpb.Command_RemoveSigningKey{RemoveSigningKey: &fsmpb.RemoveSigningKey{Id: k.ID}}})
			cancel()
			if err != nil {
				n.cfg.Logger.Warn("removing a retired signing key", "key", k.ID, "err", err)
				continue
			}
			n.cfg.Logger.Info("retired signing key removed", "key", k.ID, "grace", k.RetireGrace.String())
		}
		seen = keep
	}
}
