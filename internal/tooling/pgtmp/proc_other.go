//go:build unix && !linux

package pgtmp

import "syscall"

// sysProcAttr runs a child as a in its own process group: a terminal's
// Ctrl-C goes to the foreground group and must not reach the server
// before we stop it. There is no parent-death signal outside Linux, so
// deathSig is unused.
func sysProcAttr(a *account, deathSig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: a.credential()}
}

// groupAlive reports whether process group pgid still has a process.
func groupAlive(pgid int) bool {
	return syscall.Kill(-pgid, 0) == nil
}
