package server_test

import (
	"testing"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// aHoldsL starts a server and a Sessions RPC r on it, with sessions a and
// b on streams 1 and 2, a holding lock L with request 2. It returns r and
// a's grant.
func aHoldsL(t *testing.T) (r *sessionsRPC, ga *pb.LockGranted) {
	t.Helper()
	r = startSessionsRPC(t)
	r.send(req(1, 1, &pb.OpenSession{Owner: "a", TtlMs: 60_000}), req(2, 1, &pb.OpenSession{Owner: "b", TtlMs: 60_000}))
	if r.await(1, anyReply).GetResponse().GetOpened() == nil || r.await(2, anyReply).GetResponse().GetOpened() == nil {
		t.Fatal("opening the sessions failed")
	}
	r.send(req(1, 2, &pb.AcquireLock{Name: "L", Wait: true}))
	ga = r.await(1, anyReply).GetResponse().GetGranted()
	if ga == nil {
		t.Fatal("a's acquire was not granted")
	}
	return r, ga
}

// queueBehindA is aHoldsL with b waiting for L with request 2. It returns
// r and a's grant.
func queueBehindA(t *testing.T) (r *sessionsRPC, ga *pb.LockGranted) {
	t.Helper()
	r, ga = aHoldsL(t)
	r.send(req(2, 2, &pb.AcquireLock{Name: "L", Wait: true}))
	if r.await(2, anyReply).GetResponse().GetQueued() == nil {
		t.Fatal("b's acquire was not queued")
	}
	return r, ga
}

// TestReacquireRightAfterAWaitedGrant: a client that waited in line for a
// lock may release it and ask for it again (a fresh acquire, not a resumed
// one) the moment the grant arrives: the new acquire is granted, not
// refused as a duplicate of the finished one (only the state machine
// decides what a session holds or waits for).
func TestReacquireRightAfterAWaitedGrant(t *testing.T) {
	r, ga := queueBehindA(t)

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

// TestReacquireRightAfterAWithdrawnWait: the same for a wait the client
// withdrew: once it has the "cancelled" answer it may queue again at once.
func TestReacquireRightAfterAWithdrawnWait(t *testing.T) {
	r, _ := queueBehindA(t)

	r.send(&pb.SessionFrame{Stream: 2, Request: &pb.SessionRequest{Id: 3, Op: &pb.SessionRequest_Cancel{Cancel: &pb.CancelRequest{RequestId: 2}}}})
	if e := r.await(2, anyReply).GetResponse(); e.GetId() != 2 || e.GetError() == nil {
		t.Fatalf("withdrawing b's wait: %v, want an error answer to request 2", e)
	}
	r.send(req(2, 4, &pb.AcquireLock{Name: "L", Wait: true}))
	if resp := r.await(2, anyReply).GetResponse(); resp.GetQueued() == nil {
		t.Fatalf("b queuing again right after withdrawing: %v, want queued", resp)
	}
}

// TestQuietAcquireIsAnsweredOnlyWithTheGrant: a quiet acquire that has to
// wait gets no "queued" answer; its one answer is the grant.
func TestQuietAcquireIsAnsweredOnlyWithTheGrant(t *testing.T) {
	r, ga := aHoldsL(t)
	// In one message, handled in order: b queues behind a, then a releases.
	r.send(req(2, 2, &pb.AcquireLock{Name: "L", Wait: true, Quiet: true}), req(1, 3, &pb.ReleaseLock{Name: "L", Token: ga.GetToken()}))
	resp := r.await(2, anyReply).GetResponse()
	if g := resp.GetGranted(); resp.GetId() != 2 || g == nil || g.GetToken() <= ga.GetToken() {
		t.Fatalf("b's quiet acquire was first answered with %v, want its grant (token above %d)", resp, ga.GetToken())
	}
}
