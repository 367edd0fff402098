package etcdcompat

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bin holds the binaries TestMain builds: tenure from the main module,
// etcdctl from this module's pinned etcd, and etcd's server from
// bench/etcd (the same pinned version).
var bin string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "tenure-etcdcompat-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	for _, b := range []struct{ dir, pkg, out string }{
		{"../..", "./cmd/tenure", "tenure"},
		{".", "go.etcd.io/etcd/etcdctl/v3", "etcdctl"},
		{"../../bench/etcd", "./cmd/etcd-server", "etcd-server"}, // the differential test's etcd
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir, cmd.Stdout, cmd.Stderr = b.dir, os.Stderr, os.Stderr
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n", b.pkg, err)
			return 1
		}
	}
	bin = dir
	return m.Run()
}

// proc is a process the test started, in a process group of its own, with
// its output in files; it is killed (the whole group) when the test ends.
type proc struct {
	cmd        *exec.Cmd
	out, errF  string
	done       chan struct{}
	exitStatus int
}

func startProc(t *testing.T, stdin string, name string, args ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	p := &proc{out: filepath.Join(dir, "stdout"), errF: filepath.Join(dir, "stderr"), done: make(chan struct{})}
	stdout, err := os.Create(p.out)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(p.errF)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	p.cmd = exec.Command(name, args...)
	p.cmd.Stdout, p.cmd.Stderr = stdout, stderr
	if stdin != "" {
		p.cmd.Stdin = strings.NewReader(stdin)
	}
	p.cmd.SysProcAttr = procAttr()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.exitStatus = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
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

// tenure is a running `tenure serve` with its etcd API on.
type tenure struct {
	p      *proc
	Etcd   string // the etcd API's address
	Listen string // Tenure's own API
}

// serveOutput is serve's -o json ready line.
type serveOutput struct {
	Serving string `json:"serving"`
	Etcd    string `json:"etcd"`
}

func startTenure(t *testing.T, extra ...string) *tenure {
	t.Helper()
	args := append([]string{"serve", "-o", "json", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--http-listen", "", "--etcd-listen", "127.0.0.1:0"}, extra...)
	p := startProc(t, "", filepath.Join(bin, "tenure"), args...)
	var out serveOutput
	waitFor(t, 30*time.Second, "tenure serve's ready line", func() bool {
		select {
		case <-p.done:
			t.Fatalf("tenure serve exited: %s", p.stderr())
		default:
		}
		line, _, _ := strings.Cut(p.stdout(), "\n")
		return json.Unmarshal([]byte(line), &out) == nil && out.Etcd != ""
	})
	return &tenure{p: p, Etcd: out.Etcd, Listen: out.Serving}
}

// etcdctl runs etcdctl against endpoints and returns its stdout; it fails
// the test if etcdctl fails.
func etcdctl(t *testing.T, endpoints string, stdin string, args ...string) string {
	t.Helper()
	out, errOut, err := etcdctlRun(endpoints, stdin, args...)
	if err != nil {
		t.Fatalf("etcdctl %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out, errOut)
	}
	return out
}

func etcdctlRun(endpoints string, stdin string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "etcdctl"), append([]string{"--endpoints", endpoints, "--dial-timeout", "5s"}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// etcdctlProc starts a long-running etcdctl (watch, lock, elect).
func etcdctlProc(t *testing.T, endpoints string, stdin string, args ...string) *proc {
	t.Helper()
	return startProc(t, stdin, filepath.Join(bin, "etcdctl"), append([]string{"--endpoints", endpoints, "--dial-timeout", "5s"}, args...)...)
}

// lines splits output into its non-empty lines.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}
