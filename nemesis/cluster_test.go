//go:build linux || darwin

package nemesis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// proc is a process started by the suite, leading a process group of its
// own. Its output goes to files, so that a grandchild holding them open
// cannot keep Wait from returning.
type proc struct {
	name       string
	cmd        *exec.Cmd
	outF, errF string
	done       chan struct{}
	status     int // valid once done is closed
}

// startProc runs argv with env; its stdout and stderr go to files in dir.
func startProc(name, dir string, env []string, argv ...string) (*proc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p := &proc{name: name, outF: filepath.Join(dir, "stdout"), errF: filepath.Join(dir, "stderr"), done: make(chan struct{})}
	stdout, err := os.Create(p.outF)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := os.Create(p.errF)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = stdout, stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = p.cmd.Wait()
		p.status = exitStatus(p.cmd.ProcessState)
		close(p.done)
	}()
	return p, nil
}

func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process's group (ignored once it has exited).
func (p *proc) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = syscall.Kill(-p.pid(), sig)
	}
}

// waitExit waits up to d for the process to exit.
func (p *proc) waitExit(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// stop asks the process to exit (SIGTERM) and kills its group if it has
// not within grace.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	p.signal(syscall.SIGTERM)
	p.signal(syscall.SIGCONT)
	if !p.waitExit(grace) {
		p.signal(syscall.SIGKILL)
		p.waitExit(10 * time.Second)
	}
}

func (p *proc) stdout() string { b, _ := os.ReadFile(p.outF); return string(b) }
func (p *proc) stderr() string { b, _ := os.ReadFile(p.errF); return string(b) }

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// node is one `tenure serve` member. Only the goroutine driving the
// cluster (the nemesis, or the test after it) touches it.
type node struct {
	i               int
	id, addr, peer  string
	dataDir, logDir string
	// disk is the mount point of the node's own size-limited file system,
	// which holds dataDir ("" without one).
	disk string
	// api is the proxy in front of the client API that the workload dials.
	api *clientProxy
	// join: start with --join instead of --bootstrap-peers (a member
	// rebuilt from its peers; both are ignored once the data dir exists).
	join    bool
	p       *proc
	gen     int // incarnations started so far
	status  *client.Client
	lastErr string
}

// clusterConfig describes a cluster to start.
type clusterConfig struct {
	n      int
	broken bool // --unsafe-skip-fence-check
	// logStore is the --log-store every node starts with ("" for the
	// default engine).
	logStore string
	// disks gives every node's data directory a size-limited file system
	// of its own (for disk-full), if the test may mount one.
	disks bool
}

// cluster is a 3-node cluster of real processes with a link proxy on
// every directed peer link and one in front of every node's client API.
type cluster struct {
	t     testing.TB
	root  string
	cfg   clusterConfig
	nodes []*node
	links map[[2]int]*link
	// disks: every node has its own file system (cfg.disks, and the test
	// could mount them).
	disks bool
	// eps is the client addresses the workload dials, through the client
	// proxies; direct the nodes' own client addresses, which the nemesis
	// and admin use.
	eps, direct string
	admin       *client.Client // every endpoint, directly: probes and final reads
}

// freeAddr picks a free loopback port below the kernel's ephemeral range
// (32768 and up on Linux, 49152 and up on macOS). A node restarted after
// kill -9 binds the same ports again; a port from the ephemeral range could
// meanwhile have been given to some outgoing connection.
func freeAddr(t testing.TB) string { return testutil.FreeAddr(t, 20000, 32000) }

// startCluster starts cfg.n nodes bootstrapped together and waits until
// they serve.
func startCluster(t testing.TB, cfg clusterConfig) *cluster {
	t.Helper()
	c := &cluster{t: t, root: t.TempDir(), cfg: cfg, links: make(map[[2]int]*link)}
	t.Cleanup(c.close)
	if cfg.disks {
		if err := canMountDisks(); err != nil {
			t.Logf("nemesis: %v: the nodes' data dirs stay on the test's file system and disk-full is left out", err)
		} else {
			c.disks = true
		}
	}
	var eps, direct []string
	for i := 0; i < cfg.n; i++ {
		nd := &node{i: i, id: fmt.Sprintf("n%d", i+1), addr: freeAddr(t), peer: freeAddr(t)}
		nd.logDir = filepath.Join(c.root, nd.id)
		nd.dataDir = filepath.Join(c.root, nd.id, "data")
		if c.disks {
			nd.disk = filepath.Join(c.root, nd.id, "disk")
			if err := mountDisk(nd.disk, diskSize); err != nil {
				t.Fatalf("%s: %v", nd.id, err)
			}
			nd.dataDir = filepath.Join(nd.disk, "data")
		}
		var err error
		if nd.api, err = newClientProxy(nd.addr); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, nd)
		eps, direct = append(eps, nd.api.Addr()), append(direct, nd.addr)
	}
	c.eps, c.direct = strings.Join(eps, ","), strings.Join(direct, ",")
	for i := range c.nodes {
		for j := range c.nodes {
			if i == j {
				continue
			}
			l, err := newLink(i, j, c.nodes[j].peer)
			if err != nil {
				t.Fatal(err)
			}
			c.links[[2]int{i, j}] = l
		}
	}
	ctx := context.Background()
	var err error
	if c.admin, err = dialClient(ctx, c.direct); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		if nd.status, err = dialClient(ctx, nd.addr); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.startAll(c.nodes); err != nil {
		t.Fatal(err)
	}
	if err := c.secureBootstrap(); err != nil {
		t.Fatal(err)
	}
	if err := c.waitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// close stops every node, link and proxy and unmounts the nodes' file
// systems; on failure it logs the nodes' stderr.
func (c *cluster) close() {
	for _, nd := range c.nodes {
		if nd.p != nil {
			nd.p.stop(5 * time.Second)
			nd.lastErr = nd.p.stderr()
		}
		if c.t.Failed() && nd.lastErr != "" {
			c.t.Logf("%s stderr (last incarnation, tail):\n%s", nd.id, tail(nd.lastErr, 40))
		}
		if nd.status != nil {
			nd.status.Close()
		}
		if nd.api != nil {
			nd.api.Close()
		}
		if nd.disk != "" {
			if err := unmountDisk(nd.disk); err != nil {
				c.t.Errorf("%s: %v", nd.id, err)
			}
		}
	}
	for _, l := range c.links {
		l.Close()
	}
	if c.admin != nil {
		c.admin.Close()
	}
}

// start starts a new incarnation of nd on its data directory (the
// bootstrap list is ignored once the directory exists).
func (c *cluster) start(nd *node) error {
	nd.gen++
	var peers, routes []string
	for _, o := range c.nodes {
		peers = append(peers, o.id+"="+o.peer)
		if o != nd {
			routes = append(routes, o.id+"="+c.links[[2]int{nd.i, o.i}].Addr())
		}
	}
	// Its own address too: raft looks it up for every RPC it sends, and
	// warns of each lookup the routes cannot answer.
	routes = append(routes, nd.id+"="+nd.peer)
	args := []string{tenureBin, "serve", "--http-listen", "127.0.0.1:0", "--node-id", nd.id, "--listen", nd.addr, "--peer-listen", nd.peer,
		"--data-dir", nd.dataDir, "--peer-route", strings.Join(routes, ",")}
	if nd.join {
		args = append(args, "--join")
	} else {
		args = append(args, "--bootstrap-peers", strings.Join(peers, ","))
	}
	if c.cfg.broken {
		args = append(args, "--unsafe-skip-fence-check")
	}
	if c.cfg.logStore != "" {
		args = append(args, "--log-store", c.cfg.logStore)
	}
	args = append(args, secureServeArgs()...)
	p, err := startProc(fmt.Sprintf("%s#%d", nd.id, nd.gen), filepath.Join(nd.logDir, fmt.Sprintf("run-%d", nd.gen)), os.Environ(), args...)
	if err != nil {
		return fmt.Errorf("starting %s: %w", nd.id, err)
	}
	nd.p = p
	return nil
}

// startAll starts nodes and waits until each serves. A node that cannot
// bind its ports yet (in use a moment longer after a kill) is started
// again, a few times.
func (c *cluster) startAll(nodes []*node) error {
	var errs []error
	for _, nd := range nodes {
		errs = append(errs, c.start(nd))
	}
	for _, nd := range nodes {
		for attempt := 1; ; attempt++ {
			err := c.waitReady(nd, 30*time.Second)
			if err == nil || attempt == 5 || !strings.Contains(nd.p.stderr(), "address already in use") {
				errs = append(errs, err)
				break
			}
			if err := testutil.PollUntil(10*time.Second, func() (bool, error) { return canBind(nd.addr) && canBind(nd.peer), nil }); err != nil {
				errs = append(errs, fmt.Errorf("%s: ports still in use: %w", nd.id, err))
				break
			}
			if err := c.start(nd); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return errors.Join(errs...)
}

// canBind reports whether addr can be listened on now.
func canBind(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// waitReady waits for nd's ready line (it prints it once it knows a
// leader).
func (c *cluster) waitReady(nd *node, d time.Duration) error {
	want := "tenure: serving on " + nd.addr
	return testutil.PollUntil(d, func() (bool, error) {
		if nd.p.exited() {
			return false, fmt.Errorf("%s exited with %d: %s", nd.id, nd.p.status, tail(nd.p.stderr(), 20))
		}
		return strings.HasPrefix(nd.p.stdout(), want), nil
	})
}

// kill sends SIGKILL to nd and waits for it to be gone.
func (c *cluster) kill(nd *node) error {
	if nd.p == nil || nd.p.exited() {
		return nil
	}
	nd.p.signal(syscall.SIGKILL)
	if !nd.p.waitExit(10 * time.Second) {
		return fmt.Errorf("%s survived SIGKILL for 10s", nd.id)
	}
	nd.lastErr = nd.p.stderr()
	return nil
}

func (c *cluster) alive(nd *node) bool { return nd.p != nil && !nd.p.exited() }

// statusOf asks nd alone for its view (node id, leader id, term).
func (c *cluster) statusOf(nd *node) (self, leader string, term uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	st, err := nd.status.Status(ctx)
	if err != nil {
		return "", "", 0, err
	}
	return st.GetNode(), st.GetLeader(), st.GetTerm(), nil
}

// leader returns a live node that says it leads, among candidates (nil: all
// nodes); if several do (an isolated leader that has not stepped down yet)
// the one with the highest term wins.
func (c *cluster) leader(candidates []*node) *node {
	if candidates == nil {
		candidates = c.nodes
	}
	var best *node
	var bestTerm uint64
	for _, nd := range candidates {
		if !c.alive(nd) {
			continue
		}
		self, leader, term, err := c.statusOf(nd)
		if err == nil && self == leader && (best == nil || term > bestTerm) {
			best, bestTerm = nd, term
		}
	}
	return best
}

// waitLeader polls until one of candidates says it leads.
func (c *cluster) waitLeader(candidates []*node, d time.Duration) (*node, error) {
	var l *node
	err := testutil.PollUntil(d, func() (bool, error) {
		l = c.leader(candidates)
		return l != nil, nil
	})
	return l, err
}

// others is every node but nd.
func (c *cluster) others(nd *node) []*node {
	var out []*node
	for _, o := range c.nodes {
		if o != nd {
			out = append(out, o)
		}
	}
	return out
}

// waitHealthy polls until a linearizable read succeeds through the
// client endpoints and every live node knows a leader.
func (c *cluster) waitHealthy(d time.Duration) error {
	var last error
	err := testutil.PollUntil(d, func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.admin.FencedGet(ctx, "nemesis-probe")
		cancel()
		if err != nil {
			last = err
			return false, nil
		}
		for _, nd := range c.nodes {
			if !c.alive(nd) {
				continue
			}
			if _, leader, _, err := c.statusOf(nd); err != nil || leader == "" {
				last = fmt.Errorf("%s knows no leader (%v)", nd.id, err)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return err
}

// isolate cuts nd from every other node in both directions.
func (c *cluster) isolate(nd *node) {
	for _, o := range c.others(nd) {
		c.links[[2]int{nd.i, o.i}].Block()
		c.links[[2]int{o.i, nd.i}].Block()
	}
}

// heal unblocks every link.
func (c *cluster) heal() {
	for _, l := range c.links {
		l.Unblock()
	}
}
