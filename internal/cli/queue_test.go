package cli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/testutil"
)

// TestQueueCommandsJSON checks the queue commands' JSON contract and exit
// codes: push (and its duplicate), pop, ack (and stale), nack, len, the
// dead letters, and pop's timeout.
func TestQueueCommandsJSON(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()
	push := runJSON(t, addr, 0, "queue", "push", "q", "hello", "--op-id", "a", "--max-attempts", "1")
	hasKeys(t, push, map[string]string{"id": "number", "result": "string"})
	if push["result"] != "enqueued" {
		t.Fatalf("push: %v", push)
	}
	if dup := runJSON(t, addr, 0, "queue", "push", "q", "other", "--op-id", "a"); dup["result"] != "duplicate" || num(t, dup, "id") != num(t, push, "id") {
		t.Fatalf("retried push: %v", dup)
	}
	pop := runJSON(t, addr, 0, "queue", "pop", "q", "--visibility", "1m")
	hasKeys(t, pop, map[string]string{"id": "number", "payload": "string", "delivery_token": "number", "attempt": "number"})
	if pop["payload"] != "hello" || num(t, pop, "attempt") != 1 || num(t, pop, "id") != num(t, push, "id") {
		t.Fatalf("pop: %v", pop)
	}
	id, tok := fmt.Sprint(num(t, pop, "id")), fmt.Sprint(num(t, pop, "delivery_token"))
	ql := runJSON(t, addr, 0, "queue", "len", "q")
	hasKeys(t, ql, map[string]string{"queued": "number", "in_flight": "number", "dead": "number", "oldest_age_ms": "number"})
	if num(t, ql, "queued") != 0 || num(t, ql, "in_flight") != 1 || num(t, ql, "dead") != 0 {
		t.Fatalf("len: %v", ql)
	}
	if r := runJSON(t, addr, 3, "queue", "ack", "q", id, "--delivery-token", fmt.Sprint(num(t, pop, "delivery_token")+1)); r["result"] != "stale" {
		t.Fatalf("ack with a wrong token: %v", r)
	}
	// One attempt: the nacked item goes to the dead letters.
	if r := runJSON(t, addr, 0, "queue", "nack", "q", id, "--delivery-token", tok); r["result"] != "nacked" {
		t.Fatalf("nack: %v", r)
	}
	dl := runJSON(t, addr, 0, "queue", "dlq", "list", "q")
	items, _ := dl["items"].([]any)
	if len(items) != 1 || items[0].(map[string]any)["payload"] != "hello" {
		t.Fatalf("dlq list: %v", dl)
	}
	if r := runJSON(t, addr, 0, "queue", "dlq", "requeue", "q"); num(t, r, "requeued") != 1 {
		t.Fatalf("dlq requeue: %v", r)
	}
	pop = runJSON(t, addr, 0, "queue", "pop", "q")
	if r := runJSON(t, addr, 0, "queue", "ack", "q", fmt.Sprint(num(t, pop, "id")), "--delivery-token", fmt.Sprint(num(t, pop, "delivery_token"))); r["result"] != "acked" {
		t.Fatalf("ack: %v", r)
	}
	r := run(t, addr, "queue", "pop", "q", "--timeout", "200ms", "-o", "json")
	if r.code != ExitTimeout || r.stdout != "" || !strings.HasPrefix(r.stderr, "tenure: nothing arrived on queue q within 200ms") {
		t.Fatalf("pop of an empty queue: %+v", r)
	}
	r = run(t, addr, "queue", "ack", "q", "1")
	if r.code != ExitError || !strings.Contains(r.stderr, "--delivery-token is required") {
		t.Fatalf("ack without a token: %+v", r)
	}
}
