package server_test

import (
	"context"
	"testing"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestReacquireRightAfterAWaitedGrant: a client that waited in line for a
// lock may release it and ask for it again (a fresh acquire, not a resumed
// one) the moment the grant arrives, even while the server's goroutine
// that sent the grant has not run again (the hook holds it there): the new
// acquire is granted, not refused as a duplicate of the finished one.
func TestReacquireRightAfterAWaitedGrant(t *testing.T) {
	proceed := make(chan struct{})
	server.SetGrantSentHook(func() { <-proceed })
	t.Cleanup(func() { server.SetGrantSentHook(nil) }) // runs after the server stops
	srv := testutil.Start(t, "", nil)
	t.Cleanup(func() { close(proceed) }) // runs before the server stops
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := openSessionsRPC(t, ctx, srv.Addr())

	r.send(req(1, 1, &pb.OpenSession{Owner: "a", TtlMs: 60_000}), req(2, 1, &pb.OpenSession{Owner: "b", TtlMs: 60_000}))
	if r.await(1, anyReply).GetResponse().GetOpened() == nil || r.await(2, anyReply).GetResponse().GetOpened() == nil {
		t.Fatal("opening the sessions failed")
	}
	r.send(req(1, 2, &pb.AcquireLock{Name: "L", Wait: true}))
	ga := r.await(1, anyReply).GetResponse().GetGranted()
	if ga == nil {
		t.Fatal("a's acquire was not granted")
	}
	r.send(req(2, 2, &pb.AcquireLock{Name: "L", Wait: true}))
	if r.await(2, anyReply).GetResponse().GetQueued() == nil {
		t.Fatal("b's acquire was not queued")
	}
	r.send(req(1, 3, &pb.ReleaseLock{Name: "L", Token: ga.GetToken()}))
	gb := r.await(2, func(rep *pb.SessionReply) bool { return rep.GetResponse().GetId() == 2 }).GetResponse().GetGranted()
	if gb == nil {
		t.Fatal("b was not granted the lock")
	}
	r.send(req(2, 3, &pb.ReleaseLock{Name: "L", Token: gb.GetToken()}))
	if r.await(2, anyReply).GetResponse().GetReleased() == nil {
		t.Fatal("b's release failed")
	}
	r.send(req(2, 4, &pb.AcquireLock{Name: "L", Wait: true}))
	resp := r.await(2, anyReply).GetResponse()
	if g := resp.GetGranted(); g == nil || g.GetToken() <= gb.GetToken() {
		t.Fatalf("b acquiring again right after its waited grant: %v, want granted with a token above %d", resp, gb.GetToken())
	}
}
