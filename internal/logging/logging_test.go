package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// records decodes JSON lines.
func records(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		out = append(out, m)
	}
	return out
}

// TestRaftThroughSlog: raft's hclog goes through the slog logger with its
// level, name and arguments; below warn only when debug is on.
func TestRaftThroughSlog(t *testing.T) {
	var b bytes.Buffer
	l, err := New(&b, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	h := Raft(l).Named("transport").With("peer", "n2")
	h.Info("entering candidate state")
	h.Warn("failed to contact", "server-id", "n3")
	h.Error("failed to append")
	if h.IsInfo() || !h.IsWarn() {
		t.Fatal("raft's info logged at --log-level info")
	}
	recs := records(t, &b)
	if len(recs) != 2 {
		t.Fatalf("records %v", recs)
	}
	want := map[string]any{"level": "WARN", "msg": "failed to contact", "component": "raft", "name": "transport", "peer": "n2", "server-id": "n3"}
	for k, v := range want {
		if recs[0][k] != v {
			t.Errorf("%s = %v, want %v (%v)", k, recs[0][k], v, recs[0])
		}
	}
	if recs[1]["level"] != "ERROR" {
		t.Errorf("error record %v", recs[1])
	}

	b.Reset()
	l, _ = New(&b, "text", "debug")
	h = Raft(l)
	h.Info("entering follower state")
	h.Trace("too fine") // below slog's debug
	if out := b.String(); !strings.Contains(out, "level=INFO msg=\"entering follower state\" component=raft") || strings.Contains(out, "too fine") {
		t.Fatalf("debug text log %q", out)
	}
	h.SetLevel(hclog.Error)
	if h.IsWarn() {
		t.Fatal("SetLevel ignored")
	}
}

// TestNewAndWriter: bad formats and levels are refused; a line writer
// logs one record per line.
func TestNewAndWriter(t *testing.T) {
	if _, err := New(&bytes.Buffer{}, "xml", "info"); err == nil {
		t.Fatal("format xml accepted")
	}
	if _, err := New(&bytes.Buffer{}, "text", "loud"); err == nil {
		t.Fatal("level loud accepted")
	}
	var b bytes.Buffer
	l, _ := New(&b, "json", "warn")
	l.Info("hidden")
	if _, err := Writer(l, 8).Write([]byte("tenure: writing the record: disk full\nsecond\n")); err != nil {
		t.Fatal(err)
	}
	recs := records(t, &b)
	if len(recs) != 2 || recs[0]["msg"] != "writing the record: disk full" || recs[0]["level"] != "ERROR" || recs[1]["msg"] != "second" {
		t.Fatalf("records %v", recs)
	}
}
