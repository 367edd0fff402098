//go:build linux || darwin

package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

// Fault kinds.
const (
	faultPause        = "pause-holder"      // SIGSTOP a `tenure lock` holder and its command past the TTL
	faultKillLeader   = "kill-leader"       // kill -9 the leader, restart it on its data
	faultKillFollower = "kill-follower"     // kill -9 a follower, restart it on its data
	faultPartLeader   = "partition-leader"  // isolate the leader from the majority, heal
	faultPartNode     = "partition-node"    // isolate a follower, heal
	faultOneWay       = "partition-one-way" // the leader cannot reach a follower; the follower still reaches it
	faultRestartAll   = "restart-cluster"   // kill -9 every node, restart them all
	faultPauseLeader  = "pause-leader"      // SIGSTOP the leader's server, short or past the election timeout
	faultPauseFollow  = "pause-follower"    // SIGSTOP a follower's server, likewise
	faultBlackhole    = "blackhole-client"  // client connections to the leader go silent, without closing
	faultDiskFull     = "disk-full"         // one node's file system fills up while its log grows
	faultCorrupt      = "corrupt-restart"   // a follower restarted on a corrupted log must refuse; rebuilt from its peers
)

// fullSchedule is the order TestNemesis injects faults in, cycling. The
// CI run (30 s) gets through eleven or twelve: the network and process
// faults, then the long server pauses and a blackhole; the storage faults
// come last, and TestNemesisRealFaults runs every kind after the first
// eight in CI.
var fullSchedule = []string{
	faultPause, faultKillLeader, faultPartLeader, faultRestartAll,
	faultKillFollower, faultPartNode, faultPause, faultOneWay,
	faultPauseLeader, faultPauseFollow, faultBlackhole, faultPauseLeader,
	faultPauseFollow, faultDiskFull, faultCorrupt,
}

// realSchedule is TestNemesisRealFaults's: each of the faults a server
// meets outside the network, both pause lengths of each pause.
var realSchedule = []string{
	faultPauseLeader, faultBlackhole, faultDiskFull, faultPauseFollow,
	faultCorrupt, faultPauseLeader, faultPauseFollow,
}

// Fault timing.
const (
	faultHold    = 2 * time.Second // how long a partition or a dead follower lasts
	quietPeriod  = 700 * time.Millisecond
	recoverLimit = 30 * time.Second // heal → cluster serving again
	// minPause is the shortest freeze of a holder: longer than the TTL of
	// the `tenure lock` clients.
	minPause = procTTL + 500*time.Millisecond
	// Pauses of a server (SIGSTOP): the short one stays below raft's
	// heartbeat timeout (500 ms, internal/node), so nobody campaigns: a
	// stall; the long one outlasts the randomised election timeout (up to
	// 1 s), so the others elect a leader, and stays below the in-process
	// clients' session TTL (goTTL). The first pause of each kind is long.
	pauseShort = 400 * time.Millisecond
	pauseLong  = 1500 * time.Millisecond
	// blackholeHold outlasts goTTL: a client that does not leave a silent
	// endpoint loses its session.
	blackholeHold = 3 * time.Second
)

// nemesis injects faults, one at a time, into processes and links the
// suite started; it runs on one goroutine.
type nemesis struct {
	c        *cluster
	rec      *recorder
	procs    []*procWorker
	rnd      *rand.Rand
	logf     func(format string, args ...any)
	nextProc int
	injected map[string]int // faults injected so far, by kind
}

// run injects faults from schedule (cycling) until ctx ends or max faults
// were injected. After each fault it waits for the cluster to serve
// again; a cluster that does not recover is an error.
func (nm *nemesis) run(ctx context.Context, schedule []string, max int) error {
	if nm.injected == nil {
		nm.injected = make(map[string]int)
	}
	for i := 0; i < max && ctx.Err() == nil; i++ {
		kind := schedule[i%len(schedule)]
		f, err := nm.inject(kind)
		nm.injected[kind]++
		if f != nil {
			nm.rec.addFault(*f)
			nm.logf("fault %-17s %6.2fs..%6.2fs %s", f.Kind, secs(f.Start), secs(f.End), f.Note)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		if err := nm.c.waitHealthy(recoverLimit); err != nil {
			return fmt.Errorf("cluster did not serve again after %s: %w", kind, err)
		}
		pace(ctx, quietPeriod)
	}
	return nil
}

func secs(ns int64) float64 { return float64(ns) / 1e9 }

func (nm *nemesis) inject(kind string) (*Fault, error) {
	switch kind {
	case faultPause:
		return nm.pauseHolder()
	case faultKillLeader:
		return nm.killLeader()
	case faultKillFollower:
		return nm.killFollower()
	case faultPartLeader:
		return nm.partitionLeader()
	case faultPartNode:
		return nm.partitionFollower()
	case faultOneWay:
		return nm.oneWay()
	case faultRestartAll:
		return nm.restartAll()
	case faultPauseLeader:
		return nm.pauseServer(true)
	case faultPauseFollow:
		return nm.pauseServer(false)
	case faultBlackhole:
		return nm.blackhole()
	case faultDiskFull:
		return nm.diskFull()
	case faultCorrupt:
		return nm.corruptRestart()
	}
	return nil, fmt.Errorf("unknown fault %q", kind)
}

// pauseHolder is the GC-pause scenario: a `tenure lock` holder that has
// read the register is frozen (SIGSTOP of `tenure lock` and of its
// command's process group) until the server has expired its session and
// another client has written with a newer token; then it is thawed, writer
// first, so that its write goes out late with the old token.
func (nm *nemesis) pauseHolder() (*Fault, error) {
	if len(nm.procs) == 0 {
		return nil, nil
	}
	w := nm.procs[nm.nextProc%len(nm.procs)]
	nm.nextProc++
	if err := os.WriteFile(w.lingerFlag(), nil, 0o644); err != nil {
		return nil, err
	}
	defer os.Remove(w.lingerFlag())
	var mk lingerMarker
	var lockProc *proc
	err := testutil.PollUntil(20*time.Second, func() (bool, error) {
		b, err := os.ReadFile(w.markerPath())
		if err != nil || json.Unmarshal(b, &mk) != nil {
			return false, nil
		}
		// Only processes this suite started: the marker's parent must be
		// the `tenure lock` the worker is running now.
		lockProc = w.running()
		return lockProc != nil && mk.PPID == lockProc.pid() && !lockProc.exited(), nil
	})
	if err != nil {
		nm.logf("pause-holder: no holder of %s lingered (%v); skipped", w.key, err)
		return nil, nil
	}
	writer := mk.PID
	if mk.PGID == mk.PID {
		writer = -mk.PGID // the helper leads its group: freeze it all
	}
	start := nm.rec.now()
	lockProc.signal(syscall.SIGSTOP) // keepalives stop
	_ = syscall.Kill(writer, syscall.SIGSTOP)
	// The linger file stays until the thaw: a stop that takes effect a
	// little after kill(2) returns must not let the write out early.

	var regToken uint64
	frozen := time.Now()
	werr := testutil.PollUntil(15*time.Second, func() (bool, error) {
		// These reads go into the history: the one that saw the newer
		// token completed before the frozen writer was thawed.
		inv := nm.rec.now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		reg, err := nm.c.admin.FencedGet(ctx, w.key)
		cancel()
		get := Op{Client: "nemesis", Kind: kindGet, Key: w.key, Invoke: inv, Complete: nm.rec.now(), Outcome: outOK}
		if err != nil {
			get.Outcome, get.Err = outFail, err.Error()
		} else {
			get.Value, get.Token, get.Found, get.Revision = string(reg.Value), reg.Token, reg.Found, reg.ModRevision
			regToken = reg.Token
		}
		nm.rec.add(get)
		return err == nil && reg.Token > mk.Token && time.Since(frozen) >= minPause, nil
	})
	_ = os.Remove(w.lingerFlag()) // once thawed, the writer goes on at once
	_ = syscall.Kill(writer, syscall.SIGCONT)
	lockProc.signal(syscall.SIGCONT)
	end := nm.rec.now()
	note := fmt.Sprintf("froze %s (tenure lock pid %d, writer pid %d) holding token %d for %.2fs; register token %d by then",
		w.id, lockProc.pid(), mk.PID, mk.Token, secs(end-start), regToken)
	if werr != nil {
		note += " (no newer write while frozen)"
	}
	return &Fault{Kind: faultPause, Target: w.id, Client: w.id, Key: w.key, Token: mk.Token, Start: start, End: end, Note: note}, nil
}

// killLeader kills the leader with SIGKILL, waits for another node to
// lead, and restarts it on its data directory.
func (nm *nemesis) killLeader() (*Fault, error) {
	l, err := nm.c.waitLeader(nil, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	start := nm.rec.now()
	if err := nm.c.kill(l); err != nil {
		return nil, err
	}
	nl, lerr := nm.c.waitLeader(nm.c.others(l), 20*time.Second)
	failover := nm.rec.now() - start
	if err := nm.restart(l); err != nil {
		return nil, err
	}
	f := &Fault{Kind: faultKillLeader, Target: l.id, Start: start, End: nm.rec.now()}
	if lerr != nil {
		f.Note = fmt.Sprintf("killed leader %s; no new leader within 20s; restarted", l.id)
		return f, fmt.Errorf("no new leader after killing %s: %w", l.id, lerr)
	}
	f.Note = fmt.Sprintf("killed leader %s; %s led after %.2fs; restarted", l.id, nl.id, secs(failover))
	f.Failover = failover
	return f, nil
}

// killFollower kills a follower with SIGKILL and restarts it after
// faultHold.
func (nm *nemesis) killFollower() (*Fault, error) {
	l, err := nm.c.waitLeader(nil, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	fs := nm.c.others(l)
	f := fs[nm.rnd.IntN(len(fs))]
	start := nm.rec.now()
	if err := nm.c.kill(f); err != nil {
		return nil, err
	}
	pace(context.Background(), faultHold)
	if err := nm.restart(f); err != nil {
		return nil, err
	}
	return &Fault{Kind: faultKillFollower, Target: f.id, Start: start, End: nm.rec.now(),
		Note: fmt.Sprintf("killed follower %s (leader %s); restarted after %v", f.id, l.id, faultHold)}, nil
}

func (nm *nemesis) restart(nd *node) error { return nm.c.startAll([]*node{nd}) }

// partitionLeader cuts the leader off from both followers until they have
// elected a new leader, holds the partition a little longer, then heals.
func (nm *nemesis) partitionLeader() (*Fault, error) {
	l, err := nm.c.waitLeader(nil, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	start := nm.rec.now()
	nm.c.isolate(l)
	defer nm.c.heal()
	nl, lerr := nm.c.waitLeader(nm.c.others(l), 20*time.Second)
	elected := nm.rec.now() - start
	pace(context.Background(), faultHold/2)
	nm.c.heal()
	f := &Fault{Kind: faultPartLeader, Target: l.id, Start: start, End: nm.rec.now()}
	if lerr != nil {
		f.Note = fmt.Sprintf("isolated leader %s; the majority elected no leader within 20s", l.id)
		return f, fmt.Errorf("majority without leader: %w", lerr)
	}
	f.Note = fmt.Sprintf("isolated leader %s; majority elected %s after %.2fs; healed", l.id, nl.id, secs(elected))
	f.Failover = elected
	return f, nil
}

// partitionFollower cuts a follower off from the others for faultHold.
func (nm *nemesis) partitionFollower() (*Fault, error) {
	l, err := nm.c.waitLeader(nil, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	fs := nm.c.others(l)
	f := fs[nm.rnd.IntN(len(fs))]
	start := nm.rec.now()
	nm.c.isolate(f)
	defer nm.c.heal()
	pace(context.Background(), faultHold)
	nm.c.heal()
	return &Fault{Kind: faultPartNode, Target: f.id, Start: start, End: nm.rec.now(),
		Note: fmt.Sprintf("isolated follower %s (leader %s) for %v; healed", f.id, l.id, faultHold)}, nil
}

// oneWay blocks the leader's link to one follower only: the follower
// stops hearing from the leader and campaigns, while its own messages
// still reach the leader.
func (nm *nemesis) oneWay() (*Fault, error) {
	l, err := nm.c.waitLeader(nil, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	fs := nm.c.others(l)
	f := fs[nm.rnd.IntN(len(fs))]
	start := nm.rec.now()
	nm.c.links[[2]int{l.i, f.i}].Block()
	defer nm.c.heal()
	pace(context.Background(), faultHold)
	nm.c.heal()
	return &Fault{Kind: faultOneWay, Target: l.id + "->" + f.id, Start: start, End: nm.rec.now(),
		Note: fmt.Sprintf("blocked %s→%s only for %v; healed", l.id, f.id, faultHold)}, nil
}

// restartAll kills every node with SIGKILL at once, then starts them all
// again on their data.
func (nm *nemesis) restartAll() (*Fault, error) {
	start := nm.rec.now()
	for _, nd := range nm.c.nodes {
		if nm.c.alive(nd) {
			nd.p.signal(syscall.SIGKILL)
		}
	}
	var errs []error
	for _, nd := range nm.c.nodes {
		errs = append(errs, nm.c.kill(nd))
	}
	errs = append(errs, nm.c.startAll(nm.c.nodes))
	f := &Fault{Kind: faultRestartAll, Target: "all", Start: start, End: nm.rec.now()}
	f.Note = fmt.Sprintf("killed all %d nodes; all serving again after %.2fs", len(nm.c.nodes), secs(f.End-f.Start))
	return f, errors.Join(errs...)
}

// pauseServer freezes the leader's (or a follower's) server process with
// SIGSTOP, alternately for pauseLong and pauseShort, then thaws it. For
// the leader it notes when another node led meanwhile (the failover).
func (nm *nemesis) pauseServer(leader bool) (*Fault, error) {
	l, err := nm.c.waitLeader(nil, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	kind, target := faultPauseLeader, l
	if !leader {
		fs := nm.c.others(l)
		kind, target = faultPauseFollow, fs[nm.rnd.IntN(len(fs))]
	}
	d := pauseLong
	if nm.injected[kind]%2 == 1 {
		d = pauseShort
	}
	start := nm.rec.now()
	until := time.Now().Add(d)
	target.p.signal(syscall.SIGSTOP) // the server leads its own process group
	defer target.p.signal(syscall.SIGCONT)
	var nl *node
	var led int64
	if leader {
		_ = testutil.PollUntil(time.Until(until), func() (bool, error) {
			nl = nm.c.leader(nm.c.others(target))
			return nl != nil, nil
		})
		led = nm.rec.now() - start
	}
	pace(context.Background(), time.Until(until))
	target.p.signal(syscall.SIGCONT)
	f := &Fault{Kind: kind, Target: target.id, Start: start, End: nm.rec.now()}
	role := "follower"
	if leader {
		role = "leader"
	}
	f.Note = fmt.Sprintf("stopped %s %s for %v", role, target.id, d)
	switch {
	case leader && nl != nil:
		f.Note += fmt.Sprintf("; %s led after %.2fs", nl.id, secs(led))
		f.Failover = led
	case leader:
		f.Note += "; no other node led meanwhile"
	default:
		f.Note += fmt.Sprintf(" (leader %s)", l.id)
	}
	return f, nil
}

// blackhole makes the client proxy in front of the leader stop forwarding,
// without closing any connection, for blackholeHold, then heals it.
func (nm *nemesis) blackhole() (*Fault, error) {
	l, err := nm.c.waitLeader(nil, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	start := nm.rec.now()
	l.api.Blackhole()
	defer l.api.Heal()
	pace(context.Background(), blackholeHold)
	l.api.Heal()
	f := &Fault{Kind: faultBlackhole, Target: l.id, Start: start, End: nm.rec.now()}
	still := "still leads"
	if nl := nm.c.leader(nil); nl != l {
		still = "no longer leads"
	}
	f.Note = fmt.Sprintf("silenced client connections to leader %s for %v (it %s); healed", l.id, blackholeHold, still)
	return f, nil
}
