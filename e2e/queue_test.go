package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

type queuePushOut struct {
	ID     uint64 `json:"id"`
	Result string `json:"result"`
}

type queuePopOut struct {
	ID            uint64 `json:"id"`
	Payload       string `json:"payload"`
	DeliveryToken uint64 `json:"delivery_token"`
	Attempt       int    `json:"attempt"`
	Receipt       string `json:"receipt"`
}

// settleArgs are the arguments of `tenure queue WHAT jobs ID
// --delivery-token N --receipt HEX` for p.
func settleArgs(what string, p queuePopOut) []string {
	return []string{"queue", what, "jobs", strconv.FormatUint(p.ID, 10), "--delivery-token", strconv.FormatUint(p.DeliveryToken, 10), "--receipt", p.Receipt}
}

type queueLenOut struct {
	Queued   int `json:"queued"`
	InFlight int `json:"in_flight"`
	Dead     int `json:"dead"`
}

type queueSettleOut struct {
	Result string `json:"result"`
}

// TestQueueRedeliveryAfterPauseAndCrash: a consumer that pops an item and
// is then frozen (SIGSTOP) past its visibility lease loses the item to
// another consumer, which gets it with a larger delivery token at its
// original place in the queue; the frozen consumer's late ack, once it
// thaws, is answered stale (exit 3). Another process that knows the item
// id and delivery token but not the receipt cannot settle a delivery
// (exit 1, permission denied). Then the server is killed with
// SIGKILL and restarted: every acknowledged enqueue that was not acked is
// still there (queued or in flight), acked ones never come back, and
// retried enqueues stay duplicates.
func TestQueueRedeliveryAfterPauseAndCrash(t *testing.T) {
	const n = 30
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	addr := freeAddr(t)
	srv := startServer(t, addr, dataDir)

	var ids []uint64
	for i := range n {
		var out queuePushOut
		tenureJSON(t, addr, 0, &out, "queue", "push", "jobs", fmt.Sprint("job-", i), "--op-id", fmt.Sprint("p", i))
		if out.Result != "enqueued" || (len(ids) > 0 && out.ID <= ids[len(ids)-1]) {
			t.Fatalf("push %d: %+v after %v", i, out, ids)
		}
		ids = append(ids, out.ID)
	}

	// A pops the first item with a 2 s lease, then waits for the test to
	// tell it what to ack, and records its ack's answer and exit code.
	script := fmt.Sprintf(`tenure queue pop jobs --visibility 2s -o json > %[1]s/a-pop.tmp && mv %[1]s/a-pop.tmp %[1]s/a-pop.json || exit 9
while [ ! -s %[1]s/a-go ]; do sleep 0.05; done
read ID TOK RCPT < %[1]s/a-go
tenure queue ack jobs "$ID" --delivery-token "$TOK" --receipt "$RCPT" -o json > %[1]s/a-ack.json
echo $? > %[1]s/a-code.tmp && mv %[1]s/a-code.tmp %[1]s/a-code`, dir)
	a := startShell(t, "consumer A", addr, script)
	var popA queuePopOut
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dir, "a-pop.json"), 15*time.Second)), &popA); err != nil {
		t.Fatal(err)
	}
	if popA.ID != ids[0] || popA.Payload != "job-0" || popA.Attempt != 1 {
		t.Fatalf("A popped %+v, want item %d", popA, ids[0])
	}
	a.signal(syscall.SIGSTOP)
	frozen := time.Now()
	if err := os.WriteFile(filepath.Join(dir, "a-go"), fmt.Appendf(nil, "%d %d %s\n", popA.ID, popA.DeliveryToken, popA.Receipt), 0o644); err != nil {
		t.Fatal(err)
	}

	// While A's lease runs, the item is invisible: others get the next one.
	var next queuePopOut
	tenureJSON(t, addr, 0, &next, "queue", "pop", "jobs", "--timeout", "5s")
	if next.ID != ids[1] {
		t.Fatalf("pop during A's lease got %+v, want item %d", next, ids[1])
	}
	var settled queueSettleOut
	// A stranger with the id and token guesses the receipt: refused.
	stranger := next
	stranger.Receipt = "00112233445566778899aabbccddeeff"
	for _, what := range []string{"ack", "nack", "extend"} {
		if r := tenure(t, addr, settleArgs(what, stranger)...); r.code != 1 || !strings.HasPrefix(r.stderr, "tenure: permission denied: ") {
			t.Fatalf("%s by a stranger: exit %d, stderr %q; want exit 1, permission denied", what, r.code, r.stderr)
		}
	}
	// The consumer's own nack still finds its delivery current.
	tenureJSON(t, addr, 0, &settled, settleArgs("nack", next)...)
	if settled.Result != "nacked" {
		t.Fatalf("nack: %+v", settled)
	}

	// After the lease, B gets A's item back at its original place.
	var ql queueLenOut
	testutil.WaitFor(t, "A's lease to run out", 15*time.Second, func() bool {
		tenureJSON(t, addr, 0, &ql, "queue", "len", "jobs")
		return ql.InFlight == 0
	})
	t.Logf("A's item came back %v after A froze", time.Since(frozen).Round(time.Millisecond))
	var popB queuePopOut
	tenureJSON(t, addr, 0, &popB, "queue", "pop", "jobs", "--visibility", "30s", "--timeout", "5s")
	if popB.ID != popA.ID || popB.DeliveryToken <= popA.DeliveryToken || popB.Attempt != 2 {
		t.Fatalf("B popped %+v after A's %+v", popB, popA)
	}
	tenureJSON(t, addr, 0, &settled, settleArgs("ack", popB)...)
	if settled.Result != "acked" {
		t.Fatalf("B's ack: %+v", settled)
	}

	// A thaws: its ack with the old delivery token is stale, exit 3.
	a.signal(syscall.SIGCONT)
	if code := a.wait(15 * time.Second); code != 0 {
		t.Fatalf("consumer A exited %d: %s", code, a.stderr())
	}
	if code := readFile(t, filepath.Join(dir, "a-code"), time.Second); code != "3" {
		t.Fatalf("A's late ack exited %s, want 3", code)
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dir, "a-ack.json"), time.Second)), &settled); err != nil || settled.Result != "stale" {
		t.Fatalf("A's late ack answered %+v (%v), want stale", settled, err)
	}

	// Consume and ack a few more, and leave a few in flight.
	acked := map[uint64]bool{popB.ID: true}
	for range 5 {
		var p queuePopOut
		tenureJSON(t, addr, 0, &p, "queue", "pop", "jobs", "--timeout", "5s")
		tenureJSON(t, addr, 0, &settled, settleArgs("ack", p)...)
		acked[p.ID] = true
	}
	var inFlight []queuePopOut
	for range 3 {
		var p queuePopOut
		tenureJSON(t, addr, 0, &p, "queue", "pop", "jobs", "--visibility", "1m", "--timeout", "5s")
		inFlight = append(inFlight, p)
	}

	// Crash the server and restart it on the same data.
	srv.signal(syscall.SIGKILL)
	srv.wait(10 * time.Second)
	srv = startServer(t, addr, dataDir)
	tenureJSON(t, addr, 0, &ql, "queue", "len", "jobs")
	if want := n - len(acked); ql.Queued+ql.InFlight != want || ql.InFlight != len(inFlight) || ql.Dead != 0 {
		t.Fatalf("after the restart: %+v, want %d stored of which %d in flight", ql, want, len(inFlight))
	}
	var dup queuePushOut
	tenureJSON(t, addr, 0, &dup, "queue", "push", "jobs", "job-3 again", "--op-id", "p3")
	if dup.Result != "duplicate" || dup.ID != ids[3] {
		t.Fatalf("retried push after the restart: %+v, want duplicate of %d", dup, ids[3])
	}
	// The deliveries in flight survived with their tokens: nack them.
	for _, p := range inFlight {
		tenureJSON(t, addr, 0, &settled, settleArgs("nack", p)...)
		if settled.Result != "nacked" {
			t.Fatalf("nack of %+v after the restart: %+v", p, settled)
		}
	}

	// Drain: exactly the unacked items, in enqueue order.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dial(t, ctx, addr)
	q := c.Queue("jobs")
	var got, want []uint64
	for _, id := range ids {
		if !acked[id] {
			want = append(want, id)
		}
	}
	for {
		d, err := q.TryDequeue(ctx, time.Minute)
		if errors.Is(err, client.ErrQueueEmpty) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
		got = append(got, d.ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("drained %v, want %v", got, want)
	}
}

// startShell runs script with sh in a process group of its own, with
// tenure on its PATH; like start, it is stopped when the test ends.
func startShell(t *testing.T, name, endpoint, script string) *proc {
	t.Helper()
	return startExec(t, name, endpoint, exec.Command("sh", "-c", script))
}

// TestQueueNoAcknowledgedEnqueueLostOnKill9: producers enqueue as fast as
// they can while the server is killed with SIGKILL; after a restart every
// enqueue that was answered is still in the queue, exactly once, in the
// order of its ids (enqueues whose answer was lost may or may not be).
func TestQueueNoAcknowledgedEnqueueLostOnKill9(t *testing.T) {
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	addr := freeAddr(t)
	srv := startServer(t, addr, dataDir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dial(t, ctx, addr)
	q := c.Queue("crash")

	const producers = 8
	acked := make(chan uint64, 100_000)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := 0; ; i++ {
				e, err := q.Enqueue(ctx, fmt.Appendf(nil, "%d-%d", p, i), client.WithOperationID(fmt.Sprintf("%d-%d", p, i)))
				if err != nil {
					return // the server is gone
				}
				acked <- e.ID
			}
		})
	}
	testutil.WaitFor(t, "300 acknowledged enqueues", 20*time.Second, func() bool { return len(acked) >= 300 })
	srv.signal(syscall.SIGKILL)
	srv.wait(10 * time.Second)
	wg.Wait()
	close(acked)
	want := make(map[uint64]bool)
	for id := range acked {
		want[id] = true
	}

	startServer(t, addr, dataDir)
	// A new client: the old one's connection is in its reconnect backoff.
	c2 := dial(t, ctx, addr)
	q = c2.Queue("crash")
	st, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	seen := make(map[uint64]bool)
	for {
		d, err := q.TryDequeue(ctx, time.Minute)
		if errors.Is(err, client.ErrQueueEmpty) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if d.ID <= last || seen[d.ID] {
			t.Fatalf("item %d delivered after %d", d.ID, last)
		}
		last = d.ID
		seen[d.ID] = true
		if err := q.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for id := range want {
		if !seen[id] {
			t.Fatalf("acknowledged enqueue %d lost across kill -9 (%d acknowledged, %d found, stats %+v)", id, len(want), len(seen), st)
		}
	}
	t.Logf("%d enqueues acknowledged before the kill, %d items after the restart", len(want), len(seen))
}
