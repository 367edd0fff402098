package etcdapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	tpb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// etcd is a plain gRPC connection to a server's etcd API: the wire
// protocol as etcd's clients speak it, without etcd's client library
// (which the main module never imports).
type etcd struct {
	kv      pb.KVClient
	watch   pb.WatchClient
	lease   pb.LeaseClient
	cluster pb.ClusterClient
	maint   pb.MaintenanceClient
	srv     *testutil.Server
}

func start(t *testing.T, cfg daemon.Config) *etcd {
	t.Helper()
	cfg.EtcdListen = "127.0.0.1:0"
	s := testutil.StartConfig(t, cfg)
	conn, err := grpc.NewClient(s.EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &etcd{kv: pb.NewKVClient(conn), watch: pb.NewWatchClient(conn), lease: pb.NewLeaseClient(conn),
		cluster: pb.NewClusterClient(conn), maint: pb.NewMaintenanceClient(conn), srv: s}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (e *etcd) put(t *testing.T, key, value string, lease int64) *pb.PutResponse {
	t.Helper()
	r, err := e.kv.Put(ctxT(t), &pb.PutRequest{Key: []byte(key), Value: []byte(value), Lease: lease})
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return r
}

func keys(kvs []*mvccpb.KeyValue) string {
	s := ""
	for _, kv := range kvs {
		s += string(kv.Key) + "=" + string(kv.Value) + " "
	}
	return s
}

// wantErr fails unless err is etcd's error want (same code and message,
// which is how etcd's clients recognise it).
func wantErr(t *testing.T, err, want error) {
	t.Helper()
	got, want2 := status.Convert(err), status.Convert(want)
	if err == nil || got.Code() != want2.Code() || got.Message() != want2.Message() {
		t.Fatalf("error %v, want %v", err, want)
	}
}

func checkHeader(t *testing.T, h *pb.ResponseHeader) {
	t.Helper()
	if h == nil || h.ClusterId == 0 || h.MemberId == 0 || h.RaftTerm == 0 || h.Revision == 0 {
		t.Fatalf("incomplete header %+v", h)
	}
}

func TestRangeOptions(t *testing.T) {
	e := start(t, daemon.Config{})
	waitVersion3(t, e.srv.Daemon)
	ctx := ctxT(t)
	// Values and versions chosen so that each sort target orders them
	// differently from the keys.
	e.put(t, "a/1", "z", 0)
	c2 := e.put(t, "a/2", "x", 0).Header.Revision // a/2's create and mod revision
	c3 := e.put(t, "a/3", "y", 0).Header.Revision
	e.put(t, "a/1", "w", 0) // a/1: version 2, last modified
	e.put(t, "b", "b", 0)
	all := []byte("a/")
	end := []byte("a0") // the prefix's end
	cases := []struct {
		name      string
		req       *pb.RangeRequest
		want      string
		count     int64
		more      bool
		valueless bool
	}{
		{"single", &pb.RangeRequest{Key: []byte("a/2")}, "a/2=x ", 1, false, false},
		{"absent", &pb.RangeRequest{Key: []byte("a/9")}, "", 0, false, false},
		{"prefix", &pb.RangeRequest{Key: all, RangeEnd: end}, "a/1=w a/2=x a/3=y ", 3, false, false},
		{"from key", &pb.RangeRequest{Key: []byte("a/3"), RangeEnd: []byte{0}}, "a/3=y b=b ", 2, false, false},
		{"every key", &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}}, "a/1=w a/2=x a/3=y b=b ", 4, false, false},
		{"limit counts all", &pb.RangeRequest{Key: all, RangeEnd: end, Limit: 2}, "a/1=w a/2=x ", 3, true, false},
		{"limit exact", &pb.RangeRequest{Key: all, RangeEnd: end, Limit: 3}, "a/1=w a/2=x a/3=y ", 3, false, false},
		{"sort key descend", &pb.RangeRequest{Key: all, RangeEnd: end, SortOrder: pb.RangeRequest_DESCEND}, "a/3=y a/2=x a/1=w ", 3, false, false},
		{"sort value", &pb.RangeRequest{Key: all, RangeEnd: end, SortTarget: pb.RangeRequest_VALUE, SortOrder: pb.RangeRequest_ASCEND}, "a/1=w a/2=x a/3=y ", 3, false, false},
		{"sort value descend limit", &pb.RangeRequest{Key: all, RangeEnd: end, SortTarget: pb.RangeRequest_VALUE, SortOrder: pb.RangeRequest_DESCEND, Limit: 1}, "a/3=y ", 3, true, false},
		{"sort create (no order: ascend)", &pb.RangeRequest{Key: all, RangeEnd: end, SortTarget: pb.RangeRequest_CREATE}, "a/1=w a/2=x a/3=y ", 3, false, false},
		{"sort mod descend", &pb.RangeRequest{Key: all, RangeEnd: end, SortTarget: pb.RangeRequest_MOD, SortOrder: pb.RangeRequest_DESCEND}, "a/1=w a/3=y a/2=x ", 3, false, false},
		{"sort version descend", &pb.RangeRequest{Key: all, RangeEnd: end, SortTarget: pb.RangeRequest_VERSION, SortOrder: pb.RangeRequest_DESCEND, Limit: 1}, "a/1=w ", 3, true, false},
		{"first create (Mutex's owner)", &pb.RangeRequest{Key: all, RangeEnd: end, SortTarget: pb.RangeRequest_CREATE, SortOrder: pb.RangeRequest_ASCEND, Limit: 1}, "a/1=w ", 3, true, false},
		{"keys only", &pb.RangeRequest{Key: all, RangeEnd: end, KeysOnly: true}, "a/1= a/2= a/3= ", 3, false, true},
		{"count only", &pb.RangeRequest{Key: all, RangeEnd: end, CountOnly: true}, "", 3, false, false},
		{"max create filter (Mutex's wait)", &pb.RangeRequest{Key: all, RangeEnd: end, MaxCreateRevision: c2, SortTarget: pb.RangeRequest_CREATE, SortOrder: pb.RangeRequest_DESCEND, Limit: 1}, "a/2=x ", 3, true, false},
		{"max create filter, the first key only", &pb.RangeRequest{Key: all, RangeEnd: end, MaxCreateRevision: c2 - 1, SortTarget: pb.RangeRequest_CREATE, SortOrder: pb.RangeRequest_DESCEND, Limit: 1}, "a/1=w ", 3, false, false},
		{"min mod filter", &pb.RangeRequest{Key: all, RangeEnd: end, MinModRevision: c3}, "a/1=w a/3=y ", 3, false, false},
		{"max mod filter with limit", &pb.RangeRequest{Key: all, RangeEnd: end, MaxModRevision: c3, Limit: 1}, "a/2=x ", 3, true, false},
		{"min create filter", &pb.RangeRequest{Key: all, RangeEnd: end, MinCreateRevision: c3}, "a/3=y ", 3, false, false},
		{"negative max filter keeps none", &pb.RangeRequest{Key: all, RangeEnd: end, MaxModRevision: -1}, "", 3, false, false},
		{"empty interval", &pb.RangeRequest{Key: []byte("b"), RangeEnd: []byte("a")}, "", 0, false, false},
		{"serializable", &pb.RangeRequest{Key: all, RangeEnd: end, Serializable: true}, "a/1=w a/2=x a/3=y ", 3, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := e.kv.Range(ctx, c.req)
			if err != nil {
				t.Fatal(err)
			}
			checkHeader(t, r.Header)
			if got := keys(r.Kvs); got != c.want || r.Count != c.count || r.More != c.more {
				t.Fatalf("got %q count %d more %v, want %q count %d more %v", got, r.Count, r.More, c.want, c.count, c.more)
			}
			for _, kv := range r.Kvs {
				if c.valueless != (kv.Value == nil) || kv.CreateRevision == 0 || kv.ModRevision == 0 || kv.Version == 0 {
					t.Fatalf("kv %+v", kv)
				}
			}
		})
	}
	// Revisions: the current one reads; a future one is refused; a past
	// one reads the keys as they were (the history window: history_test.go).
	r, _ := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("b")})
	cur := r.Header.Revision
	if _, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("b"), Revision: cur}); err != nil {
		t.Fatal(err)
	}
	_, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("b"), Revision: cur + 100})
	wantErr(t, err, rpctypes.ErrGRPCFutureRev)
	if r, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("b"), Revision: cur - 1}); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("b before it was put: %v %v", r, err)
	}
	_, err = e.kv.Range(ctx, &pb.RangeRequest{})
	wantErr(t, err, rpctypes.ErrGRPCEmptyKey)
	_, err = e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("a"), SortOrder: 7})
	wantErr(t, err, rpctypes.ErrGRPCInvalidSortOption)
	// A lease session of Tenure's own (with a secret) opens no later
	// revisions to a read: lease grants bump the revision with no key.
	gr, err := e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("b"), Revision: gr.Header.Revision - 1}); err != nil {
		t.Fatalf("a read at a revision with no key change since: %v", err)
	}
}

func TestPutOptions(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	first := e.put(t, "k", "v1", 0)
	checkHeader(t, first.Header)
	r, err := e.kv.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v2"), PrevKv: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.PrevKv == nil || string(r.PrevKv.Value) != "v1" || r.PrevKv.Version != 1 || r.Header.Revision != first.Header.Revision+1 {
		t.Fatalf("prev_kv %+v header %+v", r.PrevKv, r.Header)
	}
	if r, _ := e.kv.Put(ctx, &pb.PutRequest{Key: []byte("new"), Value: []byte("x"), PrevKv: true}); r.PrevKv != nil {
		t.Fatalf("prev_kv of a new key: %+v", r.PrevKv)
	}
	lease, err := e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	e.put(t, "k", "v3", lease.ID)
	// ignore_value keeps the value and takes the new lease (none here);
	// ignore_lease keeps the lease.
	if _, err := e.kv.Put(ctx, &pb.PutRequest{Key: []byte("k"), IgnoreLease: true, Value: []byte("v4")}); err != nil {
		t.Fatal(err)
	}
	g, _ := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("k")})
	if kv := g.Kvs[0]; string(kv.Value) != "v4" || kv.Lease != lease.ID || kv.Version != 4 {
		t.Fatalf("after ignore_lease: %+v", kv)
	}
	if _, err := e.kv.Put(ctx, &pb.PutRequest{Key: []byte("k"), IgnoreValue: true}); err != nil {
		t.Fatal(err)
	}
	g, _ = e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("k")})
	if kv := g.Kvs[0]; string(kv.Value) != "v4" || kv.Lease != 0 || kv.Version != 5 {
		t.Fatalf("after ignore_value: %+v", kv)
	}
	for _, c := range []struct {
		req  *pb.PutRequest
		want error
	}{
		{&pb.PutRequest{Key: []byte("absent"), IgnoreValue: true}, rpctypes.ErrGRPCKeyNotFound},
		{&pb.PutRequest{Key: []byte("absent"), IgnoreLease: true}, rpctypes.ErrGRPCKeyNotFound},
		{&pb.PutRequest{Key: []byte("k"), IgnoreValue: true, Value: []byte("x")}, rpctypes.ErrGRPCValueProvided},
		{&pb.PutRequest{Key: []byte("k"), IgnoreLease: true, Lease: lease.ID}, rpctypes.ErrGRPCLeaseProvided},
		{&pb.PutRequest{Key: []byte("k"), Lease: 123456}, rpctypes.ErrGRPCLeaseNotFound},
		{&pb.PutRequest{Value: []byte("x")}, rpctypes.ErrGRPCEmptyKey},
	} {
		_, err := e.kv.Put(ctx, c.req)
		wantErr(t, err, c.want)
	}
	if _, err := e.kv.Put(ctx, &pb.PutRequest{Key: []byte{0xff, 0xfe}}); err != nil {
		t.Fatalf("a key that is not UTF-8, as etcd takes it: %v", err)
	}
}

func TestDeleteRange(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	for _, k := range []string{"d/1", "d/2", "d/3", "e"} {
		e.put(t, k, "v-"+k, 0)
	}
	r, err := e.kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("d/"), RangeEnd: []byte("d0"), PrevKv: true})
	if err != nil {
		t.Fatal(err)
	}
	checkHeader(t, r.Header)
	if r.Deleted != 3 || keys(r.PrevKvs) != "d/1=v-d/1 d/2=v-d/2 d/3=v-d/3 " {
		t.Fatalf("deleted %d prev %q", r.Deleted, keys(r.PrevKvs))
	}
	// Nothing deleted: no revision is taken.
	n, err := e.kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("d/1")})
	if err != nil || n.Deleted != 0 || n.Header.Revision != r.Header.Revision {
		t.Fatalf("delete of nothing: %+v %v (after %d)", n, err, r.Header.Revision)
	}
	if r, err := e.kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte{0}}); err != nil || r.Deleted != 1 {
		t.Fatalf("delete from key: %+v %v", r, err)
	}
}

func cmp(key string, target pb.Compare_CompareTarget, result pb.Compare_CompareResult, v any) *pb.Compare {
	c := &pb.Compare{Key: []byte(key), Target: target, Result: result}
	switch target {
	case pb.Compare_VALUE:
		c.TargetUnion = &pb.Compare_Value{Value: []byte(v.(string))}
	case pb.Compare_VERSION:
		c.TargetUnion = &pb.Compare_Version{Version: int64(v.(int))}
	case pb.Compare_CREATE:
		c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: int64(v.(int))}
	case pb.Compare_MOD:
		c.TargetUnion = &pb.Compare_ModRevision{ModRevision: int64(v.(int))}
	case pb.Compare_LEASE:
		c.TargetUnion = &pb.Compare_Lease{Lease: int64(v.(int))}
	}
	return c
}

func putOp(k, v string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: []byte(v), PrevKv: true}}}
}

func getOp(k string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(k)}}}
}

func delOp(k, end string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k), RangeEnd: []byte(end)}}}
}

func TestTxn(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	p := e.put(t, "t", "1", 0) // create = mod = rev
	rev := int(p.Header.Revision)
	e.put(t, "u/1", "a", 0)
	e.put(t, "u/2", "a", 0)
	compares := []struct {
		c    *pb.Compare
		want bool
	}{
		{cmp("t", pb.Compare_VALUE, pb.Compare_EQUAL, "1"), true},
		{cmp("t", pb.Compare_VALUE, pb.Compare_GREATER, "0"), true},
		{cmp("absent", pb.Compare_VALUE, pb.Compare_NOT_EQUAL, "x"), false}, // a value compare of no key fails
		{cmp("t", pb.Compare_VERSION, pb.Compare_EQUAL, 1), true},
		{cmp("t", pb.Compare_CREATE, pb.Compare_EQUAL, rev), true},
		{cmp("t", pb.Compare_MOD, pb.Compare_LESS, rev+1), true},
		{cmp("absent", pb.Compare_CREATE, pb.Compare_EQUAL, 0), true},
		{cmp("t", pb.Compare_LEASE, pb.Compare_EQUAL, 0), true},
		{cmp("t", pb.Compare_CREATE, pb.Compare_GREATER, -1), true}, // etcd's numbers are signed
		{cmp("t", pb.Compare_CREATE, pb.Compare_LESS, -1), false},
		{&pb.Compare{Key: []byte("t"), Target: pb.Compare_CREATE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 1}}, false}, // the union must be the target's
		{func() *pb.Compare {
			c := cmp("u/", pb.Compare_VALUE, pb.Compare_EQUAL, "a")
			c.RangeEnd = []byte("u0")
			return c
		}(), true},
		{func() *pb.Compare {
			c := cmp("t", pb.Compare_VALUE, pb.Compare_EQUAL, "a")
			c.RangeEnd = []byte("u0")
			return c
		}(), false},
	}
	for i, c := range compares {
		r, err := e.kv.Txn(ctx, &pb.TxnRequest{Compare: []*pb.Compare{c.c}, Success: []*pb.RequestOp{getOp("t")}})
		if err != nil {
			t.Fatalf("compare %d: %v", i, err)
		}
		if r.Succeeded != c.want {
			t.Fatalf("compare %d (%v): succeeded %v, want %v", i, c.c, r.Succeeded, c.want)
		}
	}
	// A write: every op at one revision, the header's; an op's header is
	// the revision before it or, after a change, the write's.
	r, err := e.kv.Txn(ctx, &pb.TxnRequest{
		Compare: []*pb.Compare{cmp("t", pb.Compare_VALUE, pb.Compare_EQUAL, "1")},
		Success: []*pb.RequestOp{getOp("t"), putOp("t", "2"), putOp("v", "x"), getOp("t"), delOp("u/", "u0")},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkHeader(t, r.Header)
	w := r.Header.Revision
	res := r.Responses
	if !r.Succeeded || res[0].GetResponseRange().Header.Revision != w-1 || res[1].GetResponsePut().Header.Revision != w ||
		string(res[1].GetResponsePut().PrevKv.Value) != "1" || string(res[3].GetResponseRange().Kvs[0].Value) != "2" ||
		res[3].GetResponseRange().Header.Revision != w || res[4].GetResponseDeleteRange().Deleted != 2 {
		t.Fatalf("txn %+v", r)
	}
	for _, k := range []string{"t", "v"} {
		g, _ := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte(k)})
		if g.Kvs[0].ModRevision != w {
			t.Fatalf("%s at %d, not the txn's revision %d", k, g.Kvs[0].ModRevision, w)
		}
	}
	// etcd's duplicate-key check, per branch.
	for i, ops := range [][]*pb.RequestOp{
		{putOp("a", "1"), putOp("a", "2")},
		{delOp("a", ""), putOp("a", "1")},
		{delOp("a", "c"), putOp("b", "1")},
	} {
		_, err := e.kv.Txn(ctx, &pb.TxnRequest{Failure: ops})
		wantErr(t, err, rpctypes.ErrGRPCDuplicateKey)
		if i == 0 {
			if _, err := e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{putOp("a", "1")}, Failure: []*pb.RequestOp{putOp("a", "2")}}); err != nil {
				t.Fatalf("the same key in both branches: %v", err)
			}
		}
	}
	// etcd compares a delete from a key on as the interval [key, "\x00"):
	// it overlaps no put.
	if _, err := e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{delOp("a", "\x00"), putOp("b", "1")}}); err != nil {
		t.Fatalf("delete from key with a put: %v", err)
	}
	var many []*pb.RequestOp
	for i := 0; i <= server.DefaultKVLimits().MaxTxnOps; i++ {
		many = append(many, getOp(fmt.Sprint(i)))
	}
	_, err = e.kv.Txn(ctx, &pb.TxnRequest{Success: many})
	wantErr(t, err, rpctypes.ErrGRPCTooManyOps)
	// A read-only transaction takes no revision.
	ro, err := e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{getOp("t")}})
	if err != nil || ro.Header.Revision != w-0 && ro.Header.Revision < w {
		t.Fatalf("read-only txn %+v %v", ro, err)
	}
	// A put of a lease that does not exist refuses the whole txn.
	_, err = e.kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{putOp("z", "1"), {Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("y"), Lease: 99999}}}}})
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound)
	if g, _ := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("z")}); len(g.Kvs) != 0 {
		t.Fatal("a refused txn wrote")
	}
}

func TestLease(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	g, err := e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkHeader(t, g.Header)
	if g.TTL != 2 || g.ID <= 0 {
		t.Fatalf("grant of 1s: %+v (etcd raises it to its minimum, 2s)", g)
	}
	_, err = e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 9_000_000_001})
	wantErr(t, err, rpctypes.ErrGRPCLeaseTTLTooLarge)
	long, err := e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 9_000_000_000})
	if err != nil {
		t.Fatalf("etcd's maximum TTL: %v", err)
	}
	l, err := e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 30})
	if err != nil {
		t.Fatal(err)
	}
	e.put(t, "l/1", "x", l.ID)
	e.put(t, "l/2", "x", l.ID)
	ttl, err := e.lease.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: l.ID, Keys: true})
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 30 || ttl.TTL < 28 || ttl.TTL > 30 || len(ttl.Keys) != 2 || string(ttl.Keys[0]) != "l/1" {
		t.Fatalf("timetolive %+v", ttl)
	}
	if ttl, _ := e.lease.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: 987654}); ttl.TTL != -1 {
		t.Fatalf("timetolive of no lease: %+v", ttl)
	}
	ls, err := e.lease.LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
	if err != nil || len(ls.Leases) != 3 {
		t.Fatalf("leases %+v %v", ls, err)
	}
	ka, err := e.lease.LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ id, ttl int64 }{{l.ID, 30}, {987654, 0}, {long.ID, 9_000_000_000}} {
		if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: c.id}); err != nil {
			t.Fatal(err)
		}
		r, err := ka.Recv()
		if err != nil {
			t.Fatal(err)
		}
		checkHeader(t, r.Header)
		if r.ID != c.id || r.TTL != c.ttl {
			t.Fatalf("keepalive of %d: %+v, want TTL %d", c.id, r, c.ttl)
		}
	}
	rv, err := e.lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: l.ID})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("l/"), RangeEnd: []byte("l0")}); len(r.Kvs) != 0 || r.Header.Revision != rv.Header.Revision {
		t.Fatalf("after revoke: %+v", r)
	}
	_, err = e.lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: l.ID})
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound)
	// The lease of 2s expires without keepalives, and its key goes.
	e.put(t, "short", "x", g.ID)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _ := e.kv.Range(ctx, &pb.RangeRequest{Key: []byte("short")})
		if len(r.Kvs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key of an expired lease is still there")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLeasesApartFromSessions: the etcd API acts on a lease by its id
// alone, so it must never reach a Tenure session (which has a secret),
// and Tenure's API must never use an etcd lease as a session.
func TestLeasesApartFromSessions(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	c := testutil.Dial(t, e.srv.Addr())
	sess := testutil.Session(t, ctx, c)
	id := int64(sess.ID())
	_, err := e.kv.Put(ctx, &pb.PutRequest{Key: []byte("x"), Lease: id})
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound)
	_, err = e.lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: id})
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound)
	ka, _ := e.lease.LeaseKeepAlive(ctx)
	_ = ka.Send(&pb.LeaseKeepAliveRequest{ID: id})
	if r, err := ka.Recv(); err != nil || r.TTL != 0 {
		t.Fatalf("keepalive of a Tenure session: %+v %v", r, err)
	}
	if ttl, _ := e.lease.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: id}); ttl.TTL != -1 {
		t.Fatalf("timetolive of a Tenure session: %+v", ttl)
	}
	if err := sess.Close(ctx); err != nil {
		t.Fatal(err) // still alive: nothing above touched it
	}
	g, err := e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	api := testutil.API(t, e.srv.Addr())
	_, err = api.KVPut(ctx, &tpb.KVPutRequest{Key: "y", Session: uint64(g.ID), SessionSecret: make([]byte, 16)})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Tenure's API using an etcd lease: %v", err)
	}
}

func recvWatch(t *testing.T, w pb.Watch_WatchClient) *pb.WatchResponse {
	t.Helper()
	type res struct {
		r   *pb.WatchResponse
		err error
	}
	ch := make(chan res, 1)
	go func() { r, err := w.Recv(); ch <- res{r, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.r
	case <-time.After(10 * time.Second):
		t.Fatal("no watch response within 10s")
	}
	panic("unreachable")
}

func create(t *testing.T, w pb.Watch_WatchClient, c *pb.WatchCreateRequest) *pb.WatchResponse {
	t.Helper()
	if err := w.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}); err != nil {
		t.Fatal(err)
	}
	r := recvWatch(t, w)
	if !r.Created {
		t.Fatalf("not a created response: %+v", r)
	}
	return r
}

func TestWatch(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	w, err := e.watch.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Many watchers on one stream, with server-assigned ids from 0.
	all := create(t, w, &pb.WatchCreateRequest{Key: []byte("w/"), RangeEnd: []byte("w0"), PrevKv: true})
	noPut := create(t, w, &pb.WatchCreateRequest{Key: []byte("w/"), RangeEnd: []byte("w0"), Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}})
	one := create(t, w, &pb.WatchCreateRequest{Key: []byte("w/b")})
	checkHeader(t, all.Header)
	if all.WatchId != 0 || noPut.WatchId != 1 || one.WatchId != 2 {
		t.Fatalf("watch ids %d %d %d", all.WatchId, noPut.WatchId, one.WatchId)
	}
	e.put(t, "w/a", "1", 0)
	e.put(t, "w/b", "2", 0)
	e.put(t, "w/a", "3", 0)
	d, _ := e.kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("w/a")})
	got := map[int64][]string{}
	for len(got[0]) < 4 || len(got[1]) < 1 || len(got[2]) < 1 {
		r := recvWatch(t, w)
		checkHeader(t, r.Header)
		for _, ev := range r.Events {
			s := fmt.Sprintf("%s %s=%s@%d", ev.Type, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision)
			if ev.PrevKv != nil {
				s += " prev=" + string(ev.PrevKv.Value)
			}
			got[r.WatchId] = append(got[r.WatchId], s)
		}
	}
	if got[1][0] != fmt.Sprintf("DELETE w/a=@%d", d.Header.Revision) || len(got[1]) != 1 {
		t.Fatalf("NOPUT watcher: %v", got[1])
	}
	if len(got[2]) != 1 || got[2][0][:9] != "PUT w/b=2" {
		t.Fatalf("single-key watcher: %v", got[2])
	}
	if got[0][2][len(got[0][2])-6:] != "prev=1" || got[0][3][len(got[0][3])-6:] != "prev=3" || got[0][0][len(got[0][0])-1] == '=' {
		t.Fatalf("prev_kv watcher: %v", got[0])
	}
	// Cancel: answered, and nothing more for that watcher.
	if err := w.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: 0}}}); err != nil {
		t.Fatal(err)
	}
	if r := recvWatch(t, w); !r.Canceled || r.WatchId != 0 {
		t.Fatalf("cancel answer %+v", r)
	}
	// A progress request: every watcher caught up, one answer for all.
	if err := w.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}); err != nil {
		t.Fatal(err)
	}
	if r := recvWatch(t, w); r.WatchId != -1 || len(r.Events) != 0 || r.Header.Revision != d.Header.Revision {
		t.Fatalf("progress %+v (revision %d)", r, d.Header.Revision)
	}
	// A watch from a past revision replays; a requested id is kept, a
	// taken one refused; an empty range refused.
	past := create(t, w, &pb.WatchCreateRequest{Key: []byte("w/a"), StartRevision: d.Header.Revision - 1, WatchId: 7})
	if past.WatchId != 7 {
		t.Fatalf("requested id: %+v", past)
	}
	if r := recvWatch(t, w); r.WatchId != 7 || len(r.Events) != 2 || r.Events[0].Type != mvccpb.PUT || r.Events[1].Type != mvccpb.DELETE {
		t.Fatalf("replay %+v", r)
	}
	if r := create(t, w, &pb.WatchCreateRequest{Key: []byte("x"), WatchId: 7}); !r.Canceled || r.WatchId != -1 || r.CancelReason == "" {
		t.Fatalf("duplicate id: %+v", r)
	}
	if r := create(t, w, &pb.WatchCreateRequest{Key: []byte("b"), RangeEnd: []byte("a")}); !r.Canceled || r.WatchId != -1 {
		t.Fatalf("empty range: %+v", r)
	}
	if r := create(t, w, &pb.WatchCreateRequest{Key: []byte("b"), StartRevision: -1}); !r.Canceled || r.CancelReason != rpctypes.ErrCompacted.Error() {
		t.Fatalf("negative start: %+v", r)
	}
}

func TestWatchProgressNotify(t *testing.T) {
	cfg := daemon.Config{}
	cfg.Limits.KV.WatchProgressInterval = 100 * time.Millisecond
	e := start(t, cfg)
	w, err := e.watch.Watch(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	c := create(t, w, &pb.WatchCreateRequest{Key: []byte("p"), ProgressNotify: true})
	if r := recvWatch(t, w); r.WatchId != c.WatchId || len(r.Events) != 0 || r.Header.Revision != c.Header.Revision {
		t.Fatalf("progress notification %+v after %+v", r, c)
	}
}

// TestWatchCompacted: a watch from before the history window is
// cancelled with the window's start as its compact revision, as etcd
// answers it; one from that start replays every change since, though this
// node's watch history (4 events) holds only the last few.
func TestWatchCompacted(t *testing.T) {
	cfg := daemon.Config{}
	cfg.Limits.KV.WatchHistory = 4
	e := start(t, cfg)
	start := waitHistory(t, e.srv.Daemon, e)
	var last int64
	for i := range 10 {
		last = e.put(t, "c", fmt.Sprint(i), 0).Header.Revision
	}
	w, err := e.watch.Watch(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	cr := create(t, w, &pb.WatchCreateRequest{Key: []byte("c"), StartRevision: 1})
	if cr.Canceled {
		t.Fatalf("created %+v", cr)
	}
	r := recvWatch(t, w)
	if !r.Canceled || r.WatchId != cr.WatchId || r.CompactRevision <= 1 || r.CompactRevision > start || r.Header.Revision != 0 {
		t.Fatalf("compacted %+v (window from at most %d)", r, start)
	}
	cr = create(t, w, &pb.WatchCreateRequest{Key: []byte("c"), StartRevision: r.CompactRevision})
	var n int
	for n < 10 {
		r := recvWatch(t, w)
		if r.WatchId != cr.WatchId || r.Canceled {
			t.Fatalf("from the compact revision: %+v", r)
		}
		n += len(r.Events)
	}
	if n != 10 {
		t.Fatalf("from the compact revision: %d events (last %d)", n, last)
	}
}

func TestClusterAndMaintenance(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	ml, err := e.cluster.MemberList(ctx, &pb.MemberListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	checkHeader(t, ml.Header)
	if len(ml.Members) != 1 || ml.Members[0].Name != "n1" || ml.Members[0].ID != ml.Header.MemberId || len(ml.Members[0].ClientURLs) != 1 || ml.Members[0].ClientURLs[0] != "http://"+e.srv.EtcdAddr() {
		t.Fatalf("members %+v", ml.Members)
	}
	st, err := e.maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	checkHeader(t, st.Header)
	if st.Version[:2] != "3." || st.DbSize <= 0 || st.Leader != st.Header.MemberId || st.RaftIndex == 0 || st.RaftTerm == 0 {
		t.Fatalf("status %+v", st)
	}
	al, err := e.maint.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_GET})
	if err != nil || len(al.Alarms) != 0 {
		t.Fatalf("alarms %+v %v", al, err)
	}
	if _, err := e.cluster.MemberAdd(ctx, &pb.MemberAddRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("member add: %v", err)
	}
	if _, err := e.maint.Downgrade(ctx, &pb.DowngradeRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("downgrade: %v", err)
	}
}

// TestPublishNeedsMembership: the private service members publish their
// etcd API addresses to refuses a client without the members' key, so
// no client can redirect what followers forward.
func TestPublishNeedsMembership(t *testing.T) {
	e := start(t, daemon.Config{})
	conn, err := grpc.NewClient(e.srv.EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "tenure-etcd-mac", "00")
	err = conn.Invoke(ctx, "/tenure.etcdapi.v1.Members/Publish", &fsmpb.SetEtcdURL{Member: "n1", Url: "http://attacker:1"}, &emptypb.Empty{})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("publish without the members' key: %v", err)
	}
	ml, err := e.cluster.MemberList(ctxT(t), &pb.MemberListRequest{})
	if err != nil || ml.Members[0].ClientURLs[0] != "http://"+e.srv.EtcdAddr() {
		t.Fatalf("members after the attempt: %+v %v", ml, err)
	}
}
