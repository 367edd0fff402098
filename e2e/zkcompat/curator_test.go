package zkcompat

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Curator 5.4's recipes (libcurator-recipes-java), unmodified, each in JVM
// processes of its own: java/Recipes.java holds each case's checks.

// curator starts Recipes' case against s, under root.
func curator(t *testing.T, s *server, root, kase string, args ...string) *proc {
	t.Helper()
	argv := append(append([]string{}, jvmFlags...), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
		"-cp", classpath+":"+filepath.Join(bin, "classes"), "Recipes", s.Addr, root, kase)
	return startProc(t, "java", append(argv, args...)...)
}

// runCurator runs a case to its end; it must print "ok".
func runCurator(t *testing.T, s *server, root, kase string) {
	t.Helper()
	p := curator(t, s, root, kase)
	p.mustExit0(t, 2*time.Minute)
	if !strings.Contains(p.stdout(), "ok") {
		t.Fatalf("%s printed no ok: %s", kase, p.stdout())
	}
}

// TestCuratorMutex: three JVMs take one InterProcessMutex in turn (no two
// holders at once, by a shared log), then three more queue for another one
// in a known order and get it in that order (Curator's mutex is fair).
func TestCuratorMutex(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) {
		t.Run("exclusion", func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "holders")
			const workers, rounds = 3, 5
			var ps []*proc
			for i := 0; i < workers; i++ {
				ps = append(ps, curator(t, s, root, "mutex-worker", log, fmt.Sprint(rounds)))
			}
			for _, p := range ps {
				p.mustExit0(t, 2*time.Minute)
			}
			checkExclusive(t, log, workers, rounds)
		})
		t.Run("fifo", func(t *testing.T) {
			obs, err := dialZK(s.Addr, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer obs.close()
			log := filepath.Join(t.TempDir(), "order")
			names := []string{"first", "second", "third"}
			var ps []*proc
			for i, name := range names {
				ps = append(ps, curator(t, s, root, "mutex-holder", log, name))
				// The next one queues only once this one's lock node is there.
				waitFor(t, time.Minute, name+"'s lock node", func() bool {
					select {
					case <-ps[i].done:
						t.Fatalf("%s exited: %s", name, ps[i].stderr())
					default:
					}
					kids, err := obs.children(root + "/fifo")
					return err == nil && len(kids) == i+1
				})
			}
			for i, name := range names {
				want := strings.Join(prefixAll("acquired ", names[:i+1]), "\n")
				waitFor(t, time.Minute, name+" acquires", func() bool {
					b, _ := os.ReadFile(log)
					return strings.TrimSpace(string(b)) == want
				})
				if err := os.WriteFile(log+".release-"+name, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				ps[i].mustExit0(t, time.Minute)
			}
		})
	})
}

func prefixAll(p string, ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = p + s
	}
	return out
}

func TestCuratorSemaphoreV2(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "semaphore") })
}

func TestCuratorLeaderLatch(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "leader-latch") })
}

func TestCuratorLeaderSelector(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "leader-selector") })
}

func TestCuratorDistributedQueue(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "queue") })
}

func TestCuratorSharedCount(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "shared-count") })
}

func TestCuratorPathChildrenCache(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "path-children-cache") })
}

// TestCuratorCache: CuratorCache, on a persistent recursive watch
// (addWatch).
func TestCuratorCache(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "curator-cache") })
}

// TestCuratorReadWriteLock: InterProcessReadWriteLock's readers share, and
// its writer waits for them and shuts them out.
func TestCuratorReadWriteLock(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "rwlock") })
}

// TestCuratorAtomicLong: DistributedAtomicLong's optimistic increments from
// four clients lose none, and compareAndSet refuses a stale value.
func TestCuratorAtomicLong(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "atomic-long") })
}

// TestCuratorDoubleBarrier: DistributedDoubleBarrier lets three members in
// together, and out together.
func TestCuratorDoubleBarrier(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "double-barrier") })
}

// TestCuratorPersistentNode: a protected ephemeral PersistentNode is
// recreated after another client deletes it, and removed when closed.
func TestCuratorPersistentNode(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "persistent-node") })
}
