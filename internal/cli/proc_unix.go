//go:build unix

package cli

import (
	"io"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// child is a command run under a lock.
//
// When tenure's stdin is the terminal and tenure is in the terminal's
// foreground process group, the child stays in tenure's process group so
// that job control (Ctrl-C, Ctrl-Z, fg) works as for any command; signals
// then go to the child process alone. Otherwise the child leads a process
// group of its own and every signal goes to the whole group, so that the
// processes a shell script started are stopped with it.
//
// On Linux the child is killed (SIGKILL) if tenure dies first, even by
// kill -9 (PR_SET_PDEATHSIG), so it never runs on without the lock; the
// processes it started itself are not covered (a script that must not
// outlive it should exec its last command, or trap). Elsewhere a child
// whose tenure died is re-parented and runs on.
type child struct {
	cmd   *exec.Cmd
	group bool
	done  chan error // receives cmd.Wait's result once the child exited
}

func startChild(argv, env []string, s Streams) (*child, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.In, s.Out, s.Err
	c := &child{cmd: cmd, group: !inForeground(s.In), done: make(chan error, 1)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: c.group}
	setDeathSignal(cmd.SysProcAttr)
	started := make(chan error, 1)
	go func() {
		// The death signal is tied to the thread that forked the child:
		// keep that thread until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		c.done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return c, nil
}

// signal sends sig to the child (or its process group). Errors are
// ignored: the target may already be gone.
func (c *child) signal(sig syscall.Signal) {
	pid := c.cmd.Process.Pid
	if c.group {
		_ = syscall.Kill(-pid, sig)
		return
	}
	_ = c.cmd.Process.Signal(sig)
}

// stop asks the child to stop: SIGTERM, then SIGCONT so that a stopped
// child gets to act on it.
func (c *child) stop() {
	c.signal(syscall.SIGTERM)
	c.signal(syscall.SIGCONT)
}

// reapGroup waits, after the child itself exited, until no process of its
// group is left or until deadline, then kills whatever is left.
func (c *child) reapGroup(deadline time.Time) {
	if !c.group {
		return
	}
	for groupAlive(c.cmd.Process.Pid) {
		if !time.Now().Before(deadline) {
			c.signal(syscall.SIGKILL)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exitStatus is the shell-style status of a finished child: its exit code,
// or 128+N when signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return ExitError
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// inForeground reports whether in is a terminal whose foreground process
// group is ours.
func inForeground(in io.Reader) bool {
	f, ok := in.(*os.File)
	if !ok {
		return false
	}
	pgrp, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCGPGRP)
	return err == nil && pgrp == syscall.Getpgrp()
}

// signalNumber is the number of a signal received through os/signal.
func signalNumber(s os.Signal) syscall.Signal {
	if n, ok := s.(syscall.Signal); ok {
		return n
	}
	return syscall.SIGTERM
}
