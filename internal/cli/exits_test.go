package cli

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestUnknownCommandExits2: a command or subcommand that does not exist is
// an error (exit 2, "unknown command"), never the parent's help and exit
// 0, which a script with a typo would take for success.
func TestUnknownCommandExits2(t *testing.T) {
	for _, args := range [][]string{
		{"member", "frobnicate"},
		{"member", "frobnicate", "n3"},
		{"kv", "frobnicate"},
		{"frobnicate"},
		{"cluster", "keys", "frobnicate"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			r := run(t, "127.0.0.1:1", args...)
			if r.code != ExitUsage {
				t.Fatalf("exit %d, want %d (stdout %q, stderr %q)", r.code, ExitUsage, r.stdout, r.stderr)
			}
			if r.stdout != "" || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "tenure: unknown command") || !strings.Contains(r.stderr, `"frobnicate"`) {
				t.Fatalf("stdout %q, stderr %q: want one line 'tenure: unknown command \"frobnicate\" ...'", r.stdout, r.stderr)
			}
		})
	}
	// With -o json, the error object too.
	r := run(t, "127.0.0.1:1", "member", "frobnicate", "-o", "json")
	if r.code != ExitUsage || decodeOne(t, r.stdout)["error"].(map[string]any)["code"] != "invalid_argument" {
		t.Fatalf("exit %d, stdout %q", r.code, r.stdout)
	}
	// A parent command alone still shows its help.
	if r := run(t, "127.0.0.1:1", "member"); r.code != ExitOK || !strings.Contains(r.stdout, "Available Commands") {
		t.Fatalf("tenure member: exit %d, stdout %q", r.code, r.stdout)
	}
}

// TestEndpointWithoutPortRefused: --endpoint HOST (no port) is refused
// with one line, rather than dialled on port 443.
func TestEndpointWithoutPortRefused(t *testing.T) {
	for _, ep := range []string{"localhost", "127.0.0.1:7070,127.0.0.1", "[::1]"} {
		r := run(t, ep, "status")
		if r.code != ExitError || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "has no port") {
			t.Fatalf("--endpoint %s: exit %d, stderr %q", ep, r.code, r.stderr)
		}
	}
}

// startLeaderless starts a node that waits to be added to a cluster: it
// answers every request, but never leads nor knows a leader.
func startLeaderless(t *testing.T) string {
	t.Helper()
	d, err := daemon.Start(daemon.Config{NodeID: "n1", DataDir: t.TempDir(), Listen: "127.0.0.1:0", PeerListen: testutil.FreeAddr(t, 20000, 30000), Join: true, LogOutput: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return d.Addr()
}

// TestLockWithoutLeader: a lock that cannot be had because no node leads
// says "no leader" once --timeout has passed, with its own exit code, not
// contention's timeout (5).
func TestLockWithoutLeader(t *testing.T) {
	testutil.Slow(t)
	addr := startLeaderless(t)
	start := time.Now()
	r := run(t, addr, "lock", "x", "--timeout", "1s", "--", "true")
	if r.code != ExitNoLeader || !strings.Contains(r.stderr, "no leader") || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("exit %d, stderr %q; want %d and one line saying no leader", r.code, r.stderr, ExitNoLeader)
	}
	if took := time.Since(start); took < time.Second || took > 10*time.Second {
		t.Fatalf("gave up after %v with --timeout 1s", took)
	}
	if r := run(t, addr, "lock", "x", "--timeout", "1s", "-o", "json", "--", "true"); r.code != ExitNoLeader {
		t.Fatalf("-o json: exit %d", r.code)
	}
}
