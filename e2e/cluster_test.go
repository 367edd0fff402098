package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

type member struct {
	id, addr, peer string
	p              *proc
}

// startCluster runs n `tenure serve` processes bootstrapped together on
// loopback and waits until each one serves.
func startCluster(t *testing.T, n int) []*member {
	t.Helper()
	ms := make([]*member, n)
	var peers []string
	for i := range ms {
		ms[i] = &member{id: fmt.Sprintf("n%d", i+1), addr: freeAddr(t), peer: freeAddr(t)}
		peers = append(peers, ms[i].id+"="+ms[i].peer)
	}
	root := t.TempDir()
	for _, m := range ms {
		m.p = start(t, m.id, m.addr, "serve", "--http-listen", "127.0.0.1:0", "--node-id", m.id, "--listen", m.addr, "--peer-listen", m.peer,
			"--data-dir", filepath.Join(root, m.id), "--bootstrap-peers", strings.Join(peers, ","))
	}
	for _, m := range ms {
		testutil.WaitFor(t, m.id+"'s ready line", 30*time.Second, func() bool {
			if m.p.exited() {
				t.Fatalf("%s exited with %d: %s", m.id, m.p.status, m.p.stderr())
			}
			return strings.HasPrefix(m.p.stdout(), "tenure: serving on "+m.addr)
		})
	}
	return ms
}

func endpoints(ms []*member) string {
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.addr)
	}
	return strings.Join(eps, ",")
}

// leaderOf returns the member c's status names as the leader, and the others.
func leaderOf(t *testing.T, ctx context.Context, c *client.Client, ms []*member) (leader *member, others []*member) {
	t.Helper()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.id == st.GetLeader() {
			leader = m
		} else {
			others = append(others, m)
		}
	}
	if leader == nil {
		t.Fatalf("no leader in %v", st)
	}
	return leader, others
}

// TestClusterLeaderKilledKeepsHoldsAndOrder: kill -9 the leader of a
// 3-node cluster while a lock is held and 10 clients wait. A new leader
// serves; the holder keeps its hold and token; the waiters are granted in
// their original order; every new token is larger than any before.
func TestClusterLeaderKilledKeepsHoldsAndOrder(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dial(t, ctx, endpoints(ms))

	holderSess, err := c.NewSession(ctx, client.WithTTL(10*time.Second), client.WithOwner("holder"))
	if err != nil {
		t.Fatal(err)
	}
	hm, _ := holderSess.Mutex("res")
	hold, err := hm.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	changes := hold.Changes()

	const waiters = 10
	sessions := make([]*client.Session, waiters)
	for i := range sessions {
		s, err := c.NewSession(ctx, client.WithTTL(10*time.Second), client.WithOwner(fmt.Sprintf("w%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	granted, errs := testutil.QueueWaiters(t, ctx, sessions, "res")

	leader, others := leaderOf(t, ctx, c, ms)
	killed := time.Now()
	if err := leader.p.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	<-leader.p.done

	// A new leader serves writes.
	rest := dial(t, ctx, endpoints(others))
	for {
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		_, err := rest.FencedPut(wctx, "probe", []byte("x"), 1, "")
		wcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no leader serving writes: %v", err)
		}
	}
	failover := time.Since(killed)
	t.Logf("leader %s killed; a new leader served a write after %v", leader.id, failover)
	if failover > 15*time.Second {
		t.Fatalf("fail-over took %v", failover)
	}

	// The holder went suspect at most, and holds again with its token.
	deadline := time.After(30 * time.Second)
	for hold.State() != client.Held || hold.Context().Err() != nil {
		select {
		case s, ok := <-changes:
			if !ok || s == client.Lost {
				t.Fatalf("hold lost across fail-over: %v", hold.Err())
			}
		case <-deadline:
			t.Fatalf("hold state %v after fail-over", hold.State())
		}
	}
	ls, err := rest.LockStatus(ctx, "res")
	if err != nil {
		t.Fatal(err)
	}
	if ls.GetHolder().GetSession() != holderSess.ID() || ls.GetHolder().GetToken() != hold.Token() {
		t.Fatalf("holder after fail-over %v, want session %d token %d", ls.GetHolder(), holderSess.ID(), hold.Token())
	}
	if len(ls.GetWaiters()) != waiters {
		t.Fatalf("%d waiters after fail-over, want %d", len(ls.GetWaiters()), waiters)
	}

	if err := hold.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFIFO(t, ctx, granted, errs, waiters, hold.Token())
}
