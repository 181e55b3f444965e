package pgtmp

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// account is the unprivileged user the server runs as when we are root.
// A nil *account means "run as ourselves".
type account struct {
	name     string
	uid, gid uint32
}

// serverAccount picks the user to run initdb and postgres as. Both refuse
// to run as root, so root needs someone else: the owner of an existing
// cluster (postgres refuses a data directory owned by anyone else), else
// user postgres, else nobody.
func serverAccount(dir string) (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	if initialized(dir) {
		if fi, err := os.Stat(dir); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
				return &account{name: "uid " + strconv.FormatUint(uint64(st.Uid), 10), uid: st.Uid, gid: st.Gid}, nil
			}
		}
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &account{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
	}
	return nil, errors.New("pgtmp: running as root, and neither user postgres nor nobody exists to run PostgreSQL as (it refuses to run as root)")
}

func (a *account) credential() *syscall.Credential {
	if a == nil {
		return nil
	}
	return &syscall.Credential{Uid: a.uid, Gid: a.gid}
}

func (a *account) chown(path string) error {
	if a == nil {
		return nil
	}
	if err := os.Chown(path, int(a.uid), int(a.gid)); err != nil {
		return fmt.Errorf("pgtmp: give %s to %s: %w", path, a.name, err)
	}
	return nil
}

// checkReachable fails early, with a remedy, when a parent of dir is not
// searchable by the account; otherwise initdb or postgres would fail later
// with a bare "Permission denied". Supplementary groups and ACLs are not
// considered, which errs on the side of a false alarm only for exotic
// setups.
func (a *account) checkReachable(dir string) error {
	if a == nil {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("pgtmp: %w", err)
		}
		perm := fi.Mode().Perm()
		ok := perm&0o001 != 0
		if st, isUnix := fi.Sys().(*syscall.Stat_t); isUnix {
			ok = ok || (st.Uid == a.uid && perm&0o100 != 0) || (st.Gid == a.gid && perm&0o010 != 0)
		}
		if !ok {
			return fmt.Errorf("pgtmp: PostgreSQL refuses to run as root and runs as %s here, who cannot reach %s: "+
				"parent directory %s is not searchable; use a data directory under /tmp or run `chmod o+x %s`", a.name, dir, d, d)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
