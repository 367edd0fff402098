package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

func runIn(t *testing.T, addr, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb syncBuffer
	code := Run(ctx, append([]string{"--endpoint", addr}, args...), Streams{In: strings.NewReader(stdin), Out: &out, Err: &errb})
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func TestKVJSONOutput(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()
	put := runJSON(t, addr, 0, "kv", "put", "cfg/a", "one")
	hasKeys(t, put, map[string]string{"revision": "number"})
	rev := num(t, put, "revision")
	get := runJSON(t, addr, 0, "kv", "get", "cfg/a")
	hasKeys(t, get, map[string]string{"key": "string", "value": "string", "create_revision": "number", "mod_revision": "number", "version": "number", "found": "bool"})
	if get["value"] != "one" || num(t, get, "mod_revision") != rev || num(t, get, "version") != 1 || get["found"] != true {
		t.Fatalf("get: %v", get)
	}
	// A missing key: found false, exit 0.
	if m := runJSON(t, addr, 0, "kv", "get", "cfg/none"); m["found"] != false || m["key"] != "cfg/none" {
		t.Fatalf("missing key: %v", m)
	}
	rng := runJSON(t, addr, 0, "kv", "get", "cfg/", "--prefix")
	hasKeys(t, rng, map[string]string{"kvs": "array", "more": "bool", "revision": "number"})

	// Compare-and-swap: succeeds once, then the else branch reads.
	script := fmt.Sprintf("mod(\"cfg/a\") = %d\nexists(cfg/a)\n\nput cfg/a \"two words\"\nget cfg/a\n\nget --prefix cfg/\n", rev)
	r := runIn(t, addr, script, "kv", "txn", "-o", "json")
	m := decodeOne(t, r.stdout)
	hasKeys(t, m, map[string]string{"succeeded": "bool", "revision": "number", "results": "array"})
	if m["succeeded"] != true || len(m["results"].([]any)) != 2 {
		t.Fatalf("first txn: %v", m)
	}
	r = runIn(t, addr, script, "kv", "txn", "-o", "json")
	if m := decodeOne(t, r.stdout); m["succeeded"] != false || !strings.Contains(r.stdout, `"value":"two words"`) {
		t.Fatalf("second txn: %s", r.stdout)
	}
	del := runJSON(t, addr, 0, "kv", "del", "cfg/", "--prefix")
	if num(t, del, "deleted") != 1 {
		t.Fatalf("del: %v", del)
	}
	// Watch from the first revision prints every change, one object a line.
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"--endpoint", addr, "kv", "watch", "cfg/", "--prefix", "--from-revision", fmt.Sprint(rev), "-o", "json"}, Streams{Out: &out, Err: &out})
	}()
	testutil.WaitFor(t, "three watch lines", 10*time.Second, func() bool { return strings.Count(out.String(), "\n") >= 3 })
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("interrupted watch exited %d: %s", code, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for i, want := range []string{`"type":"put","key":"cfg/a","value":"one"`, `"type":"put","key":"cfg/a","value":"two words"`, `"type":"delete","key":"cfg/a"`} {
		if !strings.Contains(lines[i], want) {
			t.Fatalf("watch line %d: %s, want %s", i, lines[i], want)
		}
		hasKeys(t, decodeOne(t, lines[i]), map[string]string{"type": "string", "key": "string", "revision": "number"})
	}
}

func TestKVTxnScriptErrors(t *testing.T) {
	for _, tc := range []struct{ script, want string }{
		{"bogus(a) = 1\n", "unknown compare target"},
		{"version(a) ~ 1\n", "unknown comparison"},
		{"version(a) = x\n", "compares numbers"},
		{"exists(a) 1\n", "no operand"},
		{"\nfrob a\n", "want put KEY VALUE"},
		{"\n\n\n", "more than three sections"},
		{"value(a) = \"unterminated\n", "bad quoted string"},
	} {
		_, _, _, _, err := parseTxn(strings.NewReader(tc.script))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.script, err, tc.want)
		}
	}
}

// TestValuesFromStdinAndFiles: kv put and fence put read the value from
// stdin ("-") or --file, and a value too large for the service is refused
// with the limits named, not gRPC's own words.
func TestValuesFromStdinAndFiles(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	file := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(file, []byte("from a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb syncBuffer
	if code := Run(ctx, []string{"--endpoint", addr, "kv", "put", "a", "-"}, Streams{In: strings.NewReader("from stdin"), Out: &out, Err: &errb}); code != 0 {
		t.Fatalf("kv put -: exit %d %s", code, errb.String())
	}
	if r := run(t, addr, "kv", "put", "b", "--file", file); r.code != 0 {
		t.Fatalf("kv put --file: %+v", r)
	}
	for key, want := range map[string]string{"a": "from stdin", "b": "from a file"} {
		if m := runJSON(t, addr, 0, "kv", "get", key); m["value"] != want {
			t.Errorf("%s = %v, want %q", key, m["value"], want)
		}
	}
	if r := run(t, addr, "kv", "put", "c", "v", "--file", file); r.code != ExitError || !strings.Contains(r.stderr, "only KEY") {
		t.Errorf("both VALUE and --file: %+v", r)
	}
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, make([]byte, 10<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"kv", "put", "big", "--file", big}, {"fence", "put", "big", "--file", big, "--token", "1"}} {
		r := run(t, addr, args...)
		if r.code != ExitError || strings.Contains(r.stderr, "grpc:") || !strings.Contains(r.stderr, "--max-") {
			t.Errorf("%v: exit %d, stderr %q; want the limit named", args, r.code, r.stderr)
		}
	}
}
