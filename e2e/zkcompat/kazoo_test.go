package zkcompat

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Kazoo 2.8's recipes (python3-kazoo), unmodified, in processes of their
// own: kazoo/recipes.py holds each case's checks.

// kazoo starts recipes.py's case against s, under root.
func kazoo(t *testing.T, s *server, root, kase string, args ...string) *proc {
	t.Helper()
	return startProc(t, python, append([]string{kazooScript(t), s.Addr, root, kase}, args...)...)
}

// runKazoo runs a case to its end; it must print "ok".
func runKazoo(t *testing.T, s *server, root, kase string, args ...string) {
	t.Helper()
	p := kazoo(t, s, root, kase, args...)
	p.mustExit0(t, 2*time.Minute)
	if !strings.Contains(p.stdout(), "ok") {
		t.Fatalf("%s printed no ok: %s", kase, p.stdout())
	}
}

// TestKazooLock: three processes take Kazoo's Lock in turn, five times
// each; a shared log shows no two holders at once.
func TestKazooLock(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) {
		log := filepath.Join(t.TempDir(), "holders")
		const workers, rounds = 3, 5
		var ps []*proc
		for i := 0; i < workers; i++ {
			ps = append(ps, kazoo(t, s, root, "lock-worker", log, fmt.Sprint(rounds)))
		}
		for _, p := range ps {
			p.mustExit0(t, 2*time.Minute)
		}
		checkExclusive(t, log, workers, rounds)
	})
}

func TestKazooReadWriteLock(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "rwlock") })
}

func TestKazooSemaphore(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "semaphore") })
}

func TestKazooElection(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "election") })
}

// TestKazooQueue covers Queue and LockingQueue.
func TestKazooQueue(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "queue") })
}

func TestKazooCounter(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "counter") })
}

// TestKazooBarrier covers Barrier and DoubleBarrier.
func TestKazooBarrier(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "barrier") })
}

// TestKazooParty covers Party and ShallowParty.
func TestKazooParty(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "party") })
}

func TestKazooPartitioner(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "partitioner") })
}

// TestKazooWatches covers DataWatch, ChildrenWatch and a one-shot watch.
func TestKazooWatches(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "watches") })
}

// TestKazooEphemeralExpiry: a Kazoo process holding an ephemeral node is
// killed (SIGKILL, by its PID); the node outlives the connection while
// the session lives, and is gone once the session timeout has passed.
func TestKazooEphemeralExpiry(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) {
		const timeout = 4 * time.Second
		path := root + "/held"
		p := kazoo(t, s, root, "hold-ephemeral", path, fmt.Sprint(timeout.Seconds()))
		waitFor(t, 30*time.Second, "the holder's session line", func() bool {
			select {
			case <-p.done:
				t.Fatalf("holder exited: %s", p.stderr())
			default:
			}
			return strings.HasPrefix(p.stdout(), "session ")
		})
		obs, err := dialZK(s.Addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer obs.close()
		_, st, err := obs.getData(path)
		if err != nil {
			t.Fatal(err)
		}
		owner := strings.TrimSpace(strings.TrimPrefix(p.stdout(), "session "))
		if got := fmt.Sprintf("%x", st.EphemeralOwner); got != owner {
			t.Fatalf("ephemeralOwner %s, want the holder's session %s", got, owner)
		}
		p.kill()
		killed := time.Now()
		<-p.done
		if ok, err := obs.exists(path); err != nil || !ok {
			t.Fatalf("the ephemeral node went with the connection, before the session timed out (exists %v, %v)", ok, err)
		}
		waitFor(t, timeout+15*time.Second, "the ephemeral node removed on session expiry", func() bool {
			ok, err := obs.exists(path)
			if err != nil {
				t.Fatal(err)
			}
			return !ok
		})
		gone := time.Since(killed)
		t.Logf("ephemeral node gone %v after the kill (session timeout %v)", gone.Round(10*time.Millisecond), timeout)
		if gone < timeout/2 {
			t.Fatalf("ephemeral node gone %v after the kill, before half the session timeout %v", gone, timeout)
		}
	})
}

// checkExclusive reads the log that workers processes each wrote rounds
// enter/exit pairs to while holding a lock: the pairs must not
// interleave (no two holders at once), and every process must have held.
func checkExclusive(t *testing.T, log string, workers, rounds int) {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2*workers*rounds {
		t.Fatalf("%d log lines, want %d:\n%s", len(lines), 2*workers*rounds, b)
	}
	holders := map[string]int{}
	for i := 0; i < len(lines); i += 2 {
		enter, exit := strings.TrimPrefix(lines[i], "enter "), strings.TrimPrefix(lines[i+1], "exit ")
		if !strings.HasPrefix(lines[i], "enter ") || !strings.HasPrefix(lines[i+1], "exit ") || enter != exit {
			t.Fatalf("overlapping holders at line %d: %q then %q\n%s", i+1, lines[i], lines[i+1], b)
		}
		holders[enter]++
	}
	if len(holders) != workers {
		t.Fatalf("holders %v, want %d processes", holders, workers)
	}
}

// TestKazooTreeCache: TreeCache mirrors a subtree's additions, updates and
// removals.
func TestKazooTreeCache(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "tree-cache") })
}

// TestKazooLease: NonBlockingLease and MultiNonBlockingLease, whose
// versioned writes give a lease to one holder (or N) at a time.
func TestKazooLease(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runKazoo(t, s, root, "lease") })
}
