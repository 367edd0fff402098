package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/testutil"
)

// decodeLines decodes stdout holding one JSON object per line.
func decodeLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q of stdout %q is not a JSON object: %v", line, s, err)
		}
		out = append(out, m)
	}
	return out
}

// TestQueueBatchCommandsJSON checks the batch forms' JSON contract and
// exit codes: push --batch-file (one object per item, operation ids per
// line), pop --max (one object per item), and ack|nack - of several
// deliveries read from pop's output ({"id","result"} per delivery; exit 3
// when one is stale, 1 when one is refused).
func TestQueueBatchCommandsJSON(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()
	file := filepath.Join(t.TempDir(), "items")
	if err := os.WriteFile(file, []byte("one\ntwo\n\nfour"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, addr, "queue", "push", "q", "--batch-file", file, "--op-id", "load", "-o", "json")
	if r.code != 0 {
		t.Fatalf("push --batch-file: %+v", r)
	}
	pushed := decodeLines(t, r.stdout)
	if len(pushed) != 4 {
		t.Fatalf("push --batch-file of 4 lines printed %d objects: %q", len(pushed), r.stdout)
	}
	for i, p := range pushed {
		hasKeys(t, p, map[string]string{"id": "number", "result": "string"})
		if p["result"] != "enqueued" || (i > 0 && num(t, p, "id") != num(t, pushed[i-1], "id")+1) {
			t.Fatalf("pushed item %d: %v", i, p)
		}
	}
	// Repeated, every line is a duplicate of its first push (ids LOAD/N).
	again := decodeLines(t, run(t, addr, "queue", "push", "q", "--batch-file", file, "--op-id", "load", "-o", "json").stdout)
	for i, p := range again {
		if p["result"] != "duplicate" || num(t, p, "id") != num(t, pushed[i], "id") {
			t.Fatalf("repeated push, item %d: %v (first %v)", i, p, pushed[i])
		}
	}
	// From stdin, with text output.
	if r := runIn(t, addr, "five\nsix\n", "queue", "push", "q", "--batch-file", "-"); r.code != 0 || r.stdout != "enqueued 2 items, 0 duplicates\n" {
		t.Fatalf("push --batch-file -: %+v", r)
	}
	if r := run(t, addr, "queue", "push", "q", "x", "--batch-file", file); r.code != ExitError {
		t.Fatalf("push with a payload and --batch-file: %+v", r)
	}

	r = run(t, addr, "queue", "pop", "q", "--max", "5", "--visibility", "1m", "-o", "json")
	if r.code != 0 {
		t.Fatalf("pop --max 5: %+v", r)
	}
	popped := decodeLines(t, r.stdout)
	want := []string{"one", "two", "", "four", "five"}
	if len(popped) != len(want) {
		t.Fatalf("pop --max 5 printed %d objects: %q", len(popped), r.stdout)
	}
	for i, p := range popped {
		hasKeys(t, p, map[string]string{"id": "number", "payload": "string", "delivery_token": "number", "attempt": "number", "receipt": "string"})
		if p["payload"] != want[i] || (i < 4 && num(t, p, "id") != num(t, pushed[i], "id")) {
			t.Fatalf("popped item %d: %v", i, p)
		}
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")

	// Nack the first two, ack the rest: {"id","result"} per delivery.
	n := runIn(t, addr, strings.Join(lines[:2], "\n"), "queue", "nack", "q", "-", "-o", "json")
	if n.code != 0 {
		t.Fatalf("nack - of 2: %+v", n)
	}
	for i, o := range decodeLines(t, n.stdout) {
		hasKeys(t, o, map[string]string{"id": "number", "result": "string"})
		if o["result"] != "nacked" || num(t, o, "id") != num(t, popped[i], "id") {
			t.Fatalf("nacked %d: %v", i, o)
		}
	}
	a := runIn(t, addr, strings.Join(lines[2:], "\n"), "queue", "ack", "q", "-", "-o", "json")
	if acked := decodeLines(t, a.stdout); a.code != 0 || len(acked) != 3 || acked[0]["result"] != "acked" || acked[2]["result"] != "acked" {
		t.Fatalf("ack - of 3: %+v", a)
	}
	// Again: a repeated ack answers acked; a nacked delivery is stale now.
	a = runIn(t, addr, strings.Join(lines[1:3], "\n"), "queue", "ack", "q", "-", "-o", "json")
	got := decodeLines(t, a.stdout)
	if a.code != ExitStale || got[0]["result"] != "stale" || got[1]["result"] != "acked" || !strings.HasPrefix(a.stderr, "tenure: 1 of 2 delivery tokens stale") || strings.Count(a.stderr, "\n") != 1 {
		t.Fatalf("ack - of a stale and an acked delivery: %+v", a)
	}
	// A wrong receipt among several: "denied" for it, exit 1.
	three := strings.Split(strings.TrimSuffix(run(t, addr, "queue", "pop", "q", "--max", "3", "-o", "json").stdout, "\n"), "\n")
	if len(three) != 3 {
		t.Fatalf("pop --max 3: %q", three)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(three[1]), &p); err != nil {
		t.Fatal(err)
	}
	rcpt := p["receipt"].(string)
	p["receipt"] = strings.Repeat("0", len(rcpt))
	if rcpt == p["receipt"] {
		p["receipt"] = strings.Repeat("1", len(rcpt))
	}
	bad, _ := json.Marshal(p)
	a = runIn(t, addr, three[0]+"\n"+string(bad)+"\n"+three[2], "queue", "nack", "q", "-", "-o", "json")
	got = decodeLines(t, a.stdout)
	if a.code != ExitError || len(got) != 3 || got[0]["result"] != "nacked" || got[1]["result"] != "denied" || got[2]["result"] != "nacked" || !strings.HasPrefix(a.stderr, "tenure: 1 of 3 deliveries refused: permission denied") {
		t.Fatalf("nack - with a wrong receipt among three: %+v", a)
	}
	for _, c := range []struct {
		args []string
		in   string
		says string
	}{
		{[]string{"queue", "pop", "q", "--max", "0"}, "", "--max 0 is outside 1..1000"},
		{[]string{"queue", "pop", "q", "--max", "1001"}, "", "--max 1001 is outside 1..1000"},
		{[]string{"queue", "ack", "q", "-"}, "", "stdin holds no delivery"},
		{[]string{"queue", "ack", "q", "-"}, lines[0] + "\n{", "stdin is not the JSON pop -o json prints"},
	} {
		if r := runIn(t, addr, c.in, c.args...); r.code != ExitError || !strings.Contains(r.stderr, c.says) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: %+v, want exit 1 saying %q", c.args, r, c.says)
		}
	}
}
