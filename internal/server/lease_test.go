//go:build tenurefault

package server_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

// linkedMembers is an in-process cluster whose every directed peer link
// i→j runs through its own proxy, so that a member can be cut off.
type linkedMembers struct {
	ms    []*member
	links map[[2]int]*testutil.Proxy
}

// startLinkedMembers starts n voters whose lessors run on clk.
func startLinkedMembers(t *testing.T, n int, clk clock.Clock) *linkedMembers {
	return startLinkedMembersFaults(t, n, clk, node.Faults{})
}

// startLinkedMembersFaults is startLinkedMembers with faults (its
// PeerRoutes are set to the proxies).
func startLinkedMembersFaults(t *testing.T, n int, clk clock.Clock, faults node.Faults) *linkedMembers {
	t.Helper()
	root := t.TempDir()
	lc := &linkedMembers{ms: make([]*member, n), links: make(map[[2]int]*testutil.Proxy)}
	peers := make(map[string]string)
	for i := 0; i < n; i++ {
		peers[fmt.Sprint("n", i+1)] = freePort(t)
	}
	started := make(chan error, n)
	for i := 0; i < n; i++ {
		id := fmt.Sprint("n", i+1)
		routes := make(map[string]string)
		for j := 0; j < n; j++ {
			if j == i {
				continue
			}
			other := fmt.Sprint("n", j+1)
			px := testutil.StartProxy(t, peers[other])
			lc.links[[2]int{i, j}] = px
			routes[other] = px.Addr()
		}
		faults.PeerRoutes = routes
		d, err := daemon.Start(daemon.Config{NodeID: id, DataDir: filepath.Join(root, id), Listen: "127.0.0.1:0", PeerListen: peers[id], BootstrapPeers: peers, Faults: faults, Clock: clk, LogOutput: testutil.LogWriter(t, id)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		m := &member{id: id, peer: peers[id], d: d}
		m.stop = func() { cancel(); <-done }
		t.Cleanup(m.stop)
		lc.ms[i] = m
		go func() {
			select {
			case <-d.Ready():
				started <- nil
			case err := <-done:
				started <- fmt.Errorf("%s stopped: %v", id, err)
			case <-time.After(30 * time.Second):
				started <- fmt.Errorf("%s not ready", id)
			}
		}()
	}
	for range lc.ms {
		if err := <-started; err != nil {
			t.Fatal(err)
		}
	}
	return lc
}

// leader waits until the members agree on a leader and returns its index.
func (lc *linkedMembers) leader(t *testing.T) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for i, m := range lc.ms {
			if st := m.d.Node.Status(); st.Leader == m.id {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader")
	return -1
}

// cut blocks (or, with heal, restores) every link from and to member i.
func (lc *linkedMembers) cut(i int, heal bool) {
	for l, px := range lc.links {
		if l[0] == i || l[1] == i {
			if heal {
				px.Unblock()
			} else {
				px.Block()
			}
		}
	}
}

// TestDeposedLeaderConfirmsNoKeepAlive: a leader cut off from its peers
// does not confirm a keepalive once its leadership was last confirmed
// longer ago than its lease, even before raft has noticed and stepped
// down: a new leader may already count the session's TTL from its own
// promotion. The member that leads next confirms it.
func TestDeposedLeaderConfirmsNoKeepAlive(t *testing.T) {
	clk := clock.NewFake()
	lc := startLinkedMembers(t, 3, clk)
	li := lc.leader(t)
	leader := lc.ms[li].d.Node
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := leader.Propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "o", TtlMs: 60_000, SecretHash: fsm.HashSecret(make([]byte, fsm.SecretBytes))}}})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Session
	if _, err := leader.KeepAlive(ctx, id); err != nil {
		t.Fatalf("keepalive on the leader: %v", err)
	}
	lc.cut(li, false)
	clk.Advance(time.Second) // the leader's lease has run out
	if ttl, err := leader.KeepAlive(ctx, id); !errors.Is(err, node.ErrNotLeader) {
		t.Fatalf("keepalive on a cut-off leader: ttl %v, err %v; want ErrNotLeader", ttl, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var errs []error
		for i, m := range lc.ms {
			if i == li {
				continue
			}
			_, err := m.d.Node.KeepAlive(ctx, id)
			if err == nil {
				return
			}
			errs = append(errs, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no other member confirms the keepalive: %v", errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
