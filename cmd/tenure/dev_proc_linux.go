package main

import "syscall"

// childProcAttr puts a replica child in its own process group, so a Ctrl-C
// in the terminal reaches only the dev process, which then stops the
// children in order; and asks the kernel to SIGKILL the child if the dev
// process dies without cleaning up, so no replica outlives it.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
