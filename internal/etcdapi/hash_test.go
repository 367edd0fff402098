package etcdapi_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/etcdapi"
)

// hashGuard bounds how long a parked hash walk waits for what the test
// expects to happen meanwhile: reaching it is the failure being tested
// for (the walk stopped the node), never the test's synchronisation.
const hashGuard = 10 * time.Second

// TestHashKVDoesNotStopWrites: a put made while a HashKV walk is under
// way is applied (and answered) while the walk is still running, and
// the walk hashes the state at the revision it started from, which a
// HashKV at that revision answers again afterwards.
func TestHashKVDoesNotStopWrites(t *testing.T) {
	e := start(t, daemon.Config{})
	waitHistory(t, e.srv.Daemon, e)
	ctx := ctxT(t)
	for i := range 200 {
		e.put(t, fmt.Sprintf("big/%03d", i), "v", 0)
	}
	walking := make(chan struct{})
	putDone := make(chan struct{})
	var putDuringWalk atomic.Bool
	var once sync.Once
	defer etcdapi.SetHashWalkHook(func() {
		first := false
		once.Do(func() { first = true })
		if !first {
			return
		}
		close(walking)
		select {
		case <-putDone:
			putDuringWalk.Store(true)
		case <-time.After(hashGuard):
		}
	})()
	type answer struct {
		resp *pb.HashKVResponse
		err  error
	}
	hashed := make(chan answer, 1)
	go func() {
		r, err := e.maint.HashKV(ctx, &pb.HashKVRequest{})
		hashed <- answer{r, err}
	}()
	select {
	case <-walking:
	case <-time.After(30 * time.Second):
		t.Fatal("the HashKV walk did not begin")
	}
	putRev := e.put(t, "big/late", "x", 0).Header.Revision
	close(putDone)
	a := <-hashed
	if a.err != nil {
		t.Fatal(a.err)
	}
	if !putDuringWalk.Load() {
		t.Fatal("the put was applied only after the HashKV walk ended: the walk stopped the node's writes")
	}
	before := a.resp.HashRevision
	if before >= putRev {
		t.Fatalf("the walk hashed revision %d, the put's %d was applied before it began", before, putRev)
	}
	again, err := e.maint.HashKV(ctx, &pb.HashKVRequest{Revision: before})
	if err != nil || again.Hash != a.resp.Hash {
		t.Fatalf("HashKV at %d afterwards: %v %v, the walk under way answered %#x", before, again, err, a.resp.Hash)
	}
	now, err := e.maint.HashKV(ctx, &pb.HashKVRequest{})
	if err != nil || now.Hash == a.resp.Hash || now.HashRevision < putRev {
		t.Fatalf("HashKV after the put: %v %v", now, err)
	}
}

// TestHashKVOneWalkAtATime: a node walks for one HashKV at a time; a
// second call waits for the first, and one whose deadline passes while it
// waits answers DeadlineExceeded.
func TestHashKVOneWalkAtATime(t *testing.T) {
	e := start(t, daemon.Config{})
	waitHistory(t, e.srv.Daemon, e)
	ctx := ctxT(t)
	var inWalk, most, walks atomic.Int32
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	defer etcdapi.SetHashWalkHook(func() {
		n := inWalk.Add(1)
		defer inWalk.Add(-1)
		walks.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		entered <- struct{}{}
		select {
		case <-release:
		case <-time.After(hashGuard):
		}
	})()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := e.maint.HashKV(ctx, &pb.HashKVRequest{})
			errs <- err
		}()
	}
	<-entered // one walk under way, the other call waiting (or walking beside it)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := e.maint.HashKV(short, &pb.HashKVRequest{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a HashKV whose deadline passes while another walks: %v, want DeadlineExceeded", err)
	}
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if m := most.Load(); m != 1 {
		t.Fatalf("%d HashKV walks at once, want 1", m)
	}
	if w := walks.Load(); w < 2 {
		t.Fatalf("%d walks, want the 2 calls' (and perhaps the late one's, whose server-side deadline may fall after the first walk ends)", w)
	}
}
