package zkcompat

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The clients' installed locations (Debian's packages: zookeeper,
// libzookeeper-java, libcurator-recipes-java, python3-kazoo,
// default-jdk-headless; .ci/setup-zkc.sh installs them).
const (
	javaDir = "/usr/share/java"
	zkCli   = "/usr/share/zookeeper/bin/zkCli.sh"
	// python is Debian's interpreter, the one python3-kazoo installs into
	// (a python3 earlier on PATH may be another one).
	python = "/usr/bin/python3"
)

// classpath lists the jars ZooKeeper's server and Curator's recipes run
// with.
var classpath = strings.Join([]string{
	javaDir + "/curator-recipes.jar",
	javaDir + "/curator-framework.jar",
	javaDir + "/curator-client.jar",
	javaDir + "/zookeeper.jar",
	javaDir + "/zookeeper-jute.jar",
	javaDir + "/guava.jar",
	javaDir + "/slf4j-api.jar",
	javaDir + "/slf4j-simple.jar",
}, ":")

// jvmFlags make a short-lived JVM start fast and small.
var jvmFlags = []string{"-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"}

var (
	// bin holds the tenure binary TestMain builds and the compiled
	// Curator programs (java/*.java).
	bin string
	// shared are the servers the tests share, one of each target, started
	// on first use and stopped when the tests end.
	sharedMu sync.Mutex
	shared   = map[string]*server{}
)

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "tenure-zkcompat-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := checkClients(); err != nil {
		fmt.Fprintf(os.Stderr, "zkcompat: %v (run .ci/setup-zkc.sh)\n", err)
		return 1
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "tenure"), "./cmd/tenure")
	build.Dir, build.Stdout, build.Stderr = "../..", os.Stderr, os.Stderr
	build.Env = append(os.Environ(), "GOWORK=off")
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building tenure: %v\n", err)
		return 1
	}
	srcs, _ := filepath.Glob("java/*.java")
	javac := exec.Command("javac", append([]string{"-cp", classpath, "-d", filepath.Join(dir, "classes")}, srcs...)...)
	if out, err := javac.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "compiling java/*.java: %v\n%s", err, out)
		return 1
	}
	bin = dir
	code := m.Run()
	sharedMu.Lock()
	for _, s := range shared {
		s.p.kill()
		<-s.p.done
	}
	sharedMu.Unlock()
	return code
}

// checkClients reports the first client or server of the suite that is
// not installed.
func checkClients() error {
	for _, f := range append(strings.Split(nettyClasspath, ":"), zkCli, python) {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%s is not installed", f)
		}
	}
	for _, c := range []string{"java", "javac"} {
		if _, err := exec.LookPath(c); err != nil {
			return fmt.Errorf("%s is not on PATH", c)
		}
	}
	if out, err := exec.Command(python, "-c", "import kazoo.client").CombinedOutput(); err != nil {
		return fmt.Errorf("%s cannot import kazoo: %v: %s", python, err, out)
	}
	return nil
}

// The targets every test runs against, as subtests of the same name.
const (
	zooKeeper = "zookeeper"
	tenureT   = "tenure"
)

// tenureReady names the tests whose cases run against Tenure too; the
// others run against ZooKeeper 3.8 only (the harness proving itself) until
// Tenure's ZooKeeper front passes them. ZKCOMPAT_TENURE_ALL=1 runs every
// test against Tenure too (ZKCOMPAT_TENURE_BIN names a tenure binary to
// run instead of the one built from ../..).
var tenureReady = map[string]bool{
	"TestKazooLock":                true,
	"TestKazooReadWriteLock":       true,
	"TestKazooSemaphore":           true,
	"TestKazooElection":            true,
	"TestKazooQueue":               true,
	"TestKazooCounter":             true,
	"TestKazooBarrier":             true,
	"TestKazooParty":               true,
	"TestKazooPartitioner":         true,
	"TestKazooWatches":             true,
	"TestKazooTreeCache":           true,
	"TestKazooLease":               true,
	"TestKazooEphemeralExpiry":     true,
	"TestKazooLockFailover":        true,
	"TestKazooWaiterFailover":      true,
	"TestCuratorMutex":             true,
	"TestCuratorSemaphoreV2":       true,
	"TestCuratorLeaderLatch":       true,
	"TestCuratorLeaderSelector":    true,
	"TestCuratorDistributedQueue":  true,
	"TestCuratorSharedCount":       true,
	"TestCuratorPathChildrenCache": true,
	"TestZkCli":                    true,
	"TestZkCliOperator":            true,
	"TestDiffVersions":             true,
	"TestDiffEphemerals":           true,
	"TestDiffWatches":              true,
	"TestDiffMulti":                true,
	"TestDiffACL":                  true,
	"TestDiffSessions":             true,
	"TestDiffSessionTimeout":       true,
	"TestDiffFollowers":            true,
	"TestDiffSequential":           true,
	"TestDiffContainers":           true,
	"TestDiffNullData":             true,
	"TestDiffMultiCreate2":         true,
	"TestDiffPaths":                true,
	"TestDiffEmptyPath":            true,
	"TestDiffLimits":               true,
	"TestDiffPersistentWatch":      true,
	"TestCuratorCache":             true,
	"TestCuratorReadWriteLock":     true,
	"TestCuratorAtomicLong":        true,
	"TestCuratorDoubleBarrier":     true,
	"TestCuratorPersistentNode":    true,
	"TestContainerCleanup":         true,
	"TestDiffTTL":                  true,
	"TestZkCliTTL":                 true,
	"TestCuratorTTL":               true,
	"TestCuratorPersistentTtlNode": true,
	"TestKazooTLS":                 true,
	"TestJavaClientTLS":            true,
}

// targets lists the targets test t runs against.
func targets(t *testing.T) []string {
	name, _, _ := strings.Cut(t.Name(), "/")
	if tenureReady[name] || os.Getenv("ZKCOMPAT_TENURE_ALL") == "1" {
		return []string{zooKeeper, tenureT}
	}
	return []string{zooKeeper}
}

// eachTarget runs fn as a subtest against each of t's targets, with a
// server shared by the tests and a root path (a fresh znode path, not yet
// created) of the test's own.
func eachTarget(t *testing.T, fn func(t *testing.T, s *server, root string)) {
	t.Helper()
	for _, name := range targets(t) {
		t.Run(name, func(t *testing.T) {
			s := sharedServer(t, name)
			root := "/" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
			fn(t, s, root)
		})
	}
}

// server is a running ZooKeeper or Tenure that ZooKeeper clients reach at
// Addr.
type server struct {
	Name string
	Addr string // host:port of the ZooKeeper client protocol
	p    *proc
}

func sharedServer(t *testing.T, name string) *server {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s, ok := shared[name]; ok {
		select {
		case <-s.p.done:
			t.Fatalf("the shared %s exited: %s", name, s.p.stderr())
		default:
		}
		return s
	}
	var s *server
	var err error
	switch name {
	case zooKeeper:
		s, err = startZooKeeper()
	case tenureT:
		s, err = startTenure()
	}
	if err != nil {
		t.Fatal(err)
	}
	shared[name] = s
	return s
}

// Session timeouts: both servers negotiate within [minSessionMs,
// maxSessionMs], ZooKeeper's defaults for a tick of tickMs (2 and 20
// ticks).
const (
	tickMs       = 1000
	minSessionMs = 2 * tickMs
	maxSessionMs = 20 * tickMs
)

// startZooKeeper runs a standalone ZooKeeper 3.8 on a free loopback port
// with a configuration and data directory of its own (no admin server, no
// JMX), not the system's service.
func startZooKeeper() (*server, error) {
	dir, err := os.MkdirTemp("", "zkcompat-zookeeper-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf("tickTime=%d\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n"+
		"minSessionTimeout=%d\nmaxSessionTimeout=%d\n4lw.commands.whitelist=ruok\n",
		tickMs, filepath.Join(dir, "data"), port, minSessionMs, maxSessionMs)
	if err := os.WriteFile(filepath.Join(dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	args := append(append([]string{}, jvmFlags...), "-Dorg.slf4j.simpleLogger.defaultLogLevel=info", "-Dzookeeper.jmx.log4j.disable=true",
		"-Dznode.container.checkIntervalMs=1000", // containers are checked every second, not minute
		"-Dzookeeper.extendedTypesEnabled=true",  // TTL nodes on, as Tenure's --zk-ttl-nodes (ttl_test.go)
		"-cp", classpath, "org.apache.zookeeper.server.ZooKeeperServerMain", filepath.Join(dir, "zoo.cfg"))
	p, err := spawn(dir, "", "java", args...)
	if err != nil {
		return nil, err
	}
	s := &server{Name: zooKeeper, Addr: fmt.Sprintf("127.0.0.1:%d", port), p: p}
	return s, s.waitReady()
}

// startTenure runs a single-member `tenure serve` with its ZooKeeper front
// on a free loopback port, ZooKeeper's tick (so the same session
// timeout bounds) and its container check interval.
func startTenure() (*server, error) {
	dir, err := os.MkdirTemp("", "zkcompat-tenure-")
	if err != nil {
		return nil, err
	}
	p, err := spawn(dir, "", tenureBin(), "serve", "-o", "json", "--data-dir", filepath.Join(dir, "data"),
		"--listen", "127.0.0.1:0", "--http-listen", "", "--zk-listen", "127.0.0.1:0",
		"--zk-tick-time", fmt.Sprint(tickMs*time.Millisecond),
		"--zk-container-check-interval", "1s", // as ZooKeeper's checkIntervalMs here
		"--zk-ttl-nodes") // as ZooKeeper's extendedTypesEnabled here
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	var ready struct {
		Serving   string `json:"serving"`
		ZooKeeper string `json:"zookeeper"`
	}
	for {
		line, _, _ := strings.Cut(p.stdout(), "\n")
		if json.Unmarshal([]byte(line), &ready) == nil && ready.Serving != "" {
			break
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("tenure serve exited: %s", p.stderr())
		default:
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("tenure serve printed no ready line within 30s: %s", p.stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ready.ZooKeeper == "" {
		p.kill()
		return nil, fmt.Errorf("tenure serve's ready line names no ZooKeeper address: %s", p.stdout())
	}
	s := &server{Name: tenureT, Addr: ready.ZooKeeper, p: p}
	return s, s.waitReady()
}

// tenureBin is the tenure binary the tests run: TestMain's build, or
// ZKCOMPAT_TENURE_BIN's.
func tenureBin() string {
	if b := os.Getenv("ZKCOMPAT_TENURE_BIN"); b != "" {
		return b
	}
	return filepath.Join(bin, "tenure")
}

// waitReady polls until a ZooKeeper session can be opened.
func (s *server) waitReady() error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := dialZK(s.Addr, 10*time.Second)
		if err == nil {
			c.close()
			return nil
		}
		select {
		case <-s.p.done:
			return fmt.Errorf("%s exited: %v\n%s\n%s", s.Name, err, s.p.stdout(), s.p.stderr())
		default:
		}
		if time.Now().After(deadline) {
			s.p.kill()
			return fmt.Errorf("%s does not open sessions at %s within 60s: %v\n%s", s.Name, s.Addr, err, s.p.stderr())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// proc is a process the tests started, in a process group of its own, with
// its output in files.
type proc struct {
	cmd        *exec.Cmd
	out, errF  string
	done       chan struct{}
	exitStatus int
}

// spawn starts name in dir (its output in dir/stdout and dir/stderr).
func spawn(dir, stdin, name string, args ...string) (*proc, error) {
	p := &proc{out: filepath.Join(dir, "stdout"), errF: filepath.Join(dir, "stderr"), done: make(chan struct{})}
	stdout, err := os.Create(p.out)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := os.Create(p.errF)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	p.cmd = exec.Command(name, args...)
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = stdout, stderr
	if stdin != "" {
		p.cmd.Stdin = strings.NewReader(stdin)
	}
	p.cmd.SysProcAttr = procAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = p.cmd.Wait()
		p.exitStatus = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	return p, nil
}

// startProc starts a process for test t, killed (its whole group) when t
// ends; its output is logged if t failed.
func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p, err := spawn(t.TempDir(), "", name, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s %v stdout:\n%s\nstderr:\n%s", name, args, p.stdout(), p.stderr())
		}
	})
	return p
}

// kill sends SIGKILL to the process's group.
func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (p *proc) stdout() string { b, _ := os.ReadFile(p.out); return string(b) }
func (p *proc) stderr() string { b, _ := os.ReadFile(p.errF); return string(b) }

// wait waits up to d for the process to exit and returns its status.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.exitStatus
	case <-time.After(d):
		t.Fatalf("%v still running after %v; stdout:\n%s\nstderr:\n%s", p.cmd.Args, d, p.stdout(), p.stderr())
	}
	return 0
}

// mustExit0 waits for p and fails t unless it exited with status 0.
func (p *proc) mustExit0(t *testing.T, d time.Duration) {
	t.Helper()
	if code := p.wait(t, d); code != 0 {
		t.Fatalf("%v exited %d (its output follows)", p.cmd.Args, code)
	}
}

// waitFor polls cond until it holds, or fails the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
