package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

type kvEvent struct {
	Type     string  `json:"type"`
	Key      string  `json:"key"`
	Value    *string `json:"value"`
	Revision uint64  `json:"revision"`
}

func (e kvEvent) String() string {
	v := "-"
	if e.Value != nil {
		v = *e.Value
	}
	return fmt.Sprintf("%s %s=%s @%d", e.Type, e.Key, v, e.Revision)
}

// watchLines decodes a watcher's complete output lines.
func watchLines(t *testing.T, out string) []kvEvent {
	t.Helper()
	var evs []kvEvent
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasSuffix(line, "}") { // the last line may be cut short by a kill
			continue
		}
		var e kvEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("watch output %q: %v", line, err)
		}
		evs = append(evs, e)
	}
	return evs
}

// TestWatchResumesAfterClientRestart: a `tenure kv watch` process is
// SIGKILLed while writes go on; a new one started with --from-revision
// (last revision printed + 1) prints the rest. Together they print exactly
// the committed history: nothing missed, nothing twice.
func TestWatchResumesAfterClientRestart(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	startServer(t, addr, filepath.Join(dir, "data"))

	var committed []kvEvent
	write := func(i int) {
		key := fmt.Sprintf("svc/%d", i%3)
		if i%4 == 3 {
			var out struct {
				Deleted  int64  `json:"deleted"`
				Revision uint64 `json:"revision"`
			}
			tenureJSON(t, addr, 0, &out, "kv", "del", key)
			if out.Deleted == 1 {
				committed = append(committed, kvEvent{Type: "delete", Key: key, Revision: out.Revision})
			}
			return
		}
		v := fmt.Sprint("v", i)
		var out struct {
			Revision uint64 `json:"revision"`
		}
		tenureJSON(t, addr, 0, &out, "kv", "put", key, v)
		committed = append(committed, kvEvent{Type: "put", Key: key, Value: &v, Revision: out.Revision})
	}
	tenure(t, addr, "kv", "put", "other", "x") // not under the prefix

	w1 := start(t, "watch1", addr, "kv", "watch", "svc/", "--prefix", "--from-revision", "1", "-o", "json")
	for i := range 8 {
		write(i)
	}
	last := committed[len(committed)-1].Revision
	var got1 []kvEvent
	testutil.WaitFor(t, "the first watcher to print every change so far", 20*time.Second, func() bool {
		got1 = watchLines(t, w1.stdout())
		return len(got1) > 0 && got1[len(got1)-1].Revision == last
	})
	w1.signal(syscall.SIGKILL)
	w1.wait(10 * time.Second)
	got1 = watchLines(t, w1.stdout())

	for i := 8; i < 16; i++ { // while no watcher runs
		write(i)
	}
	resume := got1[len(got1)-1].Revision + 1
	w2 := start(t, "watch2", addr, "kv", "watch", "svc/", "--prefix", "--from-revision", strconv.FormatUint(resume, 10), "-o", "json")
	for i := 16; i < 20; i++ {
		write(i)
	}
	last = committed[len(committed)-1].Revision
	var got2 []kvEvent
	testutil.WaitFor(t, "the second watcher to catch up", 20*time.Second, func() bool {
		got2 = watchLines(t, w2.stdout())
		return len(got2) > 0 && got2[len(got2)-1].Revision == last
	})
	w2.signal(syscall.SIGTERM)
	if code := w2.wait(10 * time.Second); code != 0 {
		t.Fatalf("interrupted watch exited %d", code)
	}
	got := append(got1, got2...)
	if !reflect.DeepEqual(got, committed) {
		t.Fatalf("watched\n%v\ncommitted\n%v", got, committed)
	}

	// A missing key is not an error; get prints its fields.
	var missing struct {
		Key   string `json:"key"`
		Found bool   `json:"found"`
	}
	tenureJSON(t, addr, 0, &missing, "kv", "get", "nope")
	if missing.Key != "nope" || missing.Found {
		t.Fatalf("get of a missing key: %+v", missing)
	}
	var kv struct {
		Key            string `json:"key"`
		Value          string `json:"value"`
		CreateRevision uint64 `json:"create_revision"`
		ModRevision    uint64 `json:"mod_revision"`
		Version        uint64 `json:"version"`
	}
	tenureJSON(t, addr, 0, &kv, "kv", "get", "other")
	if kv.Key != "other" || kv.Value != "x" || kv.CreateRevision == 0 || kv.ModRevision != kv.CreateRevision || kv.Version != 1 {
		t.Fatalf("get: %+v", kv)
	}
}

// TestWatchFollowsFailover: a Go client's watch on a 3-node cluster keeps
// going when the node it streams from is SIGKILLed: it resumes on another
// node after the last revision it delivered. What it delivers equals what
// a watch started afterwards from revision 1 replays, and contains every
// write that was acknowledged.
func TestWatchFollowsFailover(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dial(t, ctx, endpoints(ms))
	w, err := c.Watch(ctx, "f/", client.WithPrefix(), client.WithStartRevision(1))
	if err != nil {
		t.Fatal(err)
	}
	watchedOn := c.Endpoint() // the node the watch streams from
	var got []client.Event
	collect := func(until uint64) {
		t.Helper()
		for len(got) == 0 || got[len(got)-1].KV.ModRevision < until {
			select {
			case r, ok := <-w.C:
				if !ok {
					t.Fatalf("watch ended: %v", w.Err())
				}
				got = append(got, r.Events...)
			case <-ctx.Done():
				t.Fatalf("watch stuck at %d of %d", len(got), until)
			}
		}
	}
	acked := map[uint64]bool{}
	put := func(i int) uint64 {
		rev, err := c.Put(ctx, fmt.Sprint("f/", i%4), []byte(fmt.Sprint(i)))
		if err != nil {
			t.Logf("put %d: %v (outcome unknown)", i, err)
			return 0
		}
		acked[rev] = true
		return rev
	}
	var last uint64
	for i := range 10 {
		last = put(i)
	}
	collect(last)
	var victim *member
	for _, m := range ms {
		if m.addr == watchedOn {
			victim = m
		}
	}
	if victim == nil {
		t.Fatalf("watch endpoint %s is no member", watchedOn)
	}
	victim.p.signal(syscall.SIGKILL)
	victim.p.wait(10 * time.Second)
	for i := 10; i < 30; i++ {
		if rev := put(i); rev > 0 {
			last = rev
		}
	}
	collect(last)

	// The reference: a fresh watch from revision 1 on a surviving node.
	var alive []string
	for _, m := range ms {
		if m != victim {
			alive = append(alive, m.addr)
		}
	}
	rc := dial(t, ctx, strings.Join(alive, ","))
	rw, err := rc.Watch(ctx, "f/", client.WithPrefix(), client.WithStartRevision(1))
	if err != nil {
		t.Fatal(err)
	}
	var want []client.Event
	for len(want) < len(got) {
		select {
		case r := <-rw.C:
			want = append(want, r.Events...)
		case <-ctx.Done():
			t.Fatalf("reference watch stuck at %d of %d", len(want), len(got))
		}
	}
	if !reflect.DeepEqual(got, want[:len(got)]) {
		t.Fatalf("the watch that failed over delivered\n%v\nthe replay from revision 1 is\n%v", got, want)
	}
	seen := map[uint64]bool{}
	for _, e := range got {
		seen[e.KV.ModRevision] = true
	}
	for rev := range acked {
		if !seen[rev] {
			t.Errorf("acknowledged write at revision %d was not delivered", rev)
		}
	}
}
