package server_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

func kvCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// next waits (bounded) for the watch's next response.
func next(t *testing.T, w *client.Watcher) client.WatchResponse {
	t.Helper()
	select {
	case r, ok := <-w.C:
		if !ok {
			t.Fatalf("watch ended: %v", w.Err())
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no watch response within 10s")
	}
	panic("unreachable")
}

func TestKVPutGetDeleteTxn(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx := kvCtx(t)
	c := testutil.Dial(t, srv.Addr())

	r1, err := c.Put(ctx, "cfg/a", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := c.Put(ctx, "cfg/a", []byte("2"))
	c.Put(ctx, "cfg/b", []byte("x"))
	got, err := c.Get(ctx, "cfg/a")
	if err != nil || len(got.KVs) != 1 {
		t.Fatalf("get: %+v %v", got, err)
	}
	if kv := got.KVs[0]; string(kv.Value) != "2" || kv.CreateRevision != r1 || kv.ModRevision != r2 || kv.Version != 2 || got.Revision < r2 {
		t.Fatalf("get = %+v (revisions %d, %d)", got, r1, r2)
	}
	if got, _ := c.Get(ctx, "missing"); len(got.KVs) != 0 {
		t.Fatalf("missing key: %+v", got)
	}
	rng, _ := c.Range(ctx, "cfg/", 0)
	if len(rng.KVs) != 2 || rng.KVs[0].Key != "cfg/a" || rng.KVs[1].Key != "cfg/b" {
		t.Fatalf("range: %+v", rng)
	}
	// Compare-and-swap on the mod revision: the first wins, the second
	// (with the same expectation) takes the else branch and sees the winner.
	cas := func(v string) client.TxnResult {
		res, err := c.Txn(ctx, []client.Compare{client.ModRevisionIs("cfg/a", client.Equal, r2)},
			[]client.Op{client.OpPut("cfg/a", []byte(v))}, []client.Op{client.OpGet("cfg/a")})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := cas("3"); !res.Succeeded {
		t.Fatalf("first CAS: %+v", res)
	}
	if res := cas("4"); res.Succeeded || string(res.Results[0].KVs[0].Value) != "3" {
		t.Fatalf("second CAS: %+v", res)
	}
	// Create-if-missing.
	res, _ := c.Txn(ctx, []client.Compare{client.KeyMissing("cfg/new")}, []client.Op{client.OpPut("cfg/new", nil)}, nil)
	if !res.Succeeded {
		t.Fatalf("create if missing: %+v", res)
	}
	d, err := c.DeletePrefix(ctx, "cfg/")
	if err != nil || d.Deleted != 3 {
		t.Fatalf("delete prefix: %+v %v", d, err)
	}
	if d2, _ := c.Delete(ctx, "cfg/a"); d2.Deleted != 0 || d2.Revision != d.Revision {
		t.Fatalf("delete of nothing: %+v (after %+v)", d2, d)
	}
}

func TestKVEphemeralKeyGoesWithItsSession(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx := kvCtx(t)
	c := testutil.Dial(t, srv.Addr())
	s := testutil.Session(t, ctx, c)
	w, err := c.Watch(ctx, "svc/", client.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	rev, err := c.Put(ctx, "svc/me", []byte("addr"), client.WithSession(s))
	if err != nil {
		t.Fatal(err)
	}
	if r := next(t, w); len(r.Events) != 1 || r.Events[0].Type != client.EventPut || r.Events[0].KV.Session != s.ID() || r.Events[0].KV.ModRevision != rev {
		t.Fatalf("put event: %+v", r)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r := next(t, w); len(r.Events) != 1 || r.Events[0].Type != client.EventDelete || r.Events[0].KV.Key != "svc/me" {
		t.Fatalf("delete event: %+v", r)
	}
	if got, _ := c.Get(ctx, "svc/me"); len(got.KVs) != 0 {
		t.Fatalf("ephemeral key outlived its session: %+v", got)
	}
	if _, err := c.Put(ctx, "svc/late", nil, client.WithSession(s)); !errors.Is(err, client.ErrSessionExpired) {
		t.Fatalf("put bound to a closed session: %v", err)
	}
}

// TestKVLimits: past a limit the error names it; everything within the
// limits is still served.
func TestKVLimits(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{KV: server.KVLimits{MaxKeyLen: 8, MaxValueLen: 10, MaxTxnOps: 3}}, ClusterLimits: fsm.Limits{MaxKeys: 2}})
	ctx := kvCtx(t)
	c := testutil.Dial(t, srv.Addr())
	for _, tc := range []struct {
		name string
		err  error
		want error
		flag string
	}{
		{"long key", func() error { _, err := c.Put(ctx, "123456789", nil); return err }(), client.ErrInvalid, "--max-key-len"},
		{"big value", func() error { _, err := c.Put(ctx, "k", []byte("12345678901"), nil...); return err }(), client.ErrInvalid, "--max-value-len"},
		{"big txn", func() error {
			_, err := c.Txn(ctx, nil, []client.Op{client.OpGet("a"), client.OpGet("b")}, []client.Op{client.OpGet("c"), client.OpGet("d")})
			return err
		}(), client.ErrInvalid, "--max-txn-ops"},
	} {
		if !errors.Is(tc.err, tc.want) || !strings.Contains(tc.err.Error(), tc.flag) {
			t.Errorf("%s: %v, want %v naming %s", tc.name, tc.err, tc.want, tc.flag)
		}
	}
	w, err := c.Watch(ctx, "", client.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	c.Put(ctx, "a", []byte("1"))
	c.Put(ctx, "b", []byte("1"))
	if _, err := c.Put(ctx, "c", []byte("1")); !errors.Is(err, client.ErrLimit) || !strings.Contains(err.Error(), "--max-keys") {
		t.Fatalf("third key: %v, want ErrLimit naming --max-keys", err)
	}
	if _, err := c.Txn(ctx, nil, []client.Op{client.OpPut("d", nil)}, nil); !errors.Is(err, client.ErrLimit) {
		t.Fatalf("txn creating a key past the limit: %v", err)
	}
	// At the limit: overwrites, reads, deletes and watches go on.
	if _, err := c.Put(ctx, "a", []byte("2")); err != nil {
		t.Fatalf("overwrite at the limit: %v", err)
	}
	if got, err := c.Range(ctx, "", 0); err != nil || len(got.KVs) != 2 {
		t.Fatalf("range at the limit: %+v %v", got, err)
	}
	if _, err := c.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "c", []byte("1")); err != nil {
		t.Fatalf("put after a delete freed room: %v", err)
	}
	var n int
	for n < 5 {
		n += len(next(t, w).Events)
	}
}

// TestWatchCompacted: a watch from a revision the bounded history no
// longer holds ends with ErrCompacted carrying the revisions to recover
// with; re-reading and watching from the read's revision + 1 works.
func TestWatchCompacted(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{KV: server.KVLimits{WatchHistory: 10}}})
	ctx := kvCtx(t)
	c := testutil.Dial(t, srv.Addr())
	var last uint64
	for i := range 30 {
		last, _ = c.Put(ctx, fmt.Sprintf("k%02d", i), []byte("v"))
	}
	_, err := c.Watch(ctx, "k", client.WithPrefix(), client.WithStartRevision(1))
	var ce *client.CompactedError
	if !errors.As(err, &ce) || !errors.Is(err, client.ErrCompacted) {
		t.Fatalf("watch from 1: %v, want a CompactedError", err)
	}
	if ce.CurrentRevision != last || ce.CompactRevision != last-10 || !strings.Contains(err.Error(), "--watch-history") {
		t.Fatalf("compacted error %+v (%v); last write %d", ce, err, last)
	}
	// Status says the same.
	if st, err := c.Status(ctx); err != nil || st.GetWatchCompactRevision() != last-10 || st.GetWatchHistoryEvents() != 10 {
		t.Fatalf("status: %v %v", st, err)
	}
	// The oldest revision still held works.
	w, err := c.Watch(ctx, "k", client.WithPrefix(), client.WithStartRevision(ce.CompactRevision+1))
	if err != nil {
		t.Fatal(err)
	}
	if r := next(t, w); len(r.Events) != 10 || r.Events[0].KV.ModRevision != ce.CompactRevision+1 {
		t.Fatalf("watch from the compact revision + 1: %d events, first %+v", len(r.Events), r.Events[0])
	}
	// Recovery: read, then watch from the read's revision + 1.
	got, _ := c.Range(ctx, "k", 0)
	w2, err := c.Watch(ctx, "k", client.WithPrefix(), client.WithStartRevision(got.Revision+1))
	if err != nil {
		t.Fatal(err)
	}
	rev, _ := c.Put(ctx, "k99", nil)
	if r := next(t, w2); len(r.Events) != 1 || r.Events[0].KV.ModRevision != rev {
		t.Fatalf("resumed watch: %+v", r)
	}
}

// TestWatchSlowWatcherEndsCompacted: a watcher that does not read while
// the history moves past it ends with ErrCompacted, never silently.
func TestWatchSlowWatcherEndsCompacted(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{KV: server.KVLimits{WatchHistory: 16}}})
	ctx := kvCtx(t)
	c := testutil.Dial(t, srv.Addr())
	w, err := c.Watch(ctx, "", client.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(strings.Repeat("x", 60<<10))
	var wg sync.WaitGroup
	for g := range 8 { // 29 MB: more than the client (64 responses) and gRPC (at most 16 MB windows) buffer
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 60 {
				if _, err := c.Put(ctx, fmt.Sprint("k", g), big); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	seen := uint64(0)
	for r := range w.C {
		for _, e := range r.Events {
			if e.KV.ModRevision != seen+1 && seen != 0 {
				t.Fatalf("gap: %d after %d", e.KV.ModRevision, seen)
			}
			seen = e.KV.ModRevision
		}
	}
	if !errors.Is(w.Err(), client.ErrCompacted) {
		t.Fatalf("slow watcher ended with %v (saw up to %d), want ErrCompacted", w.Err(), seen)
	}
}

// TestWatchProgress: an idle watch is told the current revision, which
// moves with writes it does not watch (here, sessions).
func TestWatchProgress(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{KV: server.KVLimits{WatchProgressInterval: 20 * time.Millisecond}}})
	ctx := kvCtx(t)
	c := testutil.Dial(t, srv.Addr())
	w, err := c.Watch(ctx, "quiet")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Session(t, ctx, c)
	rev, _ := c.Put(ctx, "other", nil)
	for {
		r := next(t, w)
		if len(r.Events) != 0 {
			t.Fatalf("events on an idle key: %+v", r)
		}
		if r.Progress && r.Revision == rev {
			return
		}
		if !r.Progress || r.Revision > rev {
			t.Fatalf("unexpected %+v (current revision %d)", r, rev)
		}
	}
}

// TestWatchEqualsCommittedHistory: concurrent writers; watchers started
// before, during and after the writes, from revision 1, from a middle
// revision and from now, on a key, a prefix and everything, one of them
// through a proxy that cuts its connection repeatedly. Each receives
// exactly the committed history of what it watches from its start.
func TestWatchEqualsCommittedHistory(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx := kvCtx(t)
	c := testutil.Dial(t, srv.Addr())
	proxy := testutil.StartProxy(t, srv.Addr())
	pc := testutil.Dial(t, proxy.Addr())

	type change struct {
		Rev uint64
		Key string
		Put bool
		Val string
	}
	var mu sync.Mutex
	var history []change
	record := func(ch ...change) {
		mu.Lock()
		history = append(history, ch...)
		mu.Unlock()
	}
	keys := []string{"a/1", "a/2", "a/3", "b/1", "b/2"}

	type watch struct {
		key    string
		prefix bool
		from   uint64
		w      *client.Watcher
		got    []change
	}
	var watches []*watch
	start := func(cl *client.Client, key string, prefix bool, from uint64) {
		var opts []client.WatchOption
		if prefix {
			opts = append(opts, client.WithPrefix())
		}
		if from > 0 {
			opts = append(opts, client.WithStartRevision(from))
		}
		w, err := cl.Watch(ctx, key, opts...)
		if err != nil {
			t.Fatal(err)
		}
		watches = append(watches, &watch{key: key, prefix: prefix, from: from, w: w})
	}
	start(c, "", true, 0)
	start(pc, "a/", true, 0) // through the cutting proxy
	start(c, "a/1", false, 0)

	write := func(seed int64, n int) {
		rnd := rand.New(rand.NewSource(seed))
		for i := range n {
			if seed == 0 && i%12 == 11 {
				proxy.Cut() // the proxied watcher reconnects and resumes
			}
			k := keys[rnd.Intn(len(keys))]
			switch rnd.Intn(4) {
			case 0, 1:
				v := fmt.Sprint(rnd.Int())
				rev, err := c.Put(ctx, k, []byte(v))
				if err != nil {
					t.Error(err)
					return
				}
				record(change{rev, k, true, v})
			case 2:
				d, err := c.Delete(ctx, k)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Deleted == 1 {
					record(change{d.Revision, k, false, ""})
				}
			case 3: // a transaction writing two keys at one revision
				k2 := keys[(rnd.Intn(len(keys)-1)+1+indexOf(keys, k))%len(keys)]
				res, err := c.Txn(ctx, nil, []client.Op{client.OpPut(k, []byte("t")), client.OpPut(k2, []byte("t"))}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				record(change{res.Revision, k, true, "t"}, change{res.Revision, k2, true, "t"})
			}
		}
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); write(int64(i), 60) }()
	}
	wg.Wait()
	mu.Lock()
	mid := history[len(history)/2].Rev
	mu.Unlock()
	start(c, "", true, 1)
	start(c, "b/", true, mid)
	write(99, 20)
	final, _ := c.Put(ctx, "end", nil)
	record(change{final, "end", true, ""})

	mu.Lock()
	defer mu.Unlock()
	// Within one revision, changes come in the order applied (a
	// transaction's op order), which record kept.
	sort.SliceStable(history, func(i, j int) bool { return history[i].Rev < history[j].Rev })
	for _, wt := range watches {
		want := []change{}
		for _, ch := range history {
			match := ch.Key == wt.key || (wt.prefix && strings.HasPrefix(ch.Key, wt.key))
			if match && ch.Rev >= wt.from {
				want = append(want, ch)
			}
		}
		got := []change{}
		for len(got) < len(want) || (len(want) > 0 && got[len(got)-1].Rev < want[len(want)-1].Rev) {
			r := next(t, wt.w)
			for _, e := range r.Events {
				got = append(got, change{e.KV.ModRevision, e.KV.Key, e.Type == client.EventPut, string(e.KV.Value)})
			}
			if len(got) > len(want) {
				break
			}
		}
		if !reflect.DeepEqual(got, want) {
			i := 0
			for i < min(len(got), len(want)) && got[i] == want[i] {
				i++
			}
			t.Errorf("watch %q prefix=%v from %d: %d events, want %d; first difference at %d: got %v, want %v",
				wt.key, wt.prefix, wt.from, len(got), len(want), i, got[i:min(i+3, len(got))], want[i:min(i+3, len(want))])
		}
	}
}

func indexOf(s []string, x string) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}

// TestKVRestart: keys survive a restart; the watch history after a restart
// covers the revisions after the latest snapshot (the log after it is
// applied again), and older revisions answer compacted with the snapshot's
// revision.
func TestKVRestart(t *testing.T) {
	testutil.Slow(t)
	dir := t.TempDir()
	ctx := kvCtx(t)
	srv := testutil.Start(t, dir, nil)
	c := testutil.Dial(t, srv.Addr())
	r1, _ := c.Put(ctx, "a", []byte("1"))
	r2, _ := c.Put(ctx, "b", []byte("2"))
	srv.Stop(t)

	srv = testutil.Start(t, dir, nil)
	c = testutil.Dial(t, srv.Addr())
	got, err := c.Get(ctx, "a")
	if err != nil || len(got.KVs) != 1 || string(got.KVs[0].Value) != "1" || got.KVs[0].ModRevision != r1 {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	w, err := c.Watch(ctx, "", client.WithPrefix(), client.WithStartRevision(1))
	if err != nil {
		t.Fatalf("watch from 1 after a restart without snapshot: %v", err)
	}
	if r := next(t, w); len(r.Events) != 2 || r.Events[0].KV.ModRevision != r1 || r.Events[1].KV.ModRevision != r2 {
		t.Fatalf("replayed history: %+v", r)
	}
	if err := srv.Node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	var snapRev uint64
	srv.Node.Read(func(st *fsm.State) { snapRev = st.Revision() })
	r3, _ := c.Put(ctx, "c", []byte("3"))
	srv.Stop(t)

	srv = testutil.Start(t, dir, nil)
	c = testutil.Dial(t, srv.Addr())
	_, err = c.Watch(ctx, "", client.WithPrefix(), client.WithStartRevision(1))
	var ce *client.CompactedError
	if !errors.As(err, &ce) || ce.CompactRevision != snapRev {
		t.Fatalf("watch from 1 after a restart from a snapshot at %d: %v", snapRev, err)
	}
	w, err = c.Watch(ctx, "", client.WithPrefix(), client.WithStartRevision(ce.CompactRevision+1))
	if err != nil {
		t.Fatal(err)
	}
	if r := next(t, w); len(r.Events) != 1 || r.Events[0].KV.Key != "c" || r.Events[0].KV.ModRevision != r3 {
		t.Fatalf("history after the snapshot: %+v", r)
	}
	if got, _ := c.Range(ctx, "", 0); len(got.KVs) != 3 {
		t.Fatalf("keys after restart from a snapshot: %+v", got)
	}
}

// TestWatchEndsWithItsClient: closing the client ends its watches with an
// error (no goroutine left retrying on a closed connection).
func TestWatchEndsWithItsClient(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx := kvCtx(t)
	c, err := client.Dial(ctx, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case <-w.C:
	case <-time.After(10 * time.Second):
		t.Fatal("watch still open 10s after its client closed")
	}
	if !errors.Is(w.Err(), client.ErrClosed) {
		t.Fatalf("watch of a closed client ended with %v, want ErrClosed", w.Err())
	}
}

// TestKVRangePaging: RangeFrom with a limit pages through a prefix, every
// key once, in order.
func TestKVRangePaging(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx := kvCtx(t)
	c := testutil.Dial(t, srv.Addr())
	var want []string
	for i := range 10 {
		k := fmt.Sprintf("p/%02d", i)
		want = append(want, k)
		c.Put(ctx, k, nil)
	}
	c.Put(ctx, "q", nil) // outside the prefix
	var got []string
	start := ""
	for pages := 0; ; pages++ {
		r, err := c.RangeFrom(ctx, "p/", start, 3)
		if err != nil || pages > 4 {
			t.Fatalf("page %d: %+v %v", pages, r, err)
		}
		for _, kv := range r.KVs {
			got = append(got, kv.Key)
		}
		if !r.More {
			break
		}
		start = r.KVs[len(r.KVs)-1].Key + "\x00"
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("paged %v, want %v", got, want)
	}
	// A start before the prefix starts at the prefix.
	if r, _ := c.RangeFrom(ctx, "p/", "a", 1); len(r.KVs) != 1 || r.KVs[0].Key != "p/00" {
		t.Fatalf("start before the prefix: %+v", r)
	}
}
