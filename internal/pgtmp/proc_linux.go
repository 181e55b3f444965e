package pgtmp

import "syscall"

func sysProcAttr(a *account) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		// Own process group: a terminal's Ctrl-C goes to the foreground
		// group and must not reach the server before we stop it.
		Setpgid: true,
		// When the parent dies (a test binary killed on timeout, a crashed
		// service) the server must not linger. SIGINT is PostgreSQL's fast
		// shutdown; SIGTERM would wait for every client to disconnect, and a
		// developer's open psql session would keep the server alive.
		Pdeathsig:  syscall.SIGINT,
		Credential: a.credential(),
	}
}
