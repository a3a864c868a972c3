package main

import "syscall"

// childProcAttr: Windows has no process groups or parent-death signal to
// ask for; the dev process stops its children itself.
func childProcAttr() *syscall.SysProcAttr { return nil }
