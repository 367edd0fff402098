//go:build !linux

package etcdcompat

import "syscall"

// procAttr puts a started process in a group of its own.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
