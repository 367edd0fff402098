package etcdapi_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/etcdapi"
	"github.com/tenure-io/tenure/internal/testutil"
)

// waitHistory waits until the cluster version keeps the history window
// (3: the leader raises it once it has asked every voter), and returns
// the revision after a put made then: the window holds every revision
// from it on.
func waitHistory(t *testing.T, d *daemon.Daemon, e *etcd) int64 {
	t.Helper()
	waitVersion3(t, d)
	return e.put(t, "history-start", "", 0).Header.Revision
}

// waitVersion3 waits until the cluster version keeps the history window.
func waitVersion3(t *testing.T, d *daemon.Daemon) {
	t.Helper()
	testutil.WaitFor(t, "cluster version 3", 30*time.Second, func() bool { return d.Node.ClusterVersion() >= 3 })
}

// TestRangeAtPastRevision: etcdctl get --rev after other keys changed
// answers the keys as they were (value, version, create and mod revision);
// a key deleted since answers as it was, one created since not at all; a
// transaction's range reads at its revision too; the header carries the
// current revision.
func TestRangeAtPastRevision(t *testing.T) {
	e := start(t, daemon.Config{})
	waitHistory(t, e.srv.Daemon, e)
	ctx := ctxT(t)
	r1 := e.put(t, "p/a", "1", 0).Header.Revision
	r2 := e.put(t, "p/b", "1", 0).Header.Revision
	e.put(t, "p/a", "2", 0)
	if _, err := e.kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("p/b")}); err != nil {
		t.Fatal(err)
	}
	cur := e.put(t, "p/c", "1", 0).Header.Revision
	got, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("p/"), RangeEnd: []byte("p0"), Revision: r2})
	if err != nil {
		t.Fatalf("range at %d: %v", r2, err)
	}
	if keys(got.Kvs) != "p/a=1 p/b=1 " || got.Count != 2 || got.Header.Revision != cur {
		t.Fatalf("at %d: %s count %d header %d", r2, keys(got.Kvs), got.Count, got.Header.Revision)
	}
	if a := got.Kvs[0]; a.Version != 1 || a.CreateRevision != r1 || a.ModRevision != r1 {
		t.Fatalf("p/a at %d: %+v", r2, a)
	}
	got, err = e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("p/a"), Revision: r1, Serializable: true})
	if err != nil || keys(got.Kvs) != "p/a=1 " {
		t.Fatalf("serializable at %d: %v %v", r1, got, err)
	}
	got, err = e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("p/"), RangeEnd: []byte("p0"), Revision: r2, CountOnly: true})
	if err != nil || got.Count != 2 || len(got.Kvs) != 0 {
		t.Fatalf("count only at %d: %v %v", r2, got, err)
	}
	tx, err := e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("p/b"), Revision: r2}}}}})
	if err != nil || keys(tx.Responses[0].GetResponseRange().Kvs) != "p/b=1 " {
		t.Fatalf("txn range at %d: %v %v", r2, tx, err)
	}
	_, err = e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("p/a"), Revision: cur + 10})
	wantErr(t, err, rpctypes.ErrGRPCFutureRev)
}

// TestCompact: Compact moves the window's start: a read before it, and a
// compact of it again, answer "compacted"; a future one "future
// revision"; a watch from before it is cancelled with the compact
// revision, one from it replays.
func TestCompact(t *testing.T) {
	e := start(t, daemon.Config{})
	waitHistory(t, e.srv.Daemon, e)
	ctx := ctxT(t)
	var last int64
	for i := range 10 {
		last = e.put(t, "c", fmt.Sprint(i), 0).Header.Revision
	}
	compact := last - 3
	if _, err := e.kv.Compact(ctx, &pb.CompactionRequest{Revision: compact, Physical: true}); err != nil {
		t.Fatal(err)
	}
	_, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("c"), Revision: compact - 1})
	wantErr(t, err, rpctypes.ErrGRPCCompacted)
	got, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("c"), Revision: compact})
	if err != nil || keys(got.Kvs) != "c=6 " {
		t.Fatalf("at the compact revision: %v %v", got, err)
	}
	_, err = e.kv.Compact(ctx, &pb.CompactionRequest{Revision: compact})
	wantErr(t, err, rpctypes.ErrGRPCCompacted)
	_, err = e.kv.Compact(ctx, &pb.CompactionRequest{Revision: last + 100})
	wantErr(t, err, rpctypes.ErrGRPCFutureRev)

	w, err := e.watch.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cr := create(t, w, &pb.WatchCreateRequest{Key: []byte("c"), StartRevision: compact - 2})
	if r := recvWatch(t, w); !r.Canceled || r.WatchId != cr.WatchId || r.CompactRevision != compact {
		t.Fatalf("watch from before the compact revision %d: %+v", compact, r)
	}
	cr = create(t, w, &pb.WatchCreateRequest{Key: []byte("c"), StartRevision: compact})
	if r := recvWatch(t, w); r.WatchId != cr.WatchId || len(r.Events) != 4 || r.Events[0].Kv.ModRevision != compact {
		t.Fatalf("watch from the compact revision: %+v", r)
	}
}

// TestWatchReplaysTheWindow: a watch from a revision older than this
// node's watch history (--watch-history 4) but inside the history window
// replays every change from the window, with its previous value, then
// goes on live; only a revision before the window is "compacted".
func TestWatchReplaysTheWindow(t *testing.T) {
	cfg := daemon.Config{}
	cfg.Limits.KV.WatchHistory = 4
	cfg.Limits.KV.WatchProgressInterval = time.Minute // nothing but the new change may wake the stream
	e := start(t, cfg)
	first := waitHistory(t, e.srv.Daemon, e) + 1
	for i := range 10 {
		e.put(t, "r", fmt.Sprint(i), 0)
	}
	w, err := e.watch.Watch(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	cr := create(t, w, &pb.WatchCreateRequest{Key: []byte("r"), StartRevision: first, PrevKv: true})
	var evs []*mvccpb.Event
	for len(evs) < 10 {
		r := recvWatch(t, w)
		if r.Canceled || r.WatchId != cr.WatchId {
			t.Fatalf("replay from %d: %+v", first, r)
		}
		evs = append(evs, r.Events...)
	}
	for i, ev := range evs {
		if string(ev.Kv.Value) != fmt.Sprint(i) || ev.Kv.ModRevision != first+int64(i) || (i > 0 && string(ev.PrevKv.Value) != fmt.Sprint(i-1)) {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	live := e.put(t, "r", "live", 0).Header.Revision
	if r := recvWatch(t, w); len(r.Events) != 1 || r.Events[0].Kv.ModRevision != live {
		t.Fatalf("after the replay: %+v", r)
	}
}

// TestHashKVAgreesOnThreeMembers: every member of a 3-node cluster
// answers the same HashKV at the same revision (and Hash at the same
// state), with the window's start and the revision hashed; a write
// changes it.
func TestHashKVAgreesOnThreeMembers(t *testing.T) {
	root := t.TempDir()
	ids := []string{"n1", "n2", "n3"}
	peers := map[string]string{}
	for _, id := range ids {
		peers[id] = testutil.FreeAddr(t, 61000, 65000)
	}
	var clients []pb.MaintenanceClient
	var daemons []*daemon.Daemon
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
		daemons = append(daemons, d)
	}
	for _, d := range daemons {
		select {
		case <-d.Ready():
		case <-time.After(30 * time.Second):
			t.Fatal("not ready")
		}
		conn, err := grpc.NewClient(d.EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, pb.NewMaintenanceClient(conn))
	}
	testutil.WaitFor(t, "cluster version 3", 30*time.Second, func() bool {
		for _, d := range daemons {
			if d.Node.ClusterVersion() < 3 {
				return false
			}
		}
		return true
	})
	conn, err := grpc.NewClient(daemons[0].EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kv := pb.NewKVClient(conn)
	ctx := ctxT(t)
	testutil.WaitFor(t, "a write through member 0", 20*time.Second, func() bool {
		_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("h/start")})
		return err == nil // the leader may not have published its etcd address yet
	})
	var mid, last int64
	for i := range 20 {
		r, err := kv.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprint("h/", i%5)), Value: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		if i == 9 {
			mid = r.Header.Revision
		}
		last = r.Header.Revision
	}
	if _, err := kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("h/3")}); err != nil {
		t.Fatal(err)
	}
	hashAt := func(c pb.MaintenanceClient, rev int64) (*pb.HashKVResponse, error) {
		var resp *pb.HashKVResponse
		var err error
		testutil.WaitFor(t, "the member applies the revision", 20*time.Second, func() bool {
			resp, err = c.HashKV(ctx, &pb.HashKVRequest{Revision: rev})
			return err == nil || err.Error() != rpctypes.ErrGRPCFutureRev.Error()
		})
		return resp, err
	}
	for _, rev := range []int64{mid, last} {
		var want *pb.HashKVResponse
		for i, c := range clients {
			got, err := hashAt(c, rev)
			if err != nil {
				t.Fatalf("member %d, HashKV at %d: %v", i, rev, err)
			}
			if got.HashRevision != rev || got.CompactRevision <= 0 || got.Hash == 0 {
				t.Fatalf("member %d, HashKV at %d: %+v", i, rev, got)
			}
			if want == nil {
				want = got
			} else if got.Hash != want.Hash || got.CompactRevision != want.CompactRevision {
				t.Fatalf("member %d, HashKV at %d: %+v, member 0: %+v", i, rev, got, want)
			}
		}
	}
	a, _ := hashAt(clients[0], mid)
	b, _ := hashAt(clients[0], last)
	if a.Hash == b.Hash {
		t.Fatal("the hash did not change with the writes")
	}
	// Hash: at the current revision; once every member has applied the
	// delete, all agree.
	var hashes []*pb.HashResponse
	testutil.WaitFor(t, "every member at the same revision", 20*time.Second, func() bool {
		hashes = hashes[:0]
		for _, c := range clients {
			h, err := c.Hash(ctx, &pb.HashRequest{})
			if err != nil {
				t.Fatal(err)
			}
			hashes = append(hashes, h)
		}
		return hashes[0].Header.Revision == hashes[1].Header.Revision && hashes[1].Header.Revision == hashes[2].Header.Revision
	})
	if hashes[0].Hash != hashes[1].Hash || hashes[1].Hash != hashes[2].Hash {
		t.Fatalf("Hash differs between members at revision %d: %v", hashes[0].Header.Revision, hashes)
	}
}

// TestAutoCompaction: with --auto-compaction-mode periodic and a retention
// of a second, the leader compacts the history as time passes: a read of
// the first revisions becomes "compacted" without a client's Compact.
func TestAutoCompaction(t *testing.T) {
	e := start(t, daemon.Config{EtcdAutoCompaction: etcdapi.AutoCompaction{Mode: etcdapi.CompactionPeriodic, Period: time.Second}})
	first := waitHistory(t, e.srv.Daemon, e)
	ctx := ctxT(t)
	testutil.WaitFor(t, "an automatic compaction past the first revision", 20*time.Second, func() bool {
		e.put(t, "auto", "x", 0)
		_, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("auto"), Revision: first})
		return err != nil && err.Error() == rpctypes.ErrGRPCCompacted.Error()
	})
	h, err := e.maint.HashKV(ctx, &pb.HashKVRequest{})
	if err != nil || h.CompactRevision <= first {
		t.Fatalf("HashKV after auto-compaction: %+v %v", h, err)
	}
}

// TestHistoryAfterRestart: the history window is in the replicated state
// and its snapshots: after a restart (the node's watch history starts
// empty) a read at a past revision answers as before, and a watch from
// one replays from the window.
func TestHistoryAfterRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := daemon.Config{DataDir: dir}
	e := start(t, cfg)
	first := waitHistory(t, e.srv.Daemon, e) + 1
	for i := range 5 {
		e.put(t, "after", fmt.Sprint(i), 0)
	}
	e.srv.Stop(t)
	e = start(t, cfg)
	ctx := ctxT(t)
	got, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("after"), Revision: first + 1})
	if err != nil || keys(got.Kvs) != "after=1 " || got.Kvs[0].Version != 2 {
		t.Fatalf("after the restart, at %d: %v %v", first+1, got, err)
	}
	w, err := e.watch.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cr := create(t, w, &pb.WatchCreateRequest{Key: []byte("after"), StartRevision: first})
	var n int
	for n < 5 {
		r := recvWatch(t, w)
		if r.Canceled || r.WatchId != cr.WatchId {
			t.Fatalf("watch from %d after the restart: %+v", first, r)
		}
		n += len(r.Events)
	}
}
