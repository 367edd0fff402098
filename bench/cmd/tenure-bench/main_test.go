package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/cli"
	"github.com/tenure-io/tenure/internal/testutil"
)

type result struct {
	code           int
	stdout, stderr string
}

// runBench runs tenure-bench against addr.
func runBench(t *testing.T, addr string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, append([]string{"--endpoint", addr}, args...), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// runJSON runs a command with -o json, checks that it succeeded and
// decodes the single JSON object it printed.
func runJSON(t *testing.T, addr string, args ...string) map[string]any {
	t.Helper()
	r := runBench(t, addr, append(args, "-o", "json")...)
	if r.code != cli.ExitOK {
		t.Fatalf("%v: exit %d (stderr %q)", args, r.code, r.stderr)
	}
	return decodeOne(t, r.stdout)
}

func decodeOne(t *testing.T, s string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("stdout %q is not a JSON object: %v", s, err)
	}
	if dec.More() {
		t.Fatalf("stdout %q holds more than one JSON value", s)
	}
	return m
}

// hasKeys checks that m has each key with a value of the given JSON kind.
func hasKeys(t *testing.T, m map[string]any, want map[string]string) {
	t.Helper()
	for k, kind := range want {
		v, ok := m[k]
		if !ok {
			t.Errorf("missing key %q in %v", k, m)
			continue
		}
		var got string
		switch v.(type) {
		case string:
			got = "string"
		case float64:
			got = "number"
		case bool:
			got = "bool"
		case nil:
			got = "null"
		default:
			got = "other"
		}
		if got != kind {
			t.Errorf("key %q is %s (%v), want %s", k, got, v, kind)
		}
	}
}

func num(t *testing.T, m map[string]any, k string) float64 {
	t.Helper()
	f, ok := m[k].(float64)
	if !ok {
		t.Fatalf("key %q is %T (%v), want a number", k, m[k], m[k])
	}
	return f
}

// TestUsageErrors: a bad flag value is refused before anything is dialled,
// with one line on stderr, nothing on stdout and exit 1.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad bench mode", []string{"--mode", "x"}, `unknown --mode "x"`},
		{"bad conns", []string{"--conns", "x"}, `unknown --conns "x"`},
		{"bad output", []string{"-o", "yaml"}, `unknown output format "yaml"`},
		{"unknown flag", []string{"--bogus"}, "unknown flag: --bogus"},
		{"queue batch", []string{"queue", "--batch", "1001"}, "--batch 1001 is outside 1..1000"},
		{"queue producers", []string{"queue", "--producers", "0"}, "--producers and --consumers must be at least 1"},
		{"kv op", []string{"kv", "--op", "x"}, `--op must be put, get or txn, not "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runBench(t, "127.0.0.1:1", tc.args...)
			if r.code != cli.ExitError {
				t.Fatalf("exit %d, want 1", r.code)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "tenure-bench: ") || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("stderr %q, want one line 'tenure-bench: ...%s...'", r.stderr, tc.want)
			}
		})
	}
}

// TestUnreachableServer: with -o json a failure is one error object on
// stdout, with the tenure command line's codes.
func TestUnreachableServer(t *testing.T) {
	r := runBench(t, "127.0.0.1:1", "queue", "--duration", "100ms", "-o", "json")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "cannot reach 127.0.0.1:1") {
		t.Fatalf("got %+v", r)
	}
	if e, _ := decodeOne(t, r.stdout)["error"].(map[string]any); e["code"] != "unavailable" {
		t.Fatalf("stdout %q, want an unavailable error", r.stdout)
	}
}

func TestBench(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	for _, mode := range []string{"uncontended", "contended"} {
		t.Run(mode, func(t *testing.T) {
			m := runJSON(t, srv.Addr(), "--mode", mode, "--clients", "3", "--duration", "400ms", "--ttl", "5s")
			hasKeys(t, m, map[string]string{
				"mode": "string", "clients": "number", "ops_per_sec": "number", "handoffs_per_sec": "number",
				"p50_ms": "number", "p99_ms": "number", "errors": "number",
				"fairness_max_over_min": "number", "grants_per_client_min": "number", "grants_per_client_max": "number",
			})
			if m["mode"] != mode || num(t, m, "clients") != 3 || num(t, m, "errors") != 0 || m["ops_per_sec"].(float64) <= 0 {
				t.Fatalf("bench %v", m)
			}
			if m["p99_ms"].(float64) < m["p50_ms"].(float64) || num(t, m, "grants_per_client_min") == 0 {
				t.Fatalf("bench %v", m)
			}
			handoffs := m["handoffs_per_sec"].(float64)
			if mode == "uncontended" && handoffs != 0 || mode == "contended" && handoffs <= 0 {
				t.Fatalf("handoffs_per_sec %v in %s mode", handoffs, mode)
			}
		})
	}
	// Sessions are closed when the run ends.
	c, err := client.Dial(t.Context(), srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, "bench sessions to close", 5*time.Second, func() bool {
		resp, err := c.Sessions(t.Context())
		return err == nil && len(resp.GetSessions()) == 0
	})
}

// TestQueueBench: with single items and with batches, the queue is filled
// to --stored before the window, items are acked during it, and nothing
// fails.
func TestQueueBench(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	for _, batch := range []string{"1", "10"} {
		t.Run("batch "+batch, func(t *testing.T) {
			m := runJSON(t, srv.Addr(), "queue", "--producers", "2", "--consumers", "2", "--stored", "50", "--payload", "8", "--batch", batch, "--duration", "400ms")
			hasKeys(t, m, map[string]string{
				"queue": "string", "producers": "number", "consumers": "number", "batch": "number", "payload_bytes": "number",
				"stored_before": "number", "stored_after": "number", "prefill_s": "number", "prefill_per_sec": "number",
				"duration_s": "number", "enqueued": "number", "acked": "number", "enqueues_per_sec": "number", "items_per_sec": "number",
				"enqueue_p50_ms": "number", "enqueue_p99_ms": "number", "enqueue_max_ms": "number",
				"dequeue_p50_ms": "number", "dequeue_p99_ms": "number", "dequeue_max_ms": "number",
				"ack_p50_ms": "number", "ack_p99_ms": "number", "ack_max_ms": "number", "errors": "number",
			})
			if num(t, m, "stored_before") != 50 || num(t, m, "batch") != mustFloat(t, batch) {
				t.Fatalf("queue bench %v", m)
			}
			if num(t, m, "acked") <= 0 || num(t, m, "enqueued") <= 0 || num(t, m, "errors") != 0 || num(t, m, "items_per_sec") <= 0 {
				t.Fatalf("queue bench %v", m)
			}
			if num(t, m, "ack_p99_ms") < num(t, m, "ack_p50_ms") || num(t, m, "ack_max_ms") < num(t, m, "ack_p99_ms") {
				t.Fatalf("queue bench latencies out of order: %v", m)
			}
		})
	}
}

func mustFloat(t *testing.T, s string) float64 {
	t.Helper()
	var f float64
	if err := json.Unmarshal([]byte(s), &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestKVBench: each operation runs without errors and reports the fields
// bench/etcd's etcd-kv-bench prints.
func TestKVBench(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	for _, op := range []string{"put", "get", "txn"} {
		t.Run(op, func(t *testing.T) {
			m := runJSON(t, srv.Addr(), "kv", "--op", op, "--clients", "2", "--duration", "300ms")
			hasKeys(t, m, map[string]string{
				"system": "string", "op": "string", "clients": "number", "ops": "number", "ops_per_sec": "number",
				"p50_ms": "number", "p99_ms": "number", "errors": "number",
			})
			if m["system"] != "tenure" || m["op"] != op || num(t, m, "clients") != 2 || num(t, m, "ops") <= 0 || num(t, m, "errors") != 0 {
				t.Fatalf("kv bench %v", m)
			}
		})
	}
}
