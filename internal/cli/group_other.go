//go:build unix && !linux

package cli

import "syscall"

// groupAlive reports whether a process of group pgid still exists.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || err == syscall.EPERM
}

// setDeathSignal does nothing here: only Linux and FreeBSD have a death
// signal, and this build covers other systems too.
func setDeathSignal(*syscall.SysProcAttr) {}
