//go:build !linux

package zkcompat

import "syscall"

// procAttr puts a started process in a group of its own.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
