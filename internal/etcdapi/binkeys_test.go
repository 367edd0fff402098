package etcdapi_test

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	tpb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestBinaryKeysOnTheEtcdAPI: the etcd API takes keys of any bytes, as
// etcd does: put, get, range, a watch's events, a transaction's compare,
// and the keys survive a snapshot and a restart. Tenure's own API shows
// them Go-quoted, and pages through them by that form.
func TestBinaryKeysOnTheEtcdAPI(t *testing.T) {
	dir := t.TempDir()
	e := start(t, daemon.Config{DataDir: dir})
	ctx := ctxT(t)
	k1, k2 := []byte("k\xff1"), []byte("k\xff\x002")
	w, err := e.watch.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	create(t, w, &pb.WatchCreateRequest{Key: []byte("k"), RangeEnd: []byte("l")})
	for _, k := range [][]byte{k1, k2, []byte("kz")} {
		if _, err := e.kv.Put(ctx, &pb.PutRequest{Key: k, Value: []byte("v")}); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
	}
	if ev := recvWatch(t, w); len(ev.Events) == 0 || string(ev.Events[0].Kv.Key) != string(k1) {
		t.Fatalf("watch event %+v", ev)
	}
	r, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")})
	if err != nil || len(r.Kvs) != 3 || string(r.Kvs[1].Key) != string(k2) || string(r.Kvs[2].Key) != string(k1) {
		t.Fatalf("range: %v %v", keys(r.GetKvs()), err)
	}
	tr, err := e.kv.Txn(ctx, &pb.TxnRequest{
		Compare: []*pb.Compare{{Key: k1, Target: pb.Compare_VALUE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Value{Value: []byte("v")}}},
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k2, Value: []byte("w")}}}},
	})
	if err != nil || !tr.Succeeded {
		t.Fatalf("txn on a binary key: %+v %v", tr, err)
	}

	// Tenure's API: Go-quoted, and pages of one key go through them all.
	api := testutil.API(t, e.srv.Addr())
	var shown []string
	start := ""
	for range 10 {
		p, err := api.KVRange(ctx, &tpb.KVRangeRequest{Key: "k", Prefix: true, Limit: 1, StartKey: start})
		if err != nil {
			t.Fatalf("Tenure's range: %v", err)
		}
		for _, kv := range p.GetKvs() {
			shown = append(shown, kv.GetKey())
			start = kv.GetKey() + "\x00"
		}
		if !p.GetMore() {
			break
		}
	}
	if len(shown) != 3 || shown[0] != "kz" || shown[1] != `"k\xff\x002"` || shown[2] != `"k\xff1"` {
		t.Fatalf("Tenure's API shows %q", shown)
	}
	// Tenure's watch replays them from the start, Go-quoted.
	tw, err := api.KVWatch(ctx, &tpb.KVWatchRequest{Key: "k", Prefix: true, StartRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	var watched []string
	for len(watched) < 4 {
		resp, err := tw.Recv()
		if err != nil {
			t.Fatalf("Tenure's watch of binary keys: %v (after %q)", err, watched)
		}
		for _, ev := range resp.GetEvents() {
			watched = append(watched, ev.GetKv().GetKey())
		}
	}
	if watched[0] != `"k\xff1"` || watched[3] != `"k\xff\x002"` {
		t.Fatalf("Tenure's watch shows %q", watched)
	}

	// A snapshot (Defragment takes one) and a restart keep them.
	if _, err := e.maint.Defragment(ctx, &pb.DefragmentRequest{}); err != nil {
		t.Fatal(err)
	}
	e.srv.Stop(t)
	s2 := testutil.StartConfig(t, daemon.Config{DataDir: dir, EtcdListen: "127.0.0.1:0"})
	conn, err := grpc.NewClient(s2.EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, err = pb.NewKVClient(conn).Range(ctxT(t), &pb.RangeRequest{Key: k2})
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "w" {
		t.Fatalf("after a restart: %v %v", r, err)
	}
}
