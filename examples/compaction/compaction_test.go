package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/epoch"
	"github.com/tenure-io/tenure/internal/testutil"
)

func dial(t *testing.T, addr string) *client.Client { return testutil.Dial(t, addr) }

// grant takes the lock "compaction" in a new session on c.
func grant(t *testing.T, ctx context.Context, c *client.Client, owner string, ttl time.Duration) *client.Hold {
	t.Helper()
	s := testutil.Session(t, ctx, c, client.WithOwner(owner), client.WithTTL(ttl))
	m, _ := s.Mutex("compaction")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestCompactMergesAndPublishes(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dial(t, srv.Addr())
	dir := t.TempDir()

	h1 := grant(t, ctx, c, "w1", 5*time.Second)
	r1, err := Compact(ctx, c, Config{Dir: dir, Pointer: "p", Token: h1.Token(), SegmentRecords: 2, Keep: 0,
		Puts: []Record{{"b", "2"}, {"a", "1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r1.Result != "published" || r1.InputEpoch != 0 || r1.Records != 2 || len(r1.Segments) != 1 {
		t.Fatalf("first run %+v", r1)
	}
	if err := h1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	h2 := grant(t, ctx, c, "w2", 5*time.Second)
	r2, err := Compact(ctx, c, Config{Dir: dir, Pointer: "p", Token: h2.Token(), SegmentRecords: 2, Keep: 0,
		Puts: []Record{{"b", "3"}, {"c", "4"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r2.InputEpoch != h1.Token() || r2.Records != 3 || !slices.Equal(r2.Segments, []string{"seg-000001.kv", "seg-000002.kv"}) || !slices.Equal(r2.Collected, []uint64{h1.Token()}) {
		t.Fatalf("second run %+v", r2)
	}
	recs, ep, err := Read(ctx, c, dir, "p")
	if err != nil || ep != h2.Token() {
		t.Fatalf("read epoch %d: %v", ep, err)
	}
	if want := []Record{{"a", "1"}, {"b", "3"}, {"c", "4"}}; !slices.Equal(recs, want) {
		t.Fatalf("records %v, want %v", recs, want)
	}
	if _, err := os.Stat(filepath.Join(dir, epoch.Name(h1.Token()))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("first epoch not collected: %v", err)
	}
}

// TestLateWorkerIsStale: worker A writes its segments and stalls before
// publishing; its session expires; B compacts and publishes; A's publish
// is rejected and readers never see A's records.
func TestLateWorkerIsStale(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	px := testutil.StartProxy(t, srv.Addr())
	ca := dial(t, px.Addr())
	cb := dial(t, srv.Addr())
	dir := t.TempDir()

	// A base epoch both workers start from.
	h0 := grant(t, ctx, cb, "w0", 5*time.Second)
	if _, err := Compact(ctx, cb, Config{Dir: dir, Pointer: "p", Token: h0.Token(), SegmentRecords: 10, Keep: -1, Puts: []Record{{"k", "base"}}}); err != nil {
		t.Fatal(err)
	}
	if err := h0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	ha := grant(t, ctx, ca, "A", time.Second)
	stalled := make(chan struct{})
	wake := make(chan struct{})
	type outcome struct {
		res Result
		err error
	}
	doneA := make(chan outcome, 1)
	go func() {
		res, err := Compact(ctx, ca, Config{Dir: dir, Pointer: "p", Token: ha.Token(), SegmentRecords: 10, Keep: -1,
			Puts:          []Record{{"k", "from A"}, {"a-only", "x"}},
			beforePublish: func() { close(stalled); <-wake }})
		doneA <- outcome{res, err}
	}()
	<-stalled
	px.Pause(true, true) // A's keepalives stop: the server expires its session

	hb := grant(t, ctx, cb, "B", 5*time.Second) // returns once A's session expired
	rb, err := Compact(ctx, cb, Config{Dir: dir, Pointer: "p", Token: hb.Token(), SegmentRecords: 10, Keep: -1, Puts: []Record{{"k", "from B"}}})
	if err != nil || rb.InputEpoch != h0.Token() {
		t.Fatalf("B: %+v %v", rb, err)
	}

	px.Resume()
	close(wake)
	a := <-doneA
	if !errors.Is(a.err, client.ErrStale) {
		t.Fatalf("A's late publish: %+v %v, want ErrStale", a.res, a.err)
	}
	recs, ep, err := Read(ctx, cb, dir, "p")
	if err != nil || ep != hb.Token() {
		t.Fatalf("read epoch %d (want B's %d): %v", ep, hb.Token(), err)
	}
	if want := []Record{{"k", "from B"}}; !slices.Equal(recs, want) {
		t.Fatalf("readers see %v, want only B's data %v", recs, want)
	}
	// A's segments exist, in A's unpublished epoch only.
	seg, err := os.ReadFile(filepath.Join(dir, epoch.Name(ha.Token()), "seg-000001.kv"))
	if err != nil || !strings.Contains(string(seg), "from A") {
		t.Fatalf("A's own segment: %q %v", seg, err)
	}
}

// TestCommandUnderTenureLock runs the worker the way the README does:
// `tenure lock compaction -- compaction --dir D --put ...`, twice, then
// lists the published records.
func TestCommandUnderTenureLock(t *testing.T) {
	testutil.Slow(t)
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed to build the binaries: %v", err)
	}
	bin := t.TempDir()
	for pkg, out := range map[string]string{
		"github.com/tenure-io/tenure/cmd/tenure":          "tenure",
		"github.com/tenure-io/tenure/examples/compaction": "compaction",
	} {
		build := exec.Command("go", "build", "-o", filepath.Join(bin, out), pkg)
		if b, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	srv := testutil.Start(t, "", nil)
	dir := t.TempDir()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TENURE_") {
			env = append(env, kv)
		}
	}
	env = append(env, "TENURE_ENDPOINT="+srv.Addr())
	run := func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			return ee.ExitCode(), stdout.String(), stderr.String()
		case err != nil:
			t.Fatal(err)
		}
		return 0, stdout.String(), stderr.String()
	}
	tenure, worker := filepath.Join(bin, "tenure"), filepath.Join(bin, "compaction")

	var epochs []uint64
	for _, put := range []string{"user:1=alice", "user:2=bob"} {
		code, out, errOut := run(tenure, "lock", "compaction", "--", worker, "--dir", dir, "--put", put)
		if code != 0 {
			t.Fatalf("run with %s: exit %d\nstdout: %s\nstderr: %s", put, code, out, errOut)
		}
		var res Result
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.Result != "published" {
			t.Fatalf("output %q: %v", out, err)
		}
		epochs = append(epochs, res.Epoch)
	}
	if epochs[1] <= epochs[0] {
		t.Fatalf("epochs %v do not grow", epochs)
	}
	code, out, errOut := run(worker, "--dir", dir, "--list")
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, errOut)
	}
	var listed struct {
		Epoch   uint64   `json:"epoch"`
		Records []Record `json:"records"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatal(err)
	}
	if want := []Record{{"user:1", "alice"}, {"user:2", "bob"}}; listed.Epoch != epochs[1] || !slices.Equal(listed.Records, want) {
		t.Fatalf("listed %+v, want epoch %d with %v", listed, epochs[1], want)
	}
	// A token below the published epoch (a late worker) exits 3 and
	// publishes nothing.
	code, out, _ = run(worker, "--dir", dir, "--token", "1", "--put", "late=1")
	if code != 3 || !strings.Contains(out, `"result":"stale"`) {
		t.Fatalf("stale run: exit %d, %s", code, out)
	}
	// Without a token outside tenure lock: a usage error.
	if code, _, errOut := run(worker, "--dir", dir, "--put", "x=1"); code != 2 || !strings.Contains(errOut, "tenure lock") {
		t.Fatalf("no token: exit %d, %s", code, errOut)
	}
}
