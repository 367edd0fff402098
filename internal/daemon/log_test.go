package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// logBuffer collects JSON log lines; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// find returns the first record with message msg, or nil.
func (l *logBuffer) find(t *testing.T, msg string) map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(l.b.String(), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		if m["msg"] == msg {
			return m
		}
	}
	return nil
}

// TestLogRecords: leadership, a session's expiry with what it held, the
// lock-delay it started and a refusal for a limit are logged, as
// structured records.
func TestLogRecords(t *testing.T) {
	var logs logBuffer
	clk := clock.NewFake()
	srv := testutil.StartConfig(t, daemon.Config{Clock: clk, Logger: slog.New(slog.NewJSONHandler(&logs, nil)), ClusterLimits: fsm.Limits{MaxSessions: 1}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	s := testutil.Session(t, ctx, c, client.WithOwner("worker"), client.WithTTL(time.Second))
	m, _ := s.Mutex("job", client.WithLockDelay(time.Second))
	if _, err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewSession(ctx, client.WithOwner("second")); err == nil {
		t.Fatal("a session past max-sessions was created")
	}
	deadline := time.Now().Add(20 * time.Second)
	for logs.find(t, "lock-delay started") == nil {
		if time.Now().After(deadline) {
			t.Fatal("no expiry logged")
		}
		testutil.Elapse(t, clk, 2*time.Second)
	}
	for msg, want := range map[string]map[string]any{
		"leader changed":     {"level": "INFO", "leader": "n1", "self": true},
		"session expired":    {"level": "INFO", "owner": "worker", "held": []any{"job"}, "held_count": 1.0},
		"lock-delay started": {"level": "INFO", "lock": "job", "delay_ms": 1000.0, "owner": "worker"},
		"request refused":    {"level": "WARN", "code": "ResourceExhausted"},
	} {
		rec := logs.find(t, msg)
		if rec == nil {
			t.Errorf("no %q record", msg)
			continue
		}
		for k, v := range want {
			if got, _ := json.Marshal(rec[k]); string(got) != mustJSON(v) {
				t.Errorf("%q: %s = %s, want %s", msg, k, got, mustJSON(v))
			}
		}
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
