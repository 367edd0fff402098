package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

// TestSessionSecretStaysWithTheHolder: a command run by `tenure lock` acts
// as its session (it is given the session's secret), a process that only
// knows the session id cannot.
func TestSessionSecretStaysWithTheHolder(t *testing.T) {
	addr := freeAddr(t)
	startServer(t, addr, t.TempDir())

	r := tenure(t, addr, "lock", "L", "--", "sh", "-c", `tenure kv put eph v --session "$TENURE_SESSION"`)
	if r.code != 0 {
		t.Fatalf("ephemeral put from the locked command: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	// The session ended with the command, and its key with it.
	testutil.WaitFor(t, "the ephemeral key to go", 10*time.Second, func() bool {
		return strings.Contains(tenure(t, addr, "kv", "get", "eph", "-o", "json").stdout, `"found":false`)
	})

	// Another process knows a live session's id but not its secret.
	start(t, "holder", addr, "lock", "M", "--", "sleep", "60")
	var sid string
	testutil.WaitFor(t, "the holder's session id", 10*time.Second, func() bool {
		out := tenure(t, addr, "lock", "status", "M", "-o", "json").stdout
		i := strings.Index(out, `"session":`)
		if i < 0 {
			return false
		}
		sid = strings.TrimLeft(strings.SplitN(out[i+len(`"session":`):], ",", 2)[0], " ")
		return sid != "" && sid != "0"
	})
	for _, args := range [][]string{
		{"kv", "put", "stolen", "v", "--session", sid},
		{"kv", "put", "stolen", "v", "--session", sid, "--session-secret", "00112233445566778899aabbccddeeff"},
	} {
		r := tenure(t, addr, args...)
		if r.code != 1 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.HasPrefix(r.stderr, "tenure: ") {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and one line", args, r.code, r.stderr)
		}
	}
}
