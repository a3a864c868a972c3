//go:build !linux && !windows

package main

import "syscall"

// childProcAttr puts a replica child in its own process group, so a Ctrl-C
// in the terminal reaches only the dev process, which then stops the
// children in order. (Only Linux can also tie the child's life to ours.)
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
