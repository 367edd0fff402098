package e2e

import (
	"context"
	"encoding/json"
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
	if code := p.wait(3 * time.Second); code != 7 || !strings.Contains(p.stderr(), "lost ownership of lock L") {
		t.Fatalf("tenure lock exited %d: %s", code, p.stderr())
	}
}

// TestLockCommandSurvivesLeaderKill: `tenure lock` on a 3-node cluster,
// then kill -9 of the leader. The command may be paused while the hold is
// suspect, but it is not stopped: once a new leader confirms the session,
// the same hold (same token) is held again and the command runs on.
func TestLockCommandSurvivesLeaderKill(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("reads the command's state from /proc: " + err.Error())
	}
	ms := startCluster(t, 3)
	eps := endpoints(ms)
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	pidFile := filepath.Join(dir, "pid")
	p := start(t, "holder", eps, "lock", "cl", "--ttl", "5s", "--", "sh", "-c",
		`echo $TENURE_FENCE_TOKEN > "$0.tmp" && mv "$0.tmp" "$0" && echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 100`, tokFile, pidFile)
	token := readFile(t, tokFile, 30*time.Second)
	pid, err := strconv.Atoi(readFile(t, pidFile, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, others := leaderOf(t, ctx, dial(t, ctx, eps), ms)
	if err := leader.p.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	<-leader.p.done

	rest := endpoints(others)
	var st struct {
		Holder *struct {
			Token uint64 `json:"token"`
		} `json:"holder"`
	}
	testutil.WaitFor(t, "a new leader to show the same hold", 30*time.Second, func() bool {
		r := tenure(t, rest, "lock", "status", "cl", "-o", "json")
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
			return false
		}
		return st.Holder != nil
	})
	if got := strconv.FormatUint(st.Holder.Token, 10); got != token {
		t.Fatalf("after the fail-over the holder's token is %s, want the command's %s", got, token)
	}
	// The broken stream made the hold suspect and the command paused; a
	// keepalive through the new leader confirms the same hold again.
	resumed := "tenure: lock cl confirmed again (token " + token + "): command resumed\n"
	testutil.WaitFor(t, "tenure lock to resume its command", 30*time.Second, func() bool {
		if p.exited() {
			t.Fatalf("tenure lock exited %d across the fail-over: %s", p.status, p.stderr())
		}
		return strings.Contains(p.stderr(), resumed)
	})
	if !strings.Contains(p.stderr(), "command paused") {
		t.Fatalf("resumed without having paused: %s", p.stderr())
	}
	testutil.WaitFor(t, "the command to run again", 10*time.Second, func() bool {
		return procState(pid) == 'S' || procState(pid) == 'R'
	})
	if p.exited() {
		t.Fatalf("tenure lock exited %d across the fail-over: %s", p.status, p.stderr())
	}
	if !alive(pid) {
		t.Fatalf("the command was stopped across the fail-over: %s", p.stderr())
	}
}

// procState is the state letter of /proc/PID/stat (0 if it is gone).
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}
