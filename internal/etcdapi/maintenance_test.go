package etcdapi_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	tpb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/etcdapi"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// snapshotFile reads an etcd Snapshot stream whole, as etcd's clients
// write it to a file, and checks it as clientv3's snapshot.Save does: a
// size 32 bytes past a multiple of 512, ending in the SHA-256 of what
// came before.
func snapshotFile(t *testing.T, m pb.MaintenanceClient) []byte {
	t.Helper()
	stream, err := m.Snapshot(ctxT(t), &pb.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var file []byte
	for first := true; ; first = false {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("snapshot stream: %v", err)
		}
		if first && r.Header == nil {
			t.Fatal("the first snapshot message has no header")
		}
		file = append(file, r.Blob...)
	}
	if len(file)%512 != sha256.Size {
		t.Fatalf("snapshot of %d bytes: etcd's clients want 32 bytes past a multiple of 512", len(file))
	}
	body := file[:len(file)-sha256.Size]
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], file[len(body):]) {
		t.Fatal("the snapshot does not end in the SHA-256 of its content")
	}
	return file
}

// TestSnapshotRestoresWithTenure: etcd's Snapshot streams a file etcd's
// clients accept, and `tenure snapshot restore` (Tenure's SnapshotRestore)
// brings back the state it holds.
func TestSnapshotRestoresWithTenure(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	e.put(t, "kept", "before the snapshot", 0)
	file := snapshotFile(t, e.maint)
	if _, _, err := fsm.OpenSnapshot(file); err != nil {
		t.Fatalf("the etcd snapshot is not a Tenure snapshot: %v", err)
	}
	// A frame whose content changed is refused, as a changed seal is.
	bad := bytes.Clone(file)
	bad[len(bad)/2] ^= 1
	if _, _, err := fsm.OpenSnapshot(bad); err == nil {
		t.Fatal("a changed etcd snapshot was accepted")
	}
	if _, err := e.kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("kept")}); err != nil {
		t.Fatal(err)
	}
	api := testutil.API(t, e.srv.Addr())
	rs, err := api.SnapshotRestore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&tpb.SnapshotChunk{Data: file, Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.CloseAndRecv(); err != nil {
		t.Fatalf("restoring the etcd snapshot: %v", err)
	}
	r, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("kept")})
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "before the snapshot" {
		t.Fatalf("after the restore: %+v %v", r, err)
	}
}

// TestDefragmentSnapshotsAndStatusSizes: Defragment succeeds and takes a
// snapshot of the node's state (after which raft truncates the log it
// covers); Status reports the data directory's size and the part of it in
// use, which is never more; a standalone node's member has a peer URL.
func TestDefragmentSnapshotsAndStatusSizes(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	for i := range 50 {
		e.put(t, "k", string(rune('a'+i%26)), 0)
	}
	snaps := func() int {
		es, _ := os.ReadDir(filepath.Join(e.srv.DataDir, "snapshots", "snapshots")) // raft's file store
		return len(es)
	}
	if n := snaps(); n != 0 {
		t.Fatalf("%d snapshots before Defragment", n)
	}
	d, err := e.maint.Defragment(ctx, &pb.DefragmentRequest{})
	if err != nil {
		t.Fatalf("defragment: %v", err)
	}
	checkHeader(t, d.Header)
	if n := snaps(); n != 1 {
		t.Fatalf("%d snapshots after Defragment, want 1", n)
	}
	// Nothing new since: it succeeds again.
	if _, err := e.maint.Defragment(ctx, &pb.DefragmentRequest{}); err != nil {
		t.Fatalf("defragment again: %v", err)
	}
	// A second snapshot: raft keeps the first as a fallback, which a
	// restart does not read, so it is not in use.
	e.put(t, "k", "after", 0)
	if _, err := e.maint.Defragment(ctx, &pb.DefragmentRequest{}); err != nil {
		t.Fatalf("defragment after a write: %v", err)
	}
	if n := snaps(); n != 2 {
		t.Fatalf("%d snapshots after the second Defragment, want 2", n)
	}
	st, err := e.maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.DbSizeInUse <= 0 || st.DbSizeInUse >= st.DbSize {
		t.Fatalf("db size %d, in use %d: want 0 < in use < size", st.DbSize, st.DbSizeInUse)
	}
	ml, err := e.cluster.MemberList(ctx, &pb.MemberListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if u := ml.Members[0].PeerURLs; len(u) != 1 || u[0] != "http://"+e.srv.EtcdAddr() {
		t.Fatalf("standalone member's peer URLs %v", u)
	}
	// MoveLeader to the only member, which leads: done; to anyone else:
	// etcd's "bad leader transferee".
	if _, err := e.maint.MoveLeader(ctx, &pb.MoveLeaderRequest{TargetID: st.Leader}); err != nil {
		t.Fatalf("move leader to the leader: %v", err)
	}
	_, err = e.maint.MoveLeader(ctx, &pb.MoveLeaderRequest{TargetID: st.Leader + 1})
	wantErr(t, err, rpctypes.ErrGRPCBadLeaderTransferee)
}

// TestMoveLeaderAndSnapshotInACluster: on a 3-node cluster, MoveLeader
// sent to a follower hands the leadership to the target member (by its
// etcd member id), and a follower relays the leader's snapshot.
func TestMoveLeaderAndSnapshotInACluster(t *testing.T) {
	testutil.Slow(t)
	root := t.TempDir()
	ids := []string{"n1", "n2", "n3"}
	peers := map[string]string{}
	for _, id := range ids {
		peers[id] = testutil.FreeAddr(t, 61000, 65000)
	}
	daemons := map[string]*daemon.Daemon{}
	for _, id := range ids {
		d, err := daemon.Start(daemon.Config{NodeID: id, DataDir: filepath.Join(root, id), Listen: "127.0.0.1:0",
			EtcdListen: "127.0.0.1:0", PeerListen: peers[id], BootstrapPeers: peers, LogOutput: testutil.LogWriter(t, id)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		daemons[id] = d
	}
	for id, d := range daemons {
		select {
		case <-d.Ready():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not ready", id)
		}
	}
	leader := func() string {
		for id, d := range daemons {
			if d.Node.IsLeader() {
				return id
			}
		}
		return ""
	}
	testutil.WaitFor(t, "a leader", 20*time.Second, func() bool { return leader() != "" })
	old := leader()
	var followers []string
	for _, id := range ids {
		if id != old {
			followers = append(followers, id)
		}
	}
	via, target := followers[0], followers[1]
	conn, err := grpc.NewClient(daemons[via].EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	m := pb.NewMaintenanceClient(conn)
	// Every member has published its etcd address once its own is known
	// to the leader (forwarding needs it).
	testutil.WaitFor(t, "the snapshot through a follower", 20*time.Second, func() bool {
		s, err := m.Snapshot(ctxT(t), &pb.SnapshotRequest{})
		if err != nil {
			return false
		}
		_, err = s.Recv()
		return err == nil
	})
	if _, _, err := fsm.OpenSnapshot(snapshotFile(t, m)); err != nil {
		t.Fatalf("the snapshot a follower relayed: %v", err)
	}
	if _, err := m.MoveLeader(ctxT(t), &pb.MoveLeaderRequest{TargetID: etcdapi.MemberID(target)}); err != nil {
		t.Fatalf("move leader to %s through %s: %v", target, via, err)
	}
	testutil.WaitFor(t, "the new leader", 20*time.Second, func() bool { return leader() == target })
	testutil.WaitFor(t, "the follower's view of the new leader", 20*time.Second, func() bool {
		st, err := m.Status(ctxT(t), &pb.StatusRequest{})
		return err == nil && st.Leader == etcdapi.MemberID(target)
	})
}

// TestMaintenanceAndNestedTxnRights: under auth, Defragment, Snapshot
// and MoveLeader need cluster write (etcd asks root of them), and a
// nested transaction needs the rights of its ops, as etcd's
// checkTxnReqsPermission asks.
func TestMaintenanceAndNestedTxnRights(t *testing.T) {
	e, n, _ := startAuth(t)
	ctx := ctxT(t)
	app := withToken(ctx, n.token(t, "app", "kv:app/:write").GetSecret())
	root := withToken(ctx, n.root)
	_, err := e.maint.Defragment(app, &pb.DefragmentRequest{})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	st, err := e.maint.Status(app, &pb.StatusRequest{})
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	_, err = e.maint.MoveLeader(app, &pb.MoveLeaderRequest{TargetID: st.Leader})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	s, err := e.maint.Snapshot(app, &pb.SnapshotRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	if _, err := e.maint.Defragment(root, &pb.DefragmentRequest{}); err != nil {
		t.Fatalf("defragment as root: %v", err)
	}
	nested := &pb.TxnRequest{Success: []*pb.RequestOp{putOp("app/a", "1"), txnOp(&pb.TxnRequest{Failure: []*pb.RequestOp{putOp("secret/b", "2")}})}}
	_, err = e.kv.Txn(app, nested)
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	nested = &pb.TxnRequest{Success: []*pb.RequestOp{txnOp(&pb.TxnRequest{Compare: []*pb.Compare{keyExists("secret/c")}})}}
	_, err = e.kv.Txn(app, nested)
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	if _, err := e.kv.Txn(app, &pb.TxnRequest{Success: []*pb.RequestOp{txnOp(&pb.TxnRequest{Success: []*pb.RequestOp{putOp("app/b", "2")}})}}); err != nil {
		t.Fatalf("a nested transaction within the token's rules: %v", err)
	}
}
