package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// linkedCluster is a cluster whose every directed peer link i→j runs
// through its own proxy, so that links can be cut.
type linkedCluster struct {
	ms    []*member
	links map[[2]int]*testutil.Proxy
}

func startLinkedCluster(t *testing.T, n int) *linkedCluster {
	t.Helper()
	lc := &linkedCluster{ms: make([]*member, n), links: make(map[[2]int]*testutil.Proxy)}
	var peers []string
	for i := range lc.ms {
		lc.ms[i] = &member{id: fmt.Sprintf("n%d", i+1), addr: freeAddr(t), peer: freeAddr(t)}
		peers = append(peers, lc.ms[i].id+"="+lc.ms[i].peer)
	}
	root := t.TempDir()
	for i, m := range lc.ms {
		var routes []string
		for j, o := range lc.ms {
			if i == j {
				continue
			}
			px := testutil.StartProxy(t, o.peer)
			lc.links[[2]int{i, j}] = px
			routes = append(routes, o.id+"="+px.Addr())
		}
		m.p = start(t, m.id, m.addr, "serve", "--http-listen", "127.0.0.1:0", "--node-id", m.id, "--listen", m.addr, "--peer-listen", m.peer,
			"--data-dir", filepath.Join(root, m.id), "--bootstrap-peers", strings.Join(peers, ","),
			"--peer-route", strings.Join(routes, ","))
	}
	for _, m := range lc.ms {
		testutil.WaitFor(t, m.id+"'s ready line", 30*time.Second, func() bool {
			if m.p.exited() {
				t.Fatalf("%s exited with %d: %s", m.id, m.p.status, m.p.stderr())
			}
			return strings.HasPrefix(m.p.stdout(), "tenure: serving on "+m.addr)
		})
	}
	return lc
}

// isolate cuts (or, with heal, restores) every link between group a and group b.
func (lc *linkedCluster) isolate(a, b []int, heal bool) {
	for _, i := range a {
		for _, j := range b {
			for _, l := range [][2]int{{i, j}, {j, i}} {
				if heal {
					lc.links[l].Unblock()
				} else {
					lc.links[l].Block()
				}
			}
		}
	}
}

func nodeStatus(t *testing.T, ctx context.Context, addr string) (leader string, revision uint64, err error) {
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close() // called in polling loops: not kept until the test ends
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := c.Status(sctx)
	return st.GetLeader(), st.GetRevision(), err
}

// TestFiveNodesTwoFollowersPartitioned: with two followers cut off, the
// majority keeps committing; after healing, the two catch up.
func TestFiveNodesTwoFollowersPartitioned(t *testing.T) {
	lc := startLinkedCluster(t, 5)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leaderID, _, err := nodeStatus(t, ctx, lc.ms[0].addr)
	if err != nil {
		t.Fatal(err)
	}
	var majority, minority []int
	for i, m := range lc.ms {
		if m.id != leaderID && len(minority) < 2 {
			minority = append(minority, i)
		} else {
			majority = append(majority, i)
		}
	}
	var majAddrs []string
	for _, i := range majority {
		majAddrs = append(majAddrs, lc.ms[i].addr)
	}
	c := dial(t, ctx, strings.Join(majAddrs, ","))

	// One change first, so that the tokens 1..20 below are issued (a
	// fenced write's token may not be above the revision).
	if _, err := c.Put(ctx, "start", nil); err != nil {
		t.Fatal(err)
	}
	lc.isolate(minority, majority, false)
	var last client.PutResult
	for i := 1; i <= 20; i++ {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		last, err = c.FencedPut(wctx, "reg", []byte(fmt.Sprint(i)), uint64(i), "")
		wcancel()
		if err != nil {
			t.Fatalf("write %d with two followers cut off: %v", i, err)
		}
	}
	for _, i := range minority {
		_, rev, err := nodeStatus(t, ctx, lc.ms[i].addr)
		if err == nil && rev >= last.Revision {
			t.Fatalf("%s applied revision %d while cut off", lc.ms[i].id, rev)
		}
	}

	// A cut-off follower can still answer a serializable read, stale, but
	// never a linearizable one.
	cut := lc.ms[minority[0]].addr
	stale := dial(t, ctx, cut, client.WithSerializableReads())
	if reg, err := stale.FencedGet(ctx, "reg"); err != nil || reg.Token >= 20 {
		t.Fatalf("serializable read on a cut-off follower: %+v %v", reg, err)
	}
	strict := dial(t, ctx, cut)
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second) // it waits for a leader that cannot come
	reg, err := strict.FencedGet(sctx, "reg")
	scancel()
	if !errors.Is(err, client.ErrNoLeader) {
		t.Fatalf("linearizable read on a cut-off follower: %+v %v, want ErrNoLeader", reg, err)
	}

	lc.isolate(minority, majority, true)
	for _, i := range minority {
		m := lc.ms[i]
		testutil.WaitFor(t, m.id+" catching up", 30*time.Second, func() bool {
			_, rev, err := nodeStatus(t, ctx, m.addr)
			return err == nil && rev >= last.Revision
		})
	}
	reg, err = c.FencedGet(ctx, "reg")
	if err != nil || string(reg.Value) != "20" || reg.Token != 20 {
		t.Fatalf("register after heal: %+v %v", reg, err)
	}
}

// TestQueueDequeueMovesOffADemotedLeader: a consumer waits in Dequeue on
// the leader; the leader is cut off from its peers (the consumer's own
// connection to it stays up) and steps down. The waiting dequeue moves to
// the new leader by itself and receives the next item there, instead of
// staying blocked on the old leader until its deadline.
func TestQueueDequeueMovesOffADemotedLeader(t *testing.T) {
	lc := startLinkedCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, consumer := dial(t, ctx, endpoints(lc.ms)), dial(t, ctx, endpoints(lc.ms))
	leader, _ := leaderOf(t, ctx, admin, lc.ms)
	var li int
	var majority []*member
	var others []int
	for i, m := range lc.ms {
		if m == leader {
			li = i
		} else {
			majority = append(majority, m)
			others = append(others, i)
		}
	}

	type result struct {
		d   *client.Delivery
		err error
	}
	got := make(chan result, 1)
	dctx, dcancel := context.WithTimeout(ctx, 90*time.Second)
	defer dcancel()
	go func() {
		d, err := consumer.Queue("jobs").Dequeue(dctx, 30*time.Second)
		got <- result{d, err}
	}()
	testutil.WaitFor(t, "the consumer to wait on the leader", 30*time.Second, func() bool {
		st, err := admin.Queue("jobs").Stats(ctx)
		return err == nil && st.Waiting == 1
	})

	lc.isolate([]int{li}, others, false)
	defer lc.isolate([]int{li}, others, true)
	producer := dial(t, ctx, endpoints(majority))
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := producer.Queue("jobs").Enqueue(pctx, []byte("after the fail-over"))
		pcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the majority never took the enqueue: %v", err)
		}
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("dequeue: %v", r.err)
		}
		if string(r.d.Payload) != "after the fail-over" {
			t.Fatalf("dequeued %q", r.d.Payload)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the dequeue stayed blocked on the old leader")
	}
}
