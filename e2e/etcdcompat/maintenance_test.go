package etcdcompat

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEtcdctlMaintenance: etcdctl's maintenance commands on a node:
// `defrag` succeeds, `snapshot save` writes a file etcdctl accepts and
// `tenure snapshot restore` restores, and `endpoint status` reports the
// data directory's size and the part of it in use.
func TestEtcdctlMaintenance(t *testing.T) {
	tn := startTenure(t)
	ep := tn.Etcd
	etcdctl(t, ep, "", "put", "kept", "before the snapshot")
	if out := etcdctl(t, ep, "", "defrag"); !strings.Contains(out, "Finished defragmenting etcd member") {
		t.Fatalf("defrag: %q", out)
	}
	file := filepath.Join(t.TempDir(), "backup.db")
	if out := etcdctl(t, ep, "", "snapshot", "save", file); !strings.Contains(out, "Snapshot saved at "+file) {
		t.Fatalf("snapshot save: %q", out)
	}
	etcdctl(t, ep, "", "put", "kept", "after the snapshot")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	restore := exec.CommandContext(ctx, filepath.Join(bin, "tenure"), "snapshot", "restore", file, "--force", "--endpoint", tn.Listen)
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("tenure snapshot restore of etcdctl's file: %v\n%s", err, out)
	}
	if got := lines(etcdctl(t, ep, "", "get", "kept", "--print-value-only")); strings.Join(got, "|") != "before the snapshot" {
		t.Fatalf("after the restore: %q", got)
	}
	var st []struct {
		Status struct {
			DbSize      int64 `json:"dbSize"`
			DbSizeInUse int64 `json:"dbSizeInUse"`
		}
	}
	if err := json.Unmarshal([]byte(etcdctl(t, ep, "", "endpoint", "status", "-w", "json")), &st); err != nil || len(st) != 1 {
		t.Fatalf("status json: %v", err)
	}
	if s := st[0].Status; s.DbSize <= 0 || s.DbSizeInUse <= 0 || s.DbSizeInUse > s.DbSize {
		t.Fatalf("db size %d, in use %d", s.DbSize, s.DbSizeInUse)
	}
}

// TestEtcdctlMoveLeader: on a 3-node cluster, `etcdctl move-leader` with
// every endpoint hands the leadership to the member named, and `endpoint
// status` then shows it leading.
func TestEtcdctlMoveLeader(t *testing.T) {
	ns := startCluster(t, 3)
	eps := strings.Join(etcdEndpoints(ns), ",")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader := leaderNode(t, ctx, ns)
	var target *node
	for _, m := range ns {
		if m != leader {
			target = m
			break
		}
	}
	var ml struct {
		Members []struct {
			ID   uint64
			Name string
		}
	}
	if err := json.Unmarshal([]byte(etcdctl(t, eps, "", "member", "list", "-w", "json")), &ml); err != nil {
		t.Fatal(err)
	}
	var id uint64
	for _, m := range ml.Members {
		if m.Name == target.id {
			id = m.ID
		}
	}
	if id == 0 {
		t.Fatalf("no member %s in %+v", target.id, ml)
	}
	// Every member must know the leader's etcd address to forward; the
	// leader answers move-leader itself.
	out := etcdctl(t, eps, "", "move-leader", fmt.Sprintf("%x", id))
	if !strings.Contains(out, "Leadership transferred") {
		t.Fatalf("move-leader: %q", out)
	}
	waitFor(t, 30*time.Second, target.id+" leading", func() bool { return leaderNode(t, ctx, ns) == target })
}

// TestPythonEtcd3NestedTxn: Debian's python3-etcd3 (.ci/setup-maint.sh
// installs it) sends a nested transaction (transactions.txn) as etcd 3.3+
// takes it: the nested compare reads the state before the transaction,
// so its failure branch runs, after the outer put, which a range inside
// it sees.
func TestPythonEtcd3NestedTxn(t *testing.T) {
	host, port, err := net.SplitHostPort(startTenure(t).Etcd)
	if err != nil {
		t.Fatal(err)
	}
	script := `
import sys, etcd3
c = etcd3.client(host=sys.argv[1], port=int(sys.argv[2]))
t = c.transactions
ok, rs = c.transaction(compare=[], success=[
    t.put('a', '1'),
    t.txn(compare=[t.version('a') > 0], success=[t.put('b', 'then')], failure=[t.put('b', 'else'), t.get('a')]),
], failure=[])
inner = rs[1].response_txn
print(ok, inner.succeeded, c.get('b')[0].decode(), inner.responses[1].response_range.kvs[0].value.decode())
`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "/usr/bin/python3", "-c", script, host, port).CombinedOutput()
	if err != nil {
		t.Fatalf("python3-etcd3 (Debian's python3-etcd3: .ci/setup-maint.sh installs it): %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "True False else 1" {
		t.Fatalf("python3-etcd3's nested transaction: %q, want %q", got, "True False else 1")
	}
}
