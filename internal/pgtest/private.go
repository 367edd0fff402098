package pgtest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Instance is a private PostgreSQL server that one test owns: its own data
// directory, socket directory and loopback port. Only the test that
// started it stops or restarts it. PostgreSQL refuses to run as root, so
// when the test runs as root the server runs as the "postgres" user.
type Instance struct {
	bin  string // directory of initdb, pg_ctl
	dir  string // data, socket, log
	port int
	// runAs is the user the server runs as ("" = the test's own user).
	runAs   string
	running bool
}

// StartPrivate initialises and starts a private instance; it is stopped
// and deleted when the test ends.
func StartPrivate(t testing.TB) *Instance {
	t.Helper()
	SkipShort(t)
	bin, err := binDir()
	if err != nil {
		t.Fatalf("%v\nInstall PostgreSQL (Debian: apt-get install -y postgresql; .ci/run does it) to run this test.", err)
	}
	in := &Instance{bin: bin}
	if os.Geteuid() == 0 {
		in.runAs = "postgres"
	}
	// Not t.TempDir: the server's user must be able to enter it.
	dir, err := os.MkdirTemp("", "pgguard-")
	if err != nil {
		t.Fatal(err)
	}
	in.dir = dir
	t.Cleanup(func() {
		if in.running {
			out, err := in.command(filepath.Join(in.bin, "pg_ctl"), "-D", in.dataDir(), "stop", "-m", "immediate", "-w").CombinedOutput()
			if err != nil {
				t.Errorf("stop private PostgreSQL: %v: %s", err, out)
			}
		}
		os.RemoveAll(dir)
	})
	if in.runAs != "" {
		u, err := user.Lookup(in.runAs)
		if err != nil {
			t.Fatalf("the test runs as root and PostgreSQL refuses to, but there is no %q user to run it as: %v", in.runAs, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	in.run(t, filepath.Join(bin, "initdb"), "-D", in.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	// A free port can be taken between our probe and the server's bind:
	// try a few.
	for attempt := 1; ; attempt++ {
		in.port = freePort(t)
		err := in.tryStart()
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatalf("start private PostgreSQL: %v\n%s", err, in.log())
		}
	}
	return in
}

// Config returns a connection config for the instance.
func (in *Instance) Config(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	return ParseConfig(t, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", in.port))
}

// Stop stops the server: mode "fast" is a clean shutdown, "immediate" is a
// crash (no checkpoint; the next start replays the WAL).
func (in *Instance) Stop(t testing.TB, mode string) {
	t.Helper()
	in.pgctl(t, "stop", "-m", mode, "-w", "-t", "60")
	in.running = false
}

// Start starts the stopped server again on the same port and directory.
func (in *Instance) Start(t testing.TB) {
	t.Helper()
	if err := in.tryStart(); err != nil {
		t.Fatalf("restart private PostgreSQL: %v\n%s", err, in.log())
	}
}

func (in *Instance) dataDir() string { return filepath.Join(in.dir, "data") }
func (in *Instance) logFile() string { return filepath.Join(in.dir, "server.log") }

func (in *Instance) tryStart() error {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=on", in.port, in.dir)
	out, err := in.command(filepath.Join(in.bin, "pg_ctl"), "-D", in.dataDir(), "-l", in.logFile(),
		"-w", "-t", "60", "-o", opts, "start").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	in.running = true
	return nil
}

func (in *Instance) pgctl(t testing.TB, args ...string) {
	t.Helper()
	in.run(t, filepath.Join(in.bin, "pg_ctl"), append([]string{"-D", in.dataDir()}, args...)...)
}

func (in *Instance) run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := in.command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s\n%s", filepath.Base(name), strings.Join(args, " "), err, out, in.log())
	}
}

func (in *Instance) command(name string, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if in.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", in.runAs, "--", name}, args...)...)
	} else {
		cmd = exec.Command(name, args...)
	}
	cmd.Dir = in.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

func (in *Instance) log() string {
	b, err := os.ReadFile(in.logFile())
	if err != nil {
		return ""
	}
	return "server log:\n" + string(b)
}

// binDir finds the PostgreSQL server binaries: pg_config --bindir, then the
// newest /usr/lib/postgresql/*/bin (Debian), then initdb on PATH.
func binDir() (string, error) {
	has := func(dir string) bool {
		_, err := os.Stat(filepath.Join(dir, "initdb"))
		return err == nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := string(bytes.TrimSpace(out)); has(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("no PostgreSQL server binaries found (tried pg_config --bindir, /usr/lib/postgresql/*/bin, initdb on PATH)")
}

// version extracts N from /usr/lib/postgresql/N/bin.
func version(dir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
	return v
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
