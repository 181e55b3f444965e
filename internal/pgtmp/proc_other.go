//go:build unix && !linux

package pgtmp

import "syscall"

func sysProcAttr(a *account) *syscall.SysProcAttr {
	// Own process group: a terminal's Ctrl-C goes to the foreground group
	// and must not reach the server before we stop it. There is no
	// parent-death signal outside Linux.
	return &syscall.SysProcAttr{Setpgid: true, Credential: a.credential()}
}
