package etcdapi_test

import (
	"bytes"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/server"
)

func txnOp(r *pb.TxnRequest) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: r}}
}

// keyExists compares key's version with 0.
func keyExists(k string) *pb.Compare {
	return &pb.Compare{Key: []byte(k), Target: pb.Compare_VERSION, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_Version{Version: 0}}
}

// TestNestedTxn: a RequestOp holding a transaction runs as etcd 3.3+ runs
// it: its compares read the state before the whole transaction, its ops
// run where it stands (a range in it sees the puts before it), every
// write at the transaction's revision; its answer is a ResponseTxn with
// an empty header and the ops' own revisions.
func TestNestedTxn(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	rev0 := e.put(t, "a", "1", 0).Header.Revision
	inner := &pb.TxnRequest{
		Compare: []*pb.Compare{keyExists("b")}, // b is put by the outer branch, after the compares
		Success: []*pb.RequestOp{putOp("c", "then")},
		Failure: []*pb.RequestOp{putOp("c", "else"), getOp("b")},
	}
	r, err := e.kv.Txn(ctx, &pb.TxnRequest{
		Compare: []*pb.Compare{keyExists("a")},
		Success: []*pb.RequestOp{getOp("a"), putOp("b", "2"), txnOp(inner), getOp("c")},
	})
	if err != nil {
		t.Fatalf("nested txn: %v", err)
	}
	rev := r.Header.Revision
	if !r.Succeeded || len(r.Responses) != 4 || rev <= rev0 {
		t.Fatalf("outer answer %+v", r)
	}
	if h := r.Responses[0].GetResponseRange().Header.Revision; h != rev-1 {
		t.Fatalf("range before any write at revision %d, want %d", h, rev-1)
	}
	in := r.Responses[2].GetResponseTxn()
	if in == nil || in.Succeeded || len(in.Responses) != 2 {
		t.Fatalf("nested answer %+v: want its failure branch", in)
	}
	if in.Header == nil || in.Header.Revision != 0 || in.Header.MemberId != 0 {
		t.Fatalf("nested header %+v: etcd leaves it empty", in.Header)
	}
	if p := in.Responses[0].GetResponsePut(); p == nil || p.Header.Revision != rev {
		t.Fatalf("nested put %+v, want revision %d", p, rev)
	}
	if g := in.Responses[1].GetResponseRange(); len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "2" || g.Header.Revision != rev {
		t.Fatalf("nested range of b %+v: want the put before it", g)
	}
	if g := r.Responses[3].GetResponseRange(); len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "else" || g.Kvs[0].ModRevision != rev {
		t.Fatalf("range of c after the nested transaction %+v", g)
	}

	// A transaction of nested ranges only is a read: no revision.
	ro, err := e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{txnOp(&pb.TxnRequest{Success: []*pb.RequestOp{getOp("c")}})}})
	if err != nil || ro.Header.Revision != rev || string(ro.Responses[0].GetResponseTxn().Responses[0].GetResponseRange().Kvs[0].Value) != "else" {
		t.Fatalf("read-only nested txn %+v %v", ro, err)
	}

	// etcd's duplicate-key rules across levels (checkIntervals).
	dup := []struct {
		name string
		ops  []*pb.RequestOp
	}{
		{"a key put above and below", []*pb.RequestOp{putOp("k", "1"), txnOp(&pb.TxnRequest{Success: []*pb.RequestOp{putOp("k", "2")}})}},
		{"a key deleted above, put below", []*pb.RequestOp{delOp("j", "l"), txnOp(&pb.TxnRequest{Failure: []*pb.RequestOp{putOp("k", "2")}})}},
		{"a key deleted below, put above", []*pb.RequestOp{txnOp(&pb.TxnRequest{Success: []*pb.RequestOp{delOp("k", "")}}), putOp("k", "1")}},
		{"a key put in two nested transactions", []*pb.RequestOp{txnOp(&pb.TxnRequest{Success: []*pb.RequestOp{putOp("k", "1")}}), txnOp(&pb.TxnRequest{Failure: []*pb.RequestOp{putOp("k", "2")}})}},
	}
	for _, c := range dup {
		_, err := e.kv.Txn(ctx, &pb.TxnRequest{Success: c.ops})
		if err == nil {
			t.Fatalf("%s: accepted", c.name)
		}
		wantErr(t, err, rpctypes.ErrGRPCDuplicateKey)
	}
	// The two branches of one nested transaction may put the same key.
	if _, err := e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{txnOp(&pb.TxnRequest{Success: []*pb.RequestOp{putOp("k", "1")}, Failure: []*pb.RequestOp{putOp("k", "2")}})}}); err != nil {
		t.Fatalf("a key put in both branches of a nested transaction: %v", err)
	}

	// A nested transaction has what its parent left of the ops limit.
	limit := server.DefaultKVLimits().MaxTxnOps
	var many []*pb.RequestOp
	for range limit {
		many = append(many, getOp("a"))
	}
	_, err = e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{getOp("a"), txnOp(&pb.TxnRequest{Success: many})}})
	wantErr(t, err, rpctypes.ErrGRPCTooManyOps)
	if _, err := e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{getOp("a"), txnOp(&pb.TxnRequest{Success: many[:limit-2]})}}); err != nil {
		t.Fatalf("a nested transaction within the limit: %v", err)
	}
	// An empty op inside is etcd's "key not found".
	_, err = e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{txnOp(&pb.TxnRequest{Success: []*pb.RequestOp{{}}})}})
	wantErr(t, err, rpctypes.ErrGRPCKeyNotFound)
}

// TestLargeValues: with the default limits the etcd API stores a value
// of 1.5 MiB less its key (etcd's --max-request-bytes) and reads it back;
// one byte more than --max-value-len is refused.
func TestLargeValues(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	limit := server.DefaultKVLimits().MaxValueLen
	if limit < 3<<19 {
		t.Fatalf("default --max-value-len %d, want etcd's 1.5 MiB", limit)
	}
	value := make([]byte, limit)
	for i := range value {
		value[i] = byte(i)
	}
	if _, err := e.kv.Put(ctx, &pb.PutRequest{Key: []byte("big"), Value: value}); err != nil {
		t.Fatalf("put of %d bytes: %v", len(value), err)
	}
	r, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("big")})
	if err != nil || len(r.Kvs) != 1 || !bytes.Equal(r.Kvs[0].Value, value) {
		t.Fatalf("get: %v", err)
	}
	if _, err := e.kv.Put(ctx, &pb.PutRequest{Key: []byte("big"), Value: append(value, 0)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("put of a byte more: %v", err)
	}
}

// TestWatchOfLargeValues: a watch replaying puts of values at the default
// --max-value-len reaches a client with gRPC's default 4 MiB receive
// limit (python-etcd3's, for one): responses are split at revisions.
func TestWatchOfLargeValues(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	value := make([]byte, server.DefaultKVLimits().MaxValueLen)
	var first int64
	for range 3 {
		r, err := e.kv.Put(ctx, &pb.PutRequest{Key: []byte("big"), Value: value})
		if err != nil {
			t.Fatal(err)
		}
		if first == 0 {
			first = r.Header.Revision
		}
	}
	w, err := e.watch.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	create(t, w, &pb.WatchCreateRequest{Key: []byte("big"), StartRevision: first})
	got := 0
	for got < 3 {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("after %d events: %v", got, err)
		}
		got += len(r.Events)
	}
}
