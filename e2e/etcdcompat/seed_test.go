package etcdcompat

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The lock and the guarded write below are copied from the article the
// project started from (a lock written against etcd's Go client), with
// its comments translated; only the lease TTL is a variable, so that the
// test need not wait the article's 15 s for a lease to expire.

var (
	ErrLockHeld = errors.New("lock held")
	ErrFenced   = errors.New("fenced: ownership lost")
)

// leaseTTL is the article's 15 s; the test shortens it.
var leaseTTL int64 = 15

func acquire(ctx context.Context, cli *clientv3.Client, key, me string) (int64, error) {
	// 1. A lease of 15 s. The TTL bounds the idle time after the holder fails.
	lease, err := cli.Grant(ctx, leaseTTL)
	if err != nil {
		return 0, err
	}

	// 2. Renewal in a goroutine of its own. The channel MUST be drained:
	//    a full buffer -> "lease keepalive response queue is full" -> the lease is lost.
	ka, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		return 0, err
	}
	go func() {
		for range ka { // drain silently; the channel closing = the lease is lost
		}
	}()

	// 3. An atomic take: it succeeds only if the key does not exist yet.
	//    WithRequireLeader rejects an answer from a node cut off from the quorum.
	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, me, clientv3.WithLease(lease.ID))).
		Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, ErrLockHeld // the lock is taken: wait with a Watch, do not poll
	}

	// 4. The revision of the successful Put = our key's CreateRevision = the fencing token.
	return resp.Header.Revision, nil
}

// Every significant operation goes under the token's protection: one
// transaction checks that the key is still ours and was created by us.
func guardedWrite(ctx context.Context, cli *clientv3.Client,
	key string, fence int64, dataKey, payload string) error {

	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", fence)).
		Then(clientv3.OpPut(dataKey, payload)).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return ErrFenced // ownership is lost: stop, do not retry
	}
	return nil
}

// TestSeedGuardedWrite runs the article's code: A acquires and writes
// under its fence; B finds the lock held; A stops renewing (a pause), its
// lease expires and B takes the key; A's late guarded write is refused
// and B's value stays. The fences are Tenure's revisions: a Tenure lock
// granted between the two holders gets a token between their fences.
func TestSeedGuardedWrite(t *testing.T) {
	leaseTTL = 2
	tn := startTenure(t)
	cliA, cliB := client(t, tn.Etcd), client(t, tn.Etcd)
	ctx := tctx(t)
	ctxA, pauseA := context.WithCancel(ctx)
	const key, data = "lock/shard-7", "shard-7/state"

	fenceA, err := acquire(ctxA, cliA, key, "A")
	if err != nil {
		t.Fatal(err)
	}
	if err := guardedWrite(ctx, cliA, key, fenceA, data, "A1"); err != nil {
		t.Fatalf("A's write under its fence: %v", err)
	}
	if _, err := acquire(ctx, cliB, key, "B"); !errors.Is(err, ErrLockHeld) {
		t.Fatalf("B while A holds: %v", err)
	}

	// A pauses: its keepalives stop, and the lease expires after its TTL.
	pauseA()
	waitFor(t, 15*time.Second, "A's lease to expire", func() bool {
		g, err := cliB.Get(ctx, key)
		return err == nil && len(g.Kvs) == 0
	})
	token := tenureLockToken(t, tn.Listen)
	fenceB, err := acquire(ctx, cliB, key, "B")
	if err != nil {
		t.Fatal(err)
	}
	if !(fenceA < token && token < fenceB) {
		t.Fatalf("fence A %d, Tenure token %d, fence B %d: one revision sequence orders them", fenceA, token, fenceB)
	}
	if err := guardedWrite(ctx, cliB, key, fenceB, data, "B1"); err != nil {
		t.Fatal(err)
	}

	// A wakes up and writes with its old fence.
	if err := guardedWrite(ctx, cliA, key, fenceA, data, "A2"); !errors.Is(err, ErrFenced) {
		t.Fatalf("A's late write: %v, want ErrFenced (Succeeded=false)", err)
	}
	if g, err := cliB.Get(ctx, data); err != nil || string(g.Kvs[0].Value) != "B1" {
		t.Fatalf("the data after A's late write: %v %v", g, err)
	}
}

// tenureLockToken takes and releases a Tenure lock with the tenure CLI and
// returns its fencing token.
func tenureLockToken(t *testing.T, endpoint string) int64 {
	t.Helper()
	out, err := exec.Command(filepath.Join(bin, "tenure"), "--endpoint", endpoint, "lock", "between", "--", "sh", "-c", "echo $TENURE_FENCE_TOKEN").CombinedOutput()
	if err != nil {
		t.Fatalf("tenure lock: %v: %s", err, out)
	}
	token, err := strconv.ParseInt(strings.TrimSpace(lines(string(out))[len(lines(string(out)))-1]), 10, 64)
	if err != nil {
		t.Fatalf("tenure lock's token: %v: %s", err, out)
	}
	return token
}
