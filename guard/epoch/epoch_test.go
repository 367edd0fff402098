package epoch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/epoch"
	"github.com/tenure-io/tenure/internal/testutil"
)

func dial(t *testing.T, addr string) *client.Client { return testutil.Dial(t, addr) }

func session(t *testing.T, ctx context.Context, c *client.Client, owner string, ttl time.Duration) *client.Session {
	return testutil.Session(t, ctx, c, client.WithOwner(owner), client.WithTTL(ttl))
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestNames(t *testing.T) {
	if got := epoch.Name(42); got != "epoch-00000000000000000042" {
		t.Fatalf("Name(42) = %s", got)
	}
	if got := epoch.Name(^uint64(0)); got != "epoch-18446744073709551615" {
		t.Fatalf("Name(max) = %s", got)
	}
	for _, tc := range []struct {
		name string
		tok  uint64
		ok   bool
	}{
		{"epoch-00000000000000000042", 42, true},
		{"epoch-18446744073709551615", ^uint64(0), true},
		{"epoch-42", 0, false},
		{"epoch-00000000000000000000", 0, false},
		{"epoch-1844674407370955161x", 0, false},
		{"epoch-99999999999999999999", 0, false},
		{"other-00000000000000000042", 0, false},
	} {
		tok, ok := epoch.ParseName(tc.name)
		if tok != tc.tok || ok != tc.ok {
			t.Fatalf("ParseName(%s) = %d, %v", tc.name, tok, ok)
		}
	}
	// Names sort in token order.
	names := []string{epoch.Name(100), epoch.Name(9), epoch.Name(10)}
	slices.Sort(names)
	if names[0] != epoch.Name(9) || names[2] != epoch.Name(100) {
		t.Fatalf("sorted %v", names)
	}
}

// TestPausedOldOwner is the file-epoch scenario: A holds, writes into its
// epoch, and is cut off (its keepalives stop, as in a long pause); the
// server expires its session and B takes over with a larger token, writes
// and publishes. A then wakes: its late files land only in its own
// unpublished directory and its publish is rejected as stale; readers see
// only B's data.
func TestPausedOldOwner(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	px := testutil.StartProxy(t, srv.Addr())
	ca := dial(t, px.Addr()) // A reaches the server through the proxy
	cb := dial(t, srv.Addr())
	reader := dial(t, srv.Addr())
	root := t.TempDir()
	const pointer = "segments/epoch"

	sa := session(t, ctx, ca, "A", time.Second)
	ma, _ := sa.Mutex("compaction")
	ha, err := ma.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	da, _ := epoch.New(ca, root, pointer)
	wa, err := da.Writer(ctx, ha.Token())
	if err != nil {
		t.Fatal(err)
	}
	if err := wa.WriteFile(ctx, "seg-1", []byte("A:1")); err != nil {
		t.Fatal(err)
	}

	// B queues for the lock; then A is cut off.
	sb := session(t, ctx, cb, "B", 5*time.Second)
	mb, _ := sb.Mutex("compaction")
	queued := make(chan struct{}, 1)
	granted := make(chan *client.Hold, 1)
	go func() {
		h, err := mb.Lock(ctx, client.OnQueued(func(int) { queued <- struct{}{} }))
		if err != nil {
			t.Error(err)
		}
		granted <- h
	}()
	<-queued
	px.Pause(true, true)

	var hb *client.Hold
	select {
	case hb = <-granted:
	case <-ctx.Done():
		t.Fatal("B was never granted the lock after A's session should have expired")
	}
	if hb == nil {
		t.FailNow()
	}
	if hb.Token() <= ha.Token() {
		t.Fatalf("B's token %d is not above A's %d", hb.Token(), ha.Token())
	}
	db, _ := epoch.New(cb, root, pointer)
	wb, err := db.Writer(ctx, hb.Token())
	if err != nil {
		t.Fatal(err)
	}
	if err := wb.WriteFile(ctx, "seg-1", []byte("B:1")); err != nil {
		t.Fatal(err)
	}
	if err := wb.WriteFile(ctx, "sub/seg-2", []byte("B:2")); err != nil {
		t.Fatal(err)
	}
	if err := wb.Publish(ctx); err != nil {
		t.Fatal(err)
	}

	// A wakes up. It had checked its hold before the pause, so it carries
	// on: its file writes succeed, but only into its own directory.
	px.Resume()
	if err := wa.WriteFile(context.Background(), "seg-2", []byte("A:2 late")); err != nil {
		t.Fatalf("A's late write: %v", err)
	}
	err = wa.Publish(ctx)
	if !errors.Is(err, client.ErrStale) {
		t.Fatalf("A's late publish: %v, want ErrStale", err)
	}

	// Readers follow the pointer and see only B's epoch.
	dr, _ := epoch.New(reader, root, pointer)
	pub, err := dr.Published(ctx)
	if err != nil || pub.Token != hb.Token() || pub.Dir != filepath.Join(root, epoch.Name(hb.Token())) {
		t.Fatalf("published %+v %v, want B's epoch %d", pub, err, hb.Token())
	}
	for rel, want := range map[string]string{"seg-1": "B:1", "sub/seg-2": "B:2"} {
		got, e, err := dr.ReadFile(ctx, rel)
		if err != nil || string(got) != want || e.Token != hb.Token() {
			t.Fatalf("read %s: %q from %d, %v; want %q", rel, got, e.Token, err, want)
		}
	}
	if _, _, err := dr.ReadFile(ctx, "seg-2"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("A's late file is visible to readers: %v", err)
	}
	// A's files are all in A's unpublished directory.
	if got := mustRead(t, filepath.Join(root, epoch.Name(ha.Token()), "seg-2")); got != "A:2 late" {
		t.Fatalf("A's late file holds %q", got)
	}
	if got := mustRead(t, filepath.Join(root, epoch.Name(hb.Token()), "seg-1")); got != "B:1" {
		t.Fatalf("B's segment was overwritten: %q", got)
	}
	// A stale owner cannot even start a new epoch.
	if _, err := da.Writer(ctx, ha.Token()); !errors.Is(err, client.ErrStale) {
		t.Fatalf("new writer for A's token: %v, want ErrStale", err)
	}

	// The server recorded why: A's grant ended by expiry.
	hist, err := reader.LockHistory(ctx, "compaction")
	if err != nil {
		t.Fatal(err)
	}
	var endedA string
	for _, g := range hist.GetGrants() {
		if g.GetToken() == ha.Token() {
			endedA = g.GetEnded()
		}
	}
	if endedA != "expired" {
		t.Fatalf("A's grant ended %q, want expired (history %v)", endedA, hist.GetGrants())
	}

	// Collecting removes A's epoch (below the published one) and keeps
	// B's; A's next write learns it is stale.
	removed, err := dr.Collect(ctx, 0)
	if err != nil || len(removed) != 1 || removed[0].Token != ha.Token() {
		t.Fatalf("collected %+v, %v; want A's epoch only", removed, err)
	}
	if err := wa.WriteFile(context.Background(), "seg-3", []byte("A:3")); !errors.Is(err, client.ErrStale) {
		t.Fatalf("write into a collected epoch: %v, want ErrStale", err)
	}
	if got, _, err := dr.ReadFile(ctx, "seg-1"); err != nil || string(got) != "B:1" {
		t.Fatalf("after collect: %q %v", got, err)
	}
}

// fakeRegs is an in-memory fenced register with the server's rule, for
// tests of the layout alone.
type fakeRegs struct {
	regs map[string]client.Register
}

func (f *fakeRegs) FencedPut(_ context.Context, key string, value []byte, token uint64, _ string, _ ...client.FenceOption) (client.PutResult, error) {
	r := f.regs[key]
	if token < r.Token {
		return client.PutResult{Token: r.Token}, client.ErrStale
	}
	f.regs[key] = client.Register{Key: key, Value: value, Token: token, Found: true}
	return client.PutResult{Accepted: true, Token: token}, nil
}

func (f *fakeRegs) FencedGet(_ context.Context, key string) (client.Register, error) {
	return f.regs[key], nil
}

func TestPublishOnlyMovesForward(t *testing.T) {
	ctx := context.Background()
	regs := &fakeRegs{regs: map[string]client.Register{}}
	d, err := epoch.New(regs, t.TempDir(), "p")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Published(ctx); !errors.Is(err, epoch.ErrNotPublished) {
		t.Fatalf("nothing published: %v", err)
	}
	if _, _, err := d.ReadFile(ctx, "x"); !errors.Is(err, epoch.ErrNotPublished) {
		t.Fatalf("read with nothing published: %v", err)
	}
	w5, _ := d.Writer(ctx, 5)
	w7, _ := d.Writer(ctx, 7)
	if err := w7.WriteFile(ctx, "f", []byte("7")); err != nil {
		t.Fatal(err)
	}
	if err := w7.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w7.Publish(ctx); err != nil {
		t.Fatalf("publishing the same epoch again: %v", err)
	}
	if err := w7.WriteFile(ctx, "g", []byte("late")); !errors.Is(err, epoch.ErrPublished) {
		t.Fatalf("write after publish: %v, want ErrPublished", err)
	}
	if err := w5.WriteFile(ctx, "f", []byte("5")); err != nil {
		t.Fatal(err)
	}
	if err := w5.Publish(ctx); !errors.Is(err, client.ErrStale) {
		t.Fatalf("older publish: %v, want ErrStale", err)
	}
	if got, e, err := d.ReadFile(ctx, "f"); err != nil || string(got) != "7" || e.Token != 7 {
		t.Fatalf("read %q from %d: %v", got, e.Token, err)
	}
	// A second writer for the published token may not add to it.
	again, err := d.Writer(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.WriteFile(ctx, "h", nil); !errors.Is(err, epoch.ErrPublished) {
		t.Fatalf("write through a new writer of a published epoch: %v", err)
	}
	for _, rel := range []string{"", "../escape", "/abs", "a/../../b"} {
		if err := w5.WriteFile(ctx, rel, nil); err == nil {
			t.Fatalf("path %q accepted", rel)
		}
	}
	// A pointer value not written by this package is reported.
	regs.regs["bad"] = client.Register{Key: "bad", Value: []byte("x"), Token: 3, Found: true}
	bad, _ := epoch.New(regs, d.Root(), "bad")
	if _, err := bad.Published(ctx); err == nil {
		t.Fatal("foreign pointer value accepted")
	}
}

func TestCollect(t *testing.T) {
	ctx := context.Background()
	regs := &fakeRegs{regs: map[string]client.Register{}}
	root := t.TempDir()
	d, _ := epoch.New(regs, root, "p")
	if removed, err := d.Collect(ctx, 0); err != nil || removed != nil {
		t.Fatalf("collect with nothing published: %v %v", removed, err)
	}
	// 2, 3 and 6 were published in turn, 7 is published now; 5 was never
	// published (a stale owner's); 9 is a newer owner's epoch in progress.
	writers := map[uint64]*epoch.Writer{}
	for _, tok := range []uint64{2, 3, 5, 6, 7, 9} {
		w, err := d.Writer(ctx, tok)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteFile(ctx, "seg", []byte("x")); err != nil {
			t.Fatal(err)
		}
		writers[tok] = w
	}
	for _, tok := range []uint64{2, 3, 6, 7} {
		if err := writers[tok].Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := writers[5].Publish(ctx); !errors.Is(err, client.ErrStale) {
		t.Fatalf("publish of 5 after 7: %v", err)
	}
	// Stray entries are left alone.
	if err := os.WriteFile(filepath.Join(root, "README"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tokens := func(es []epoch.Epoch) []uint64 {
		var out []uint64
		for _, e := range es {
			out = append(out, e.Token)
		}
		return out
	}
	removed, err := d.Collect(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := tokens(removed); !slices.Equal(got, []uint64{2, 3, 5}) {
		t.Fatalf("removed %v, want [2 3 5] (6 kept: the newest earlier published epoch)", got)
	}
	left, _ := d.Epochs()
	// 7 is published; 9 is a newer owner's unpublished epoch: never touched.
	if got := tokens(left); !slices.Equal(got, []uint64{6, 7, 9}) {
		t.Fatalf("left %v, want [6 7 9]", got)
	}
	removed, err = d.Collect(ctx, 0)
	if err != nil || !slices.Equal(tokens(removed), []uint64{6}) {
		t.Fatalf("collect keeping none: %v %v", tokens(removed), err)
	}
	ents, _ := os.ReadDir(root)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := []string{"README", epoch.Name(7), epoch.Name(7) + ".published", epoch.Name(9)}
	if !slices.Equal(names, want) {
		t.Fatalf("root holds %v, want %v", names, want)
	}
	if _, err := d.Collect(ctx, -1); err == nil {
		t.Fatal("negative keep accepted")
	}
}

func TestCreateAbort(t *testing.T) {
	ctx := context.Background()
	d, _ := epoch.New(&fakeRegs{regs: map[string]client.Register{}}, t.TempDir(), "p")
	w, _ := d.Writer(ctx, 1)
	f, err := w.Create(ctx, "seg")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("partial")); err != nil {
		t.Fatal(err)
	}
	f.Abort()
	ents, _ := os.ReadDir(w.Dir())
	if len(ents) != 0 {
		t.Fatalf("aborted file left %v", ents)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := w.WriteFile(cctx, "seg", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("write with an ended context: %v", err)
	}
}
