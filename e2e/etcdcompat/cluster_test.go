package etcdcompat

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	for range 200 {
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(20000))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no free loopback port")
	return ""
}

// node is one member of a cluster the test runs.
type node struct {
	id, listen, peer, etcd string
	p                      *proc
}

// startCluster runs n `tenure serve` processes bootstrapped together, each
// with its etcd API on, and waits until each one serves.
func startCluster(t *testing.T, n int) []*node {
	t.Helper()
	ns := make([]*node, n)
	var peers []string
	for i := range ns {
		ns[i] = &node{id: fmt.Sprintf("n%d", i+1), listen: freeAddr(t), peer: freeAddr(t), etcd: freeAddr(t)}
		peers = append(peers, ns[i].id+"="+ns[i].peer)
	}
	root := t.TempDir()
	for _, m := range ns {
		m.p = startProc(t, "", filepath.Join(bin, "tenure"), "serve", "-o", "json", "--http-listen", "", "--node-id", m.id, "--listen", m.listen,
			"--peer-listen", m.peer, "--etcd-listen", m.etcd, "--data-dir", filepath.Join(root, m.id), "--bootstrap-peers", strings.Join(peers, ","))
	}
	for _, m := range ns {
		waitFor(t, 30*time.Second, m.id+"'s ready line", func() bool {
			var out serveOutput
			line, _, _ := strings.Cut(m.p.stdout(), "\n")
			return json.Unmarshal([]byte(line), &out) == nil && out.Etcd == m.etcd
		})
	}
	return ns
}

func etcdEndpoints(ns []*node) []string {
	var eps []string
	for _, m := range ns {
		eps = append(eps, m.etcd)
	}
	return eps
}

// leaderNode returns the member whose etcd Status says it leads.
func leaderNode(t *testing.T, ctx context.Context, ns []*node) *node {
	t.Helper()
	var leader *node
	waitFor(t, 30*time.Second, "a leader", func() bool {
		for _, m := range ns {
			select {
			case <-m.p.done:
				continue
			default:
			}
			c := client(t, m.etcd)
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := c.Status(sctx, m.etcd)
			cancel()
			c.Close()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				leader = m
				return true
			}
		}
		return false
	})
	return leader
}

// TestClusterFailover: a 3-node cluster, every endpoint given to clientv3.
// Every write succeeds (those that reach a follower are forwarded to the
// leader), members list each other's client URLs, and after the leader is
// killed with SIGKILL a writer goes on: each write that failed while the
// cluster elected a new leader succeeds when retried, every acknowledged
// write is there afterwards, and a concurrency.Mutex still works.
func TestClusterFailover(t *testing.T) {
	ns := startCluster(t, 3)
	ctx := tctx(t)
	cli := client(t, etcdEndpoints(ns)...)

	// The members' client URLs (published to each other), and a write
	// through each endpoint alone: a follower forwards it.
	waitFor(t, 20*time.Second, "every member's client URL", func() bool {
		ml, err := cli.MemberList(ctx)
		if err != nil || len(ml.Members) != 3 {
			return false
		}
		for _, m := range ml.Members {
			if len(m.ClientURLs) != 1 || len(m.PeerURLs) != 1 {
				return false
			}
		}
		return true
	})
	for _, m := range ns {
		c := client(t, m.etcd)
		if _, err := c.Put(ctx, "via/"+m.id, m.id); err != nil {
			t.Fatalf("a put through %s: %v", m.id, err)
		}
		g, err := c.Get(ctx, "via/", clientv3.WithPrefix())
		if err != nil || g.Count == 0 {
			t.Fatalf("a linearizable get through %s: %v %v", m.id, g, err)
		}
		l, err := c.Grant(ctx, 10)
		if err != nil {
			t.Fatalf("a lease through %s: %v", m.id, err)
		}
		if ka, err := c.KeepAliveOnce(ctx, l.ID); err != nil || ka.TTL != 10 {
			t.Fatalf("a keepalive through %s: %v %v", m.id, ka, err)
		}
		if ttl, err := c.TimeToLive(ctx, l.ID); err != nil || ttl.GrantedTTL != 10 {
			t.Fatalf("timetolive through %s: %v %v", m.id, ttl, err)
		}
	}

	// A writer, then the leader killed under it.
	type ack struct {
		key string
		rev int64
	}
	acks := make(chan ack, 10000)
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	retried := 0
	go func() {
		defer close(acks)
		for i := 0; ; i++ {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			key := fmt.Sprintf("w/%05d", i)
			deadline := time.Now().Add(20 * time.Second)
			for {
				wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				r, err := cli.Put(wctx, key, "v")
				cancel()
				if err == nil {
					acks <- ack{key, r.Header.Revision}
					break
				}
				if time.Now().After(deadline) {
					writerDone <- fmt.Errorf("write %s failed for 20s: %v", key, err)
					return
				}
				retried++
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	waitFor(t, 10*time.Second, "writes before the kill", func() bool { return len(acks) >= 50 })
	leader := leaderNode(t, ctx, ns)
	if err := syscall.Kill(-leader.p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := len(acks)
	var rest []*node
	for _, m := range ns {
		if m != leader {
			rest = append(rest, m)
		}
	}
	newLeader := leaderNode(t, ctx, rest)
	waitFor(t, 30*time.Second, "writes after the fail-over", func() bool { return len(acks) >= killedAt+100 })
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	var all []ack
	for a := range acks {
		all = append(all, a)
	}
	t.Logf("%d writes, %d retried; %s killed, %s leads", len(all), retried, leader.id, newLeader.id)
	survivor := client(t, etcdEndpoints(rest)...)
	for i, a := range all {
		g, err := survivor.Get(ctx, a.key)
		if err != nil || len(g.Kvs) != 1 {
			t.Fatalf("acknowledged write %s is missing: %v %v", a.key, g, err)
		}
		if i > 0 && a.rev <= all[i-1].rev {
			t.Fatalf("revisions of acknowledged writes went backwards: %d after %d", a.rev, all[i-1].rev)
		}
	}
	// Locks still work, on the survivors.
	s := session(t, survivor)
	m := concurrency.NewMutex(s, "/after-failover/")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
