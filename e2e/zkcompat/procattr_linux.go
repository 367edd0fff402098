package zkcompat

import "syscall"

// procAttr puts a started process in a group of its own, killed when the
// test binary dies (a test that panics on its timeout leaves none behind).
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
