package etcdapi_test

import (
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestTxnFullRangesRefused: a Txn of many full ranges, whose answer would
// be several times etcd's request limit, is refused RESOURCE_EXHAUSTED
// naming --max-response-bytes before anything is built, and so is a
// DeleteRange whose previous values would be; a single range of the same
// keys is answered.
func TestTxnFullRangesRefused(t *testing.T) {
	e := start(t, daemon.Config{})
	ctx := ctxT(t)
	value := strings.Repeat("v", 64<<10)
	const n = 40 // 2.5 MiB of values
	for i := 0; i < n; i++ {
		e.put(t, fmt.Sprintf("big/%03d", i), value, 0)
	}
	// A client that would take any answer: the refusal must be the
	// server's.
	conn, err := grpc.NewClient(e.srv.EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kv := pb.NewKVClient(conn)
	full := &pb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0")}
	if r, err := kv.Range(ctx, full); err != nil || len(r.Kvs) != n {
		t.Fatalf("one full range: %v", err)
	}
	ops := make([]*pb.RequestOp, 16) // 16 × 2.5 MiB
	for i := range ops {
		ops[i] = &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: full}}
	}
	for name, req := range map[string]*pb.TxnRequest{
		"read":  {Success: ops},
		"write": {Success: append([]*pb.RequestOp{putOp("other", "x")}, ops...)},
	} {
		_, err := kv.Txn(ctx, req)
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-response-bytes") {
			t.Fatalf("%s txn of %d full ranges: %v, want RESOURCE_EXHAUSTED naming --max-response-bytes", name, len(ops), err)
		}
	}
	// Each range with a limit fits.
	limited := &pb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), Limit: 2}
	small := make([]*pb.RequestOp, 16)
	for i := range small {
		small[i] = &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: limited}}
	}
	if _, err := kv.Txn(ctx, &pb.TxnRequest{Success: small}); err != nil {
		t.Fatalf("a txn of limited ranges: %v", err)
	}
	for i := 0; i < 4*n; i++ {
		e.put(t, fmt.Sprintf("big/%03d", n+i), value, 0) // 12.5 MiB in all
	}
	_, err = kv.Range(ctx, full)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a range past the limit: %v", err)
	}
	_, err = kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), PrevKv: true})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a delete whose previous values pass the limit: %v", err)
	}
	if r, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), CountOnly: true}); err != nil || r.Count != 5*n {
		t.Fatalf("count only: %v %v", r, err)
	}
}

// TestEtcdLeasesCannotTakeTenureSessions: an anonymous etcd client that
// grants leases until refused leaves Tenure's clients their sessions: the
// leases count against --max-etcd-leases, not --max-sessions.
func TestEtcdLeasesCannotTakeTenureSessions(t *testing.T) {
	e := start(t, daemon.Config{ClusterLimits: fsm.Limits{MaxSessions: 5, MaxEtcdLeases: 3}})
	ctx := ctxT(t)
	granted := 0
	for i := 0; i < 10; i++ {
		_, err := e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
		if err == nil {
			granted++
			continue
		}
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-etcd-leases") {
			t.Fatalf("lease %d: %v, want RESOURCE_EXHAUSTED naming max-etcd-leases", i, err)
		}
	}
	if granted != 3 {
		t.Fatalf("%d leases granted, want 3 (--max-etcd-leases)", granted)
	}
	c := testutil.Dial(t, e.srv.Addr())
	for i := 0; i < 5; i++ {
		testutil.Session(t, ctx, c)
	}
	_, err := e.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a lease with the sessions full: %v", err)
	}
}
