package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

// TestQueueCommandsJSON checks the queue commands' JSON contract and exit
// codes: push (and its duplicate), pop, ack (and stale, and a missing or
// wrong receipt), nack, len, the dead letters, purge, delete, and pop's
// timeout.
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
	hasKeys(t, pop, map[string]string{"id": "number", "payload": "string", "delivery_token": "number", "attempt": "number", "receipt": "string"})
	if pop["payload"] != "hello" || num(t, pop, "attempt") != 1 || num(t, pop, "id") != num(t, push, "id") || len(pop["receipt"].(string)) != 32 {
		t.Fatalf("pop: %v", pop)
	}
	id, tok, rcpt := fmt.Sprint(num(t, pop, "id")), fmt.Sprint(num(t, pop, "delivery_token")), pop["receipt"].(string)
	ql := runJSON(t, addr, 0, "queue", "len", "q")
	hasKeys(t, ql, map[string]string{"queued": "number", "in_flight": "number", "dead": "number", "oldest_age_ms": "number"})
	if num(t, ql, "queued") != 0 || num(t, ql, "in_flight") != 1 || num(t, ql, "dead") != 0 {
		t.Fatalf("len: %v", ql)
	}
	if r := runJSON(t, addr, 3, "queue", "ack", "q", id, "--delivery-token", fmt.Sprint(num(t, pop, "delivery_token")+1), "--receipt", rcpt); r["result"] != "stale" {
		t.Fatalf("ack with a wrong token: %v", r)
	}
	// Another process with the right id and token but not the receipt.
	wrong := "00" + rcpt[2:]
	if rcpt[:2] == "00" {
		wrong = "01" + rcpt[2:]
	}
	for _, what := range []string{"ack", "nack", "extend"} {
		r := run(t, addr, "queue", what, "q", id, "--delivery-token", tok, "--receipt", wrong, "-o", "json")
		if r.code != ExitError || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "tenure: permission denied: "+what+" of item "+id) {
			t.Fatalf("%s with a wrong receipt: %+v", what, r)
		}
		if e, _ := decodeOne(t, r.stdout)["error"].(map[string]any); e["code"] != "permission_denied" {
			t.Fatalf("%s with a wrong receipt: stdout %q", what, r.stdout)
		}
		if r := run(t, addr, "queue", what, "q", id, "--delivery-token", tok); r.code != ExitError || r.stderr != "tenure: --receipt is required (the receipt pop printed)\n" {
			t.Fatalf("%s without a receipt: %+v", what, r)
		}
	}
	if r := run(t, addr, "queue", "ack", "q", id, "--delivery-token", tok, "--receipt", "xyz"); r.code != ExitError || !strings.Contains(r.stderr, "is not hexadecimal") {
		t.Fatalf("ack with a receipt that is not hex: %+v", r)
	}
	if ql := runJSON(t, addr, 0, "queue", "len", "q"); num(t, ql, "in_flight") != 1 {
		t.Fatalf("len after the refused attempts: %v", ql)
	}
	if r := runJSON(t, addr, 0, "queue", "extend", "q", id, "--delivery-token", tok, "--receipt", rcpt, "--visibility", "2m"); r["result"] != "extended" {
		t.Fatalf("extend: %v", r)
	}
	// One attempt: the nacked item goes to the dead letters.
	if r := runJSON(t, addr, 0, "queue", "nack", "q", id, "--delivery-token", tok, "--receipt", rcpt); r["result"] != "nacked" {
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
	if r := runJSON(t, addr, 0, "queue", "ack", "q", fmt.Sprint(num(t, pop, "id")), "--delivery-token", fmt.Sprint(num(t, pop, "delivery_token")), "--receipt", pop["receipt"].(string)); r["result"] != "acked" {
		t.Fatalf("ack: %v", r)
	}
	r := run(t, addr, "queue", "pop", "q", "--timeout", "200ms", "-o", "json")
	if r.code != ExitTimeout || !strings.HasPrefix(r.stderr, "tenure: nothing arrived on queue q within 200ms") {
		t.Fatalf("pop of an empty queue: %+v", r)
	}
	if e, _ := decodeOne(t, r.stdout)["error"].(map[string]any); e["code"] != "timeout" {
		t.Fatalf("pop of an empty queue: stdout %q", r.stdout)
	}
	r = run(t, addr, "queue", "ack", "q", "1")
	if r.code != ExitError || !strings.Contains(r.stderr, "--delivery-token is required") {
		t.Fatalf("ack without a token: %+v", r)
	}

	runJSON(t, addr, 0, "queue", "push", "q", "a")
	runJSON(t, addr, 0, "queue", "push", "q", "b", "--op-id", "b")
	runJSON(t, addr, 0, "queue", "pop", "q")
	purged := runJSON(t, addr, 0, "queue", "purge", "q")
	hasKeys(t, purged, map[string]string{"purged": "number"})
	if num(t, purged, "purged") != 2 {
		t.Fatalf("purge: %v", purged)
	}
	if dup := runJSON(t, addr, 0, "queue", "push", "q", "b", "--op-id", "b"); dup["result"] != "duplicate" {
		t.Fatalf("push retried after the purge: %v", dup)
	}
	del := runJSON(t, addr, 0, "queue", "delete", "q")
	hasKeys(t, del, map[string]string{"deleted": "bool", "items": "number"})
	if del["deleted"] != true || num(t, del, "items") != 0 {
		t.Fatalf("delete: %v", del)
	}
	if del := runJSON(t, addr, 0, "queue", "delete", "q"); del["deleted"] != false {
		t.Fatalf("delete of a deleted queue: %v", del)
	}
	if again := runJSON(t, addr, 0, "queue", "push", "q", "b", "--op-id", "b"); again["result"] != "enqueued" {
		t.Fatalf("push after the delete: %v", again)
	}
}

func TestQueueVisibilityValidated(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	for _, args := range [][]string{
		{"queue", "pop", "q", "--visibility", "0s"},
		{"queue", "pop", "q", "--visibility", "13h"},
		{"queue", "extend", "q", "1", "--delivery-token", "2", "--receipt", "00", "--visibility", "0s"},
	} {
		r := run(t, srv.Addr(), args...)
		if r.code != ExitError || !strings.Contains(r.stderr, "--visibility") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 naming --visibility", args, r.code, r.stderr)
		}
	}
}

// TestQueueSettleFromPopJSON settles deliveries from pop's JSON on stdin,
// as `tenure queue pop Q -o json | tenure queue ack Q -` does: id, token
// and receipt all come from it.
func TestQueueSettleFromPopJSON(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()
	stdin := func(in string, args ...string) result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out, errb syncBuffer
		code := Run(ctx, append([]string{"--endpoint", addr}, args...), Streams{In: strings.NewReader(in), Out: &out, Err: &errb})
		return result{code: code, stdout: out.String(), stderr: errb.String()}
	}
	for _, what := range []string{"extend", "nack", "ack"} {
		runJSON(t, addr, 0, "queue", "push", "q", "item-"+what)
		pop := run(t, addr, "queue", "pop", "q", "--visibility", "1m", "-o", "json")
		if pop.code != 0 {
			t.Fatalf("pop: %+v", pop)
		}
		r := stdin(pop.stdout, "queue", what, "q", "-", "-o", "json")
		want := map[string]string{"extend": "extended", "nack": "nacked", "ack": "acked"}[what]
		if r.code != 0 || decodeOne(t, r.stdout)["result"] != want {
			t.Fatalf("%s from stdin: %+v", what, r)
		}
		if what == "ack" {
			if ql := runJSON(t, addr, 0, "queue", "len", "q"); num(t, ql, "in_flight") != 0 {
				t.Fatalf("after ack: %v", ql)
			}
		}
		if what == "nack" || what == "extend" {
			// Drain what was given back or extended, so the next round pops its own item.
			if what == "extend" {
				if r := stdin(pop.stdout, "queue", "ack", "q", "-"); r.code != 0 {
					t.Fatalf("ack after extend: %+v", r)
				}
			} else {
				again := run(t, addr, "queue", "pop", "q", "-o", "json")
				if r := stdin(again.stdout, "queue", "ack", "q", "-"); r.code != 0 {
					t.Fatalf("ack after nack: %+v", r)
				}
			}
		}
	}
	if r := stdin("not json", "queue", "ack", "q", "-"); r.code != ExitError || !strings.HasPrefix(r.stderr, "tenure: stdin is not the JSON pop -o json prints") {
		t.Fatalf("garbage on stdin: %+v", r)
	}
	if r := stdin(`{"id":1,"delivery_token":2,"receipt":"00"}`, "queue", "ack", "q", "-", "--receipt", "00"); r.code != ExitError || !strings.Contains(r.stderr, "come from stdin") {
		t.Fatalf("stdin and flags mixed: %+v", r)
	}
}
