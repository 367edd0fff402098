package server_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// pageBytes is the most a page may carry (the server's maxPageBytes) plus
// the response's own fields.
const pageBytes = 2<<20 + 1024

// longNames returns n lock names of about 500 bytes under prefix.
func longNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%05d-%s", prefix, i, strings.Repeat("x", 490))
	}
	return out
}

// TestListSessionsPagesWhileSessionsComeAndGo lists a few thousand
// sessions in tiny pages while others are created and closed: every
// session that lives throughout is listed exactly once, in id order.
func TestListSessionsPagesWhileSessionsComeAndGo(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stay := testutil.OpenSessions(t, srv.Addr(), "stay", time.Hour, 3000)

	churn, stopChurn := context.WithCancel(ctx)
	churned := make(chan error, 1)
	go func() {
		c, err := client.Dial(ctx, srv.Addr())
		if err != nil {
			churned <- err
			return
		}
		defer c.Close()
		for churn.Err() == nil {
			s, err := c.NewSession(churn, client.WithOwner("churn"))
			if err != nil {
				break
			}
			_ = s.Close(ctx)
		}
		churned <- nil
	}()

	a := testutil.API(t, srv.Addr())
	var ids []uint64
	var after uint64
	pages := 0
	for {
		resp, err := a.ListSessions(ctx, &pb.ListSessionsRequest{AfterId: after, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(resp.GetSessions()) > 7 {
			t.Fatalf("a page of limit 7 listed %d sessions", len(resp.GetSessions()))
		}
		for _, s := range resp.GetSessions() {
			if s.GetId() <= after {
				t.Fatalf("session %d listed after %d", s.GetId(), after)
			}
			after = s.GetId()
			if s.GetOwner() == "stay" {
				ids = append(ids, s.GetId())
			}
		}
		if !resp.GetMore() {
			break
		}
	}
	stopChurn()
	if err := <-churned; err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, stay) {
		t.Fatalf("listed %d of the %d sessions that lived throughout (in %d pages)", len(ids), len(stay), pages)
	}
	if pages < 3000/7 {
		t.Fatalf("only %d pages", pages)
	}
	// The largest page is the server's.
	resp, err := a.ListSessions(ctx, &pb.ListSessionsRequest{Limit: 1_000_000})
	if err != nil || len(resp.GetSessions()) < 3000 || resp.GetMore() {
		t.Fatalf("one page of every session: %d listed, more %v, %v", len(resp.GetSessions()), resp.GetMore(), err)
	}
}

// TestListingsStopAt2MiB: sessions holding many long-named locks make
// pages end at the byte bound, and the Go client follows them.
func TestListingsStopAt2MiB(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var names []string
	var sessions []uint64
	for i := range 12 {
		n := longNames(fmt.Sprintf("s%02d/", i), 400)
		sessions = append(sessions, testutil.HoldMany(t, srv.Addr(), "holder", time.Hour, n))
		names = append(names, n...)
	}
	a := testutil.API(t, srv.Addr())

	first, err := a.ListSessions(ctx, &pb.ListSessionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !first.GetMore() || len(first.GetSessions()) == 0 || len(first.GetSessions()) == len(sessions) || proto.Size(first) > pageBytes {
		t.Fatalf("first page: %d sessions, %d bytes, more %v", len(first.GetSessions()), proto.Size(first), first.GetMore())
	}
	c := testutil.Dial(t, srv.Addr())
	all, err := c.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, s := range all.GetSessions() {
		got = append(got, s.GetId())
		if len(s.GetHeld()) != 400 || s.GetHeldCount() != 400 {
			t.Fatalf("session %d lists %d held, counts %d", s.GetId(), len(s.GetHeld()), s.GetHeldCount())
		}
	}
	if !slices.Equal(got, sessions) || all.GetRevision() != first.GetRevision() {
		t.Fatalf("client listed %v at %d, want %v at %d", got, all.GetRevision(), sessions, first.GetRevision())
	}

	lfirst, err := a.ListLocks(ctx, &pb.ListLocksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !lfirst.GetMore() || proto.Size(lfirst) > pageBytes {
		t.Fatalf("first page of locks: %d locks, %d bytes, more %v", len(lfirst.GetLocks()), proto.Size(lfirst), lfirst.GetMore())
	}
	locks, err := c.Locks(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var gotNames []string
	for _, l := range locks.GetLocks() {
		gotNames = append(gotNames, l.GetName())
		if l.GetHolders() != 1 || l.GetPermits() != 1 || l.GetWaiters() != 0 || l.GetDelayed() {
			t.Fatalf("lock %+v", l)
		}
	}
	if !slices.Equal(gotNames, names) {
		t.Fatalf("client listed %d locks, want %d", len(gotNames), len(names))
	}
	if got, err := c.Locks(ctx, "s03/"); err != nil || len(got.GetLocks()) != 400 || got.GetLocks()[0].GetName() != names[3*400] {
		t.Fatalf("locks under s03/: %d, %v", len(got.GetLocks()), err)
	}
}

func TestListLocksPages(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var names []string
	for i := range 300 {
		names = append(names, fmt.Sprintf("a/%03d", i))
	}
	testutil.HoldMany(t, srv.Addr(), "h", time.Hour, append(slices.Clone(names), "b", "a", "a0"))
	a := testutil.API(t, srv.Addr())
	var got []string
	after := ""
	for {
		resp, err := a.ListLocks(ctx, &pb.ListLocksRequest{Prefix: "a/", After: after, Limit: 11})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetLocks()) > 11 {
			t.Fatalf("%d locks in a page of 11", len(resp.GetLocks()))
		}
		for _, l := range resp.GetLocks() {
			got = append(got, l.GetName())
			after = l.GetName()
		}
		if !resp.GetMore() {
			break
		}
	}
	if !slices.Equal(got, names) {
		t.Fatalf("listed %v", got)
	}
}

// TestLockStatusPages: a lock's holders and waiters come in pages, in
// grant order, with counts; the Go client follows them.
func TestLockStatusPages(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	var holders, waiters []uint64 // sessions, in grant order
	for i := range 40 {
		s := testutil.Session(t, ctx, c, client.WithOwner(fmt.Sprintf("s%d", i)))
		m, err := s.Mutex("sem", client.WithPermits(15))
		if err != nil {
			t.Fatal(err)
		}
		if i < 15 {
			if _, err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			holders = append(holders, s.ID())
			continue
		}
		queued := make(chan struct{})
		go func() { _, _ = m.Lock(ctx, client.OnQueued(func(int) { close(queued) })) }()
		<-queued
		waiters = append(waiters, s.ID())
	}

	a := testutil.API(t, srv.Addr())
	var gotH, gotW []uint64
	req := &pb.LockStatusRequest{Name: "sem", Limit: 4}
	for {
		resp, err := a.LockStatus(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetHolderCount() != 15 || resp.GetWaiterCount() != 25 || resp.GetHolder().GetSession() != holders[0] || resp.GetPermits() != 15 {
			t.Fatalf("page %v", resp)
		}
		if len(resp.GetHolders()) > 4 || len(resp.GetWaiters()) > 4 {
			t.Fatalf("page of limit 4 lists %d holders, %d waiters", len(resp.GetHolders()), len(resp.GetWaiters()))
		}
		for _, h := range resp.GetHolders() {
			gotH = append(gotH, h.GetSession())
			req.HoldersAfter = h.GetToken()
		}
		for _, w := range resp.GetWaiters() {
			gotW = append(gotW, w.GetSession())
			req.WaitersAfter = w.GetQueuedRevision()
		}
		if !resp.GetMoreHolders() {
			req.HoldersAfter = math.MaxUint64
		}
		if !resp.GetMoreWaiters() {
			req.WaitersAfter = math.MaxUint64
		}
		if !resp.GetMoreHolders() && !resp.GetMoreWaiters() {
			break
		}
	}
	if !slices.Equal(gotH, holders) || !slices.Equal(gotW, waiters) {
		t.Fatalf("paged holders %v waiters %v, want %v %v", gotH, gotW, holders, waiters)
	}
	st, err := c.LockStatus(ctx, "sem")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GetHolders()) != 15 || len(st.GetWaiters()) != 25 || st.GetMoreHolders() || st.GetMoreWaiters() {
		t.Fatalf("client: %d holders, %d waiters", len(st.GetHolders()), len(st.GetWaiters()))
	}
}

// TestLockStatusWith10000Waiters: the waiters of a lock with 10,000 of
// them, each with a 256-byte owner, are more than one page holds; the Go
// client lists them all, in order.
func TestLockStatusWith10000Waiters(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	owner := strings.Repeat("o", 256)
	holder := testutil.HoldMany(t, srv.Addr(), owner, time.Hour, []string{"hot"})
	ids := testutil.OpenWaiters(t, srv.Addr(), owner, time.Hour, 10_000, "hot")

	first, err := testutil.API(t, srv.Addr()).LockStatus(ctx, &pb.LockStatusRequest{Name: "hot"})
	if err != nil {
		t.Fatal(err)
	}
	if !first.GetMoreWaiters() || proto.Size(first) > pageBytes || first.GetWaiterCount() != 10_000 {
		t.Fatalf("first page: %d waiters of %d, %d bytes, more %v", len(first.GetWaiters()), first.GetWaiterCount(), proto.Size(first), first.GetMoreWaiters())
	}
	st, err := testutil.Dial(t, srv.Addr()).LockStatus(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, w := range st.GetWaiters() {
		got = append(got, w.GetSession())
	}
	if !slices.Equal(got, ids) || st.GetHolder().GetSession() != holder {
		t.Fatalf("client listed %d waiters (holder %d), want %d (holder %d)", len(got), st.GetHolder().GetSession(), len(ids), holder)
	}
}

// TestKVRangePages: a range with no limit answers at most 10,000 keys or
// 2 MiB a page; the Go client's Range follows the pages.
func TestKVRangePages(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	big := make([]byte, 60<<10)
	var keys []string
	for i := range 80 {
		k := fmt.Sprintf("big/%03d", i)
		if _, err := c.Put(ctx, k, big); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	first, err := testutil.API(t, srv.Addr()).KVRange(ctx, &pb.KVRangeRequest{Key: "big/", Prefix: true})
	if err != nil {
		t.Fatal(err)
	}
	if !first.GetMore() || len(first.GetKvs()) == 0 || proto.Size(first) > pageBytes {
		t.Fatalf("first page: %d keys, %d bytes, more %v", len(first.GetKvs()), proto.Size(first), first.GetMore())
	}
	for _, limit := range []int64{0, 50, 80, 1000} {
		r, err := c.Range(ctx, "big/", limit)
		if err != nil {
			t.Fatal(err)
		}
		want := keys[:min(int(limit), len(keys))]
		if limit == 0 {
			want = keys
		}
		var got []string
		for _, kv := range r.KVs {
			got = append(got, kv.Key)
		}
		if !slices.Equal(got, want) || r.More != (len(want) < len(keys)) || r.Revision != first.GetRevision() {
			t.Fatalf("Range limit %d: %d keys, more %v, revision %d; want %d keys at %d", limit, len(got), r.More, r.Revision, len(want), first.GetRevision())
		}
	}

	// A page of small keys stops at 10,000.
	for i := 0; i < 10_050; i += 100 {
		var ops []client.Op
		for j := i; j < i+100; j++ {
			ops = append(ops, client.OpPut(fmt.Sprintf("small/%05d", j), []byte("v")))
		}
		if _, err := c.Txn(ctx, nil, ops, nil); err != nil {
			t.Fatal(err)
		}
	}
	page, err := testutil.API(t, srv.Addr()).KVRange(ctx, &pb.KVRangeRequest{Key: "small/", Prefix: true, Limit: 20_000})
	if err != nil || len(page.GetKvs()) != 10_000 || !page.GetMore() {
		t.Fatalf("a page of limit 20,000: %d keys, more %v, %v", len(page.GetKvs()), page.GetMore(), err)
	}
	if r, err := c.Range(ctx, "small/", 0); err != nil || len(r.KVs) != 10_100 || r.More {
		t.Fatalf("Range of 10,100 small keys: %d, more %v, %v", len(r.KVs), r.More, err)
	}
}

// TestDeadLettersPages: dead letters of 1 MiB come at most 2 MiB (or one
// item) a page, and DeadLetters follows the pages.
func TestDeadLettersPages(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("q")
	var ids []uint64
	for range 5 {
		e, err := q.Enqueue(ctx, make([]byte, 1<<20-100), client.WithMaxAttempts(1))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
		d, err := q.Dequeue(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Nack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	first, err := testutil.API(t, srv.Addr()).QueueDeadList(ctx, &pb.QueueDeadListRequest{Queue: "q", Limit: 1000}, grpc.MaxCallRecvMsgSize(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	if len(first.GetItems()) != 2 || !first.GetMore() || proto.Size(first) > pageBytes || first.GetDead() != 5 {
		t.Fatalf("first page: %d items, %d bytes, more %v, dead %d", len(first.GetItems()), proto.Size(first), first.GetMore(), first.GetDead())
	}
	for _, limit := range []int{0, 3} {
		dl, err := q.DeadLetters(ctx, 0, limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for _, d := range dl {
			got = append(got, d.ID)
		}
		want := ids
		if limit > 0 {
			want = ids[:limit]
		}
		if !slices.Equal(got, want) {
			t.Fatalf("DeadLetters limit %d: %v, want %v", limit, got, want)
		}
	}
}

// TestLockStatusPagesShareTheBytes: holders with large values fill most
// of the page, and waiters the rest; the next page goes on with both
// where they were, and the Go client lists them all.
func TestLockStatusPagesShareTheBytes(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := testutil.API(t, srv.Addr())
	value := make([]byte, 60<<10)
	acquire := func(wait bool) uint64 {
		st, err := testutil.OpenRawSession(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		owner := ""
		if wait {
			owner = strings.Repeat("w", 256)
		}
		st.Send(&pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{TtlMs: 600_000, Owner: owner}}})
		st.Send(&pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: "sem", Permits: 40, Value: value, Wait: wait}}})
		opened, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r, err := st.Recv(); err != nil || (r.GetGranted() == nil) == !wait {
			t.Fatalf("acquire (wait %v): %v %v", wait, r, err)
		}
		return opened.GetOpened().GetSessionId()
	}
	var holders, waiters []uint64
	for range 40 {
		holders = append(holders, acquire(false))
	}
	for range 100 {
		waiters = append(waiters, acquire(true))
	}
	first, err := a.LockStatus(ctx, &pb.LockStatusRequest{Name: "sem"})
	if err != nil {
		t.Fatal(err)
	}
	if !first.GetMoreHolders() || !first.GetMoreWaiters() || len(first.GetWaiters()) == 0 || proto.Size(first) > pageBytes {
		t.Fatalf("first page: %d holders, %d waiters, %d bytes, more %v %v", len(first.GetHolders()), len(first.GetWaiters()), proto.Size(first), first.GetMoreHolders(), first.GetMoreWaiters())
	}
	st, err := testutil.Dial(t, srv.Addr()).LockStatus(ctx, "sem")
	if err != nil {
		t.Fatal(err)
	}
	var gotH, gotW []uint64
	for _, h := range st.GetHolders() {
		gotH = append(gotH, h.GetSession())
	}
	for _, w := range st.GetWaiters() {
		gotW = append(gotW, w.GetSession())
	}
	if !slices.Equal(gotH, holders) || !slices.Equal(gotW, waiters) {
		t.Fatalf("client: holders %v waiters %v, want %v %v", gotH, gotW, holders, waiters)
	}
}
