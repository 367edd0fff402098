package testutil

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// Helpers that fill a server with state quickly, for tests of large
// listings: they pipeline their requests on one stream, and leave the
// sessions they open to live on, unrenewed, until their TTL passes.

func rawAPI(t testing.TB, addr string) pb.TenureClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewTenureClient(conn)
}

// OpenSessions creates n sessions with owner and ttl at addr and returns
// their ids, in the order they were created.
func OpenSessions(t testing.TB, addr, owner string, ttl time.Duration, n int) []uint64 {
	t.Helper()
	return openMany(t, addr, owner, ttl, n, "")
}

// OpenWaiters creates n sessions with owner and ttl at addr, each queued
// for the lock name, and returns their ids in their order in its line.
// The lock must be held already.
func OpenWaiters(t testing.TB, addr, owner string, ttl time.Duration, n int, name string) []uint64 {
	t.Helper()
	return openMany(t, addr, owner, ttl, n, name)
}

// openMany opens n sessions on one Sessions RPC, each also queued for
// waitFor unless it is "", and returns them in the order of their opens,
// or of their places in line.
func openMany(t testing.TB, addr, owner string, ttl time.Duration, n int, waitFor string) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel() // breaks the session streams; the sessions and their waits stay
	st, err := rawAPI(t, addr).Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		const batch = 512
		for i := 0; i < n; i += batch {
			in := &pb.SessionFrames{}
			for j := i; j < min(i+batch, n); j++ {
				stream := uint64(j + 1)
				in.Frames = append(in.Frames, &pb.SessionFrame{Stream: stream, Request: &pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{TtlMs: ttl.Milliseconds(), Owner: owner}}}})
				if waitFor != "" {
					in.Frames = append(in.Frames, &pb.SessionFrame{Stream: stream, Request: &pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: waitFor, Wait: true}}}})
				}
			}
			if err := st.Send(in); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	type opened struct{ id, order uint64 }
	byStream := make(map[uint64]*opened, n)
	done := 0
	for done < n {
		out, err := st.Recv()
		if err != nil {
			t.Fatalf("opening %d sessions: %v after %d", n, err, done)
		}
		for _, r := range out.GetReplies() {
			if r.GetEnd() {
				t.Fatalf("session stream %d ended: %s", r.GetStream(), r.GetMessage())
			}
			o := byStream[r.GetStream()]
			if o == nil {
				o = &opened{}
				byStream[r.GetStream()] = o
			}
			resp := r.GetResponse()
			switch {
			case resp.GetOpened() != nil:
				o.id = resp.GetOpened().GetSessionId()
				if waitFor == "" {
					o.order = o.id
					done++
				}
			case resp.GetQueued() != nil && waitFor != "":
				o.order = resp.GetQueued().GetQueuedRevision()
				done++
			default:
				t.Fatalf("session stream %d answered %v", r.GetStream(), resp)
			}
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	all := make([]*opened, 0, n)
	for _, o := range byStream {
		all = append(all, o)
	}
	slices.SortFunc(all, func(a, b *opened) int { return cmp.Compare(a.order, b.order) })
	ids := make([]uint64, n)
	for i, o := range all {
		ids[i] = o.id
	}
	return ids
}

// HoldMany opens a session with owner and ttl at addr that acquires every
// one of names (try-once, pipelined) and returns its id. It fails the test
// unless every acquire is granted.
func HoldMany(t testing.TB, addr, owner string, ttl time.Duration, names []string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := OpenRawSession(ctx, rawAPI(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{TtlMs: ttl.Milliseconds(), Owner: owner}}}); err != nil {
		t.Fatal(err)
	}
	first, err := st.Recv()
	if err != nil || first.GetOpened() == nil {
		t.Fatalf("open: %v %v", first, err)
	}
	errc := make(chan error, 1)
	go func() {
		for i, name := range names {
			if err := st.Send(&pb.SessionRequest{Id: uint64(i + 2), Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: name}}}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for range names {
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.GetGranted() == nil {
			t.Fatalf("acquire %d answered %v, not granted", r.GetId(), r)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return first.GetOpened().GetSessionId()
}
