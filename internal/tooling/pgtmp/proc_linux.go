package pgtmp

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// sysProcAttr runs a child as a, in its own process group, and has the
// kernel send it deathSig when its parent dies.
func sysProcAttr(a *account, deathSig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		// Own process group: a terminal's Ctrl-C goes to the foreground
		// group and must not reach the server before we stop it.
		Setpgid: true,
		// When the parent dies (a test binary killed on timeout, a crashed
		// service) the child must not linger.
		Pdeathsig:  deathSig,
		Credential: a.credential(),
	}
}

// groupAlive reports whether process group pgid still has a process that
// is not a zombie. Zombies count as gone: they hold no sockets or files,
// and where init does not reap orphans (some containers) they never leave.
func groupAlive(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	want := strconv.Itoa(pgid)
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces and
		// parentheses, so the fields are counted from the last ')'.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) >= 3 && fields[0] != "Z" && fields[2] == want {
			return true
		}
	}
	return false
}
