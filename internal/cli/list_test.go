package cli

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// listed returns field of every object in m[key].
func listed(t *testing.T, m map[string]any, key, field string) []string {
	t.Helper()
	items, ok := m[key].([]any)
	if !ok {
		t.Fatalf("%q is not an array in %v", key, m)
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = fmt.Sprint(it.(map[string]any)[field])
	}
	return out
}

// TestListingsFollowPages: session list, lock list, kv get --prefix and
// queue dlq list print everything, also when the server answers in
// several pages (here: pages cut at 2 MiB).
func TestListingsFollowPages(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// 12 sessions holding 400 locks each with names of 500 bytes: about
	// 2.5 MiB of sessions, and as much of locks.
	var sessions, names []string
	for i := range 12 {
		var n []string
		for j := range 400 {
			n = append(n, fmt.Sprintf("s%02d/%03d-%s", i, j, strings.Repeat("x", 490)))
		}
		sessions = append(sessions, fmt.Sprint(testutil.HoldMany(t, addr, "holder", time.Hour, n)))
		names = append(names, n...)
	}
	sl := runJSON(t, addr, 0, "session", "list")
	hasKeys(t, sl, map[string]string{"sessions": "array", "revision": "number"})
	if got := listed(t, sl, "sessions", "id"); !slices.Equal(got, sessions) {
		t.Fatalf("session list: %d sessions, want %d", len(got), len(sessions))
	}
	first := sl["sessions"].([]any)[0].(map[string]any)
	hasKeys(t, first, map[string]string{"id": "number", "owner": "string", "ttl_ms": "number", "held": "array", "waiting": "array", "held_count": "number", "waiting_count": "number"})
	if len(first["held"].([]any)) != 400 || num(t, first, "held_count") != 400 {
		t.Fatalf("first session: %d held, held_count %v", len(first["held"].([]any)), first["held_count"])
	}

	ll := runJSON(t, addr, 0, "lock", "list")
	hasKeys(t, ll, map[string]string{"locks": "array", "next": "null"})
	if got := listed(t, ll, "locks", "name"); !slices.Equal(got, names) {
		t.Fatalf("lock list: %d locks, want %d", len(got), len(names))
	}
	first = ll["locks"].([]any)[0].(map[string]any)
	hasKeys(t, first, map[string]string{"name": "string", "kind": "string", "holders": "array", "waiters": "number", "delay_ms": "number"})
	if h := first["holders"].([]any); len(h) != 1 || h[0].(map[string]any)["mode"] != "exclusive" || first["kind"] != "mutex" {
		t.Fatalf("first lock %v", first)
	}
	// --limit and --after page through the list; "next" says where to go on.
	page := runJSON(t, addr, 0, "lock", "list", "--limit", "10")
	if got := listed(t, page, "locks", "name"); !slices.Equal(got, names[:10]) || page["next"] != names[9] {
		t.Fatalf("lock list --limit 10: %d locks, next %.20v", len(got), page["next"])
	}
	page = runJSON(t, addr, 0, "lock", "list", "--limit", "5", "--after", names[9])
	if got := listed(t, page, "locks", "name"); !slices.Equal(got, names[10:15]) {
		t.Fatalf("lock list --after: %d locks", len(got))
	}
	page = runJSON(t, addr, 0, "lock", "list", "--limit", "5000", "--after", names[9])
	if got := listed(t, page, "locks", "name"); !slices.Equal(got, names[10:]) || page["next"] != nil {
		t.Fatalf("lock list to the end: %d locks, next %.20v", len(got), page["next"])
	}
	if got := listed(t, runJSON(t, addr, 0, "lock", "list", "--prefix", "s11/"), "locks", "name"); !slices.Equal(got, names[11*400:]) {
		t.Fatalf("lock list --prefix s11/: %d locks", len(got))
	}
	if r := run(t, addr, "lock", "list", "--prefix", "s00/000"); r.code != 0 || !strings.HasPrefix(r.stdout, "1 locks\n  s00/000-") {
		t.Fatalf("lock list text: %+v", r)
	}

	// 80 keys of 60 KiB.
	c := testutil.Dial(t, addr)
	value := strings.Repeat("v", 60<<10)
	var keys []string
	for i := range 80 {
		k := fmt.Sprintf("cfg/%02d", i)
		if _, err := c.Put(ctx, k, []byte(value)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	kv := runJSON(t, addr, 0, "kv", "get", "cfg/", "--prefix")
	if got := listed(t, kv, "kvs", "key"); !slices.Equal(got, keys) || kv["more"] != false {
		t.Fatalf("kv get --prefix: %d keys, more %v", len(got), kv["more"])
	}
	kv = runJSON(t, addr, 0, "kv", "get", "cfg/", "--prefix", "--limit", "50", "--after", "cfg/09")
	if got := listed(t, kv, "kvs", "key"); !slices.Equal(got, keys[10:60]) || kv["more"] != true {
		t.Fatalf("kv get --prefix --limit 50 --after cfg/09: %v, more %v", got, kv["more"])
	}

	// 5 dead letters of 1 MiB.
	q := c.Queue("q")
	var ids []string
	for range 5 {
		e, err := q.Enqueue(ctx, bytes.Repeat([]byte("p"), 1<<20-100), client.WithMaxAttempts(1))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, fmt.Sprint(e.ID))
		d, err := q.Dequeue(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Nack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if got := listed(t, runJSON(t, addr, 0, "queue", "dlq", "list", "q"), "items", "id"); !slices.Equal(got, ids) {
		t.Fatalf("dlq list: %v, want %v", got, ids)
	}
	if got := listed(t, runJSON(t, addr, 0, "queue", "dlq", "list", "q", "--limit", "2", "--after", ids[0]), "items", "id"); !slices.Equal(got, ids[1:3]) {
		t.Fatalf("dlq list --limit 2 --after %s: %v", ids[0], got)
	}
}
