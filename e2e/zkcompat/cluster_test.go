package zkcompat

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// member is one server of a three-member ZooKeeper ensemble or Tenure
// cluster that a test runs for itself.
type member struct {
	Addr   string // the ZooKeeper client address
	Tenure string // Tenure's own API (Tenure's members only)
	p      *proc
}

// startCluster runs three members of target name: a ZooKeeper 3.8
// ensemble or a Tenure cluster, each member serving ZooKeeper clients;
// it returns once every member opens sessions.
func startCluster(t *testing.T, name string) []*member {
	t.Helper()
	var ms []*member
	switch name {
	case zooKeeper:
		ms = startEnsemble(t)
	case tenureT:
		ms = startTenureCluster(t)
	}
	for _, m := range ms {
		s := &server{Name: name, Addr: m.Addr, p: m.p}
		if err := s.waitReady(); err != nil {
			t.Fatal(err)
		}
	}
	return ms
}

func ports(t *testing.T, n int) []int {
	t.Helper()
	var ps []int
	for len(ps) < n {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

func startEnsemble(t *testing.T) []*member {
	t.Helper()
	ps := ports(t, 9)
	var servers strings.Builder
	for i := 0; i < 3; i++ {
		fmt.Fprintf(&servers, "server.%d=127.0.0.1:%d:%d\n", i+1, ps[3+i], ps[6+i])
	}
	var ms []*member
	for i := 0; i < 3; i++ {
		dir := t.TempDir()
		data := filepath.Join(dir, "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(fmt.Sprint(i+1)), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := fmt.Sprintf("tickTime=%d\ninitLimit=10\nsyncLimit=5\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n"+
			"admin.enableServer=false\nminSessionTimeout=%d\nmaxSessionTimeout=%d\n%s",
			tickMs, data, ps[i], minSessionMs, maxSessionMs, servers.String())
		if err := os.WriteFile(filepath.Join(dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		args := append(append([]string{}, jvmFlags...), "-Dzookeeper.jmx.log4j.disable=true",
			"-cp", classpath, "org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(dir, "zoo.cfg"))
		ms = append(ms, &member{Addr: fmt.Sprintf("127.0.0.1:%d", ps[i]), p: startProc(t, "java", args...)})
	}
	return ms
}

func startTenureCluster(t *testing.T) []*member {
	t.Helper()
	ps := ports(t, 6)
	var peers []string
	for i := 0; i < 3; i++ {
		peers = append(peers, fmt.Sprintf("n%d=127.0.0.1:%d", i+1, ps[3+i]))
	}
	root := t.TempDir()
	var ms []*member
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("n%d", i+1)
		p := startProc(t, tenureBin(), "serve", "-o", "json", "--http-listen", "", "--node-id", id,
			"--listen", "127.0.0.1:0", "--peer-listen", fmt.Sprintf("127.0.0.1:%d", ps[3+i]),
			"--zk-listen", fmt.Sprintf("127.0.0.1:%d", ps[i]), "--zk-tick-time", fmt.Sprint(tickMs*time.Millisecond),
			// Followers relay to the leader over the peer port: the
			// address a leader publishes for older releases' followers
			// leads nowhere here, so nothing relays through it.
			"--zk-advertise", "127.0.0.1:1",
			"--data-dir", filepath.Join(root, id), "--bootstrap-peers", strings.Join(peers, ","))
		ms = append(ms, &member{Addr: fmt.Sprintf("127.0.0.1:%d", ps[i]), p: p})
	}
	for _, m := range ms {
		waitFor(t, 60*time.Second, "a member's ready line", func() bool {
			select {
			case <-m.p.done:
				t.Fatalf("tenure serve exited: %s", m.p.stderr())
			default:
			}
			var out struct {
				Serving   string `json:"serving"`
				ZooKeeper string `json:"zookeeper"`
			}
			line, _, _ := strings.Cut(m.p.stdout(), "\n")
			if json.Unmarshal([]byte(line), &out) != nil || out.ZooKeeper == "" {
				return false
			}
			m.Tenure = out.Serving
			return true
		})
	}
	return ms
}

// TestKazooLockFailover: a Kazoo Lock holder connected to one member of a
// three-member cluster, a second process queued behind it; the holder's
// member is killed with SIGKILL. The holder's client moves its session to
// another member (never losing it), its lock node stays (same czxid, same
// owner), and the waiting process does not get the lock until the holder
// releases it. On Tenure, a fenced register shows it too: the first
// holder's token (its lock node's czxid) is accepted after the failover,
// and stale once the next holder wrote with its own.
func TestKazooLockFailover(t *testing.T) {
	for _, name := range targets(t) {
		t.Run(name, func(t *testing.T) {
			ms := startCluster(t, name)
			root := "/failover"
			log := filepath.Join(t.TempDir(), "holders")
			hosts := ms[0].Addr + "," + ms[1].Addr + "," + ms[2].Addr
			holder := startProc(t, python, kazooScript(t), hosts, root, "failover-holder", log)
			waitFor(t, time.Minute, "the holder's lock", func() bool {
				select {
				case <-holder.done:
					t.Fatalf("holder exited: %s", holder.stderr())
				default:
				}
				return strings.HasPrefix(holder.stdout(), "held ")
			})
			t.Logf("holder: %s", strings.TrimSpace(holder.stdout()))
			if !strings.HasSuffix(strings.TrimSpace(holder.stdout()), "via "+ms[0].Addr) {
				t.Fatalf("the holder is not connected to the first member %s: %s", ms[0].Addr, holder.stdout())
			}
			contender := startProc(t, python, kazooScript(t), ms[2].Addr+","+ms[1].Addr, root, "failover-contender", log)
			obs, err := dialZK(ms[1].Addr, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer obs.close()
			waitFor(t, time.Minute, "the contender's lock node", func() bool {
				kids, err := obs.children(root + "/lock")
				return err == nil && len(kids) == 2
			})

			ms[0].p.kill()
			<-ms[0].p.done
			waitFor(t, 90*time.Second, "the holder back on another member with its session and lock", func() bool {
				select {
				case <-holder.done:
					t.Fatalf("holder exited: %s", holder.stderr())
				default:
				}
				return strings.Contains(holder.stdout(), "reconnected via ")
			})
			t.Logf("holder: %s", strings.TrimSpace(holder.stdout()))
			b, _ := os.ReadFile(log)
			if strings.TrimSpace(string(b)) != "enter holder" {
				t.Fatalf("a second holder while the first held the lock:\n%s", b)
			}
			// On Tenure, the lock node's czxid is a fencing token: the holder
			// writes a fenced register with it, after the failover.
			var held []string
			if name == tenureT {
				held = strings.Fields(holder.stdout()) // held SESSION PATH CZXID via ADDR
				fencePut(t, ms[1].Tenure, "zk-failover", "holder", held[3], 0)
			}
			if err := os.WriteFile(log+".release", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			holder.mustExit0(t, time.Minute)
			contender.mustExit0(t, time.Minute)
			b, _ = os.ReadFile(log)
			if got, want := strings.TrimSpace(string(b)), "enter holder\nexit holder\nenter contender\nexit contender"; got != want {
				t.Fatalf("holders:\n%s\nwant:\n%s", got, want)
			}
			if name == tenureT {
				// The next holder's token is accepted; the first holder's,
				// written late, is stale.
				acquired := strings.Fields(contender.stdout()) // acquired CZXID
				fencePut(t, ms[2].Tenure, "zk-failover", "contender", acquired[1], 0)
				fencePut(t, ms[1].Tenure, "zk-failover", "late holder", held[3], 3)
			}
		})
	}
}

// TestKazooWaiterFailover: a Kazoo Lock waiter connected to one member of
// a three-member cluster, queued behind a holder on another; the waiter's
// member is killed with SIGKILL. Its session moves to another member,
// with the watch on the lock node ahead of it (setWatches): when the
// holder releases, the waiter gets the lock.
func TestKazooWaiterFailover(t *testing.T) {
	for _, name := range targets(t) {
		t.Run(name, func(t *testing.T) {
			ms := startCluster(t, name)
			root := "/waiter"
			log := filepath.Join(t.TempDir(), "holders")
			holder := startProc(t, python, kazooScript(t), ms[2].Addr, root, "hold-lock", log)
			waitFor(t, time.Minute, "the holder's lock", func() bool {
				select {
				case <-holder.done:
					t.Fatalf("holder exited: %s", holder.stderr())
				default:
				}
				return strings.HasPrefix(holder.stdout(), "held")
			})
			waiter := startProc(t, python, kazooScript(t), ms[0].Addr+","+ms[1].Addr, root, "failover-waiter", log)
			obs, err := dialZK(ms[2].Addr, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer obs.close()
			waitFor(t, time.Minute, "the waiter's lock node", func() bool {
				kids, err := obs.children(root + "/lock")
				return err == nil && len(kids) == 2
			})
			if !strings.Contains(waiter.stdout(), "waiting via "+ms[0].Addr) {
				t.Fatalf("the waiter is not connected to the first member %s: %s", ms[0].Addr, waiter.stdout())
			}
			ms[0].p.kill()
			<-ms[0].p.done
			waitFor(t, 90*time.Second, "the waiter back on another member", func() bool {
				select {
				case <-waiter.done:
					t.Fatalf("waiter exited: %s", waiter.stderr())
				default:
				}
				return strings.Contains(waiter.stdout(), "reconnected")
			})
			if strings.Contains(waiter.stdout(), "acquired") {
				t.Fatalf("the waiter acquired while the holder held: %s", waiter.stdout())
			}
			if err := os.WriteFile(log+".release", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			holder.mustExit0(t, time.Minute)
			waiter.mustExit0(t, time.Minute)
			t.Logf("waiter: %s", strings.TrimSpace(waiter.stdout()))
			b, _ := os.ReadFile(log)
			if got, want := strings.TrimSpace(string(b)), "enter holder\nexit holder\nenter waiter\nexit waiter"; got != want {
				t.Fatalf("holders:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// fencePut writes register key through Tenure's `fence put` with token
// and expects its exit code (0 accepted, 3 stale).
func fencePut(t *testing.T, endpoint, key, value, token string, want int) {
	t.Helper()
	cmd := exec.Command(tenureBin(), "fence", "put", key, value, "--token", token, "--endpoint", endpoint, "-o", "json")
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	t.Logf("fence put %s %q --token %s: exit %d %s", key, value, token, code, strings.TrimSpace(string(out)))
	if code != want {
		t.Fatalf("fence put %s %q --token %s: exit %d, want %d: %s", key, value, token, code, want, out)
	}
}

func kazooScript(t *testing.T) string {
	t.Helper()
	script, err := filepath.Abs("kazoo/recipes.py")
	if err != nil {
		t.Fatal(err)
	}
	return script
}
