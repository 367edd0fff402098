package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

// alive reports whether pid runs (a zombie does not count).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// TestLockCommandDiesWithTenure: a command run by `tenure lock` does not
// run on without the lock when tenure itself is killed with SIGKILL.
func TestLockCommandDiesWithTenure(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("the death signal is Linux's (PR_SET_PDEATHSIG): " + err.Error())
	}
	addr := freeAddr(t)
	startServer(t, addr, t.TempDir())
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := start(t, "holder", addr, "lock", "L", "--ttl", "2s", "--", "sh", "-c", `echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 100`, pidFile)
	pid, err := strconv.Atoi(readFile(t, pidFile, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL); err != nil { // tenure alone, not its group
		t.Fatal(err)
	}
	p.wait(5 * time.Second)
	testutil.WaitFor(t, "the command to die with tenure", 5*time.Second, func() bool { return !alive(pid) })
}

// TestLockExitsWhenItsCommandHas: the server goes away while `tenure lock
// --on-suspect stop --kill-grace 1s` runs its command: the command is
// stopped and tenure exits right after it, not a session timeout later.
func TestLockExitsWhenItsCommandHas(t *testing.T) {
	addr := freeAddr(t)
	srv := startServer(t, addr, t.TempDir())
	ready := filepath.Join(t.TempDir(), "ready")
	p := start(t, "holder", addr, "lock", "L", "--ttl", "10s", "--on-suspect", "stop", "--kill-grace", "1s", "--", "sh", "-c", `touch "$0"; exec sleep 100`, ready)
	readFile(t, ready, 10*time.Second)
	srv.signal(syscall.SIGTERM)
	srv.wait(10 * time.Second)
	if code := p.wait(3 * time.Second); code != 1 || !strings.Contains(p.stderr(), "lost ownership of lock L") {
		t.Fatalf("tenure lock exited %d: %s", code, p.stderr())
	}
}
