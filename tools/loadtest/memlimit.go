package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A memory limit on PostgreSQL (-pg-memory): the server, its backends and
// the page cache they read through are held in one memory cgroup, so that
// a key table a few times the limit is "past memory" without a disk of
// fifty million keys. The kernel charges a page of the page cache to the
// cgroup of the process that first reads or writes it, and reclaims the
// group's own pages when it reaches its limit: what PostgreSQL reads from
// its files stays cached only within the limit, as on a server whose
// memory is that small. The limit counts shared_buffers too (the shared
// memory is charged to the group of the process that first touches it),
// so the operating system's cache for the data files is the limit less
// shared_buffers and the backends' own memory.
//
// Both cgroup versions are supported: version 1's memory controller
// (memory.limit_in_bytes, memory.max_usage_in_bytes) and version 2's
// (memory.max, memory.peak), in a child of the group this process runs in.
// Moving a process needs write access to the group's cgroup.procs: root,
// or a delegated group.

// memoryGroup is the cgroup PostgreSQL runs in.
type memoryGroup struct {
	dir   string
	v2    bool
	limit int64
}

// newMemoryGroup creates a memory cgroup named name, limited to limit
// bytes, beside nothing else: a child of this process's own group.
func newMemoryGroup(name string, limit int64) (*memoryGroup, error) {
	parent, v2, err := ownMemoryGroup()
	if err != nil {
		return nil, fmt.Errorf("-pg-memory needs a memory cgroup this process can create groups under: %w", err)
	}
	g := &memoryGroup{dir: filepath.Join(parent, name), v2: v2, limit: limit}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("-pg-memory: %w", err)
	}
	file := "memory.limit_in_bytes"
	if v2 {
		file = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(g.dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		_ = os.Remove(g.dir)
		return nil, fmt.Errorf("-pg-memory: set %s: %w", file, err)
	}
	return g, nil
}

// ownMemoryGroup finds the directory of this process's memory cgroup:
// version 1's memory hierarchy if mounted, else the unified hierarchy if
// it offers the memory controller.
func ownMemoryGroup() (dir string, v2 bool, err error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	var unified string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path (cgroups(7))
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				return filepath.Join("/sys/fs/cgroup/memory", parts[2]), false, nil
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = parts[2]
		}
	}
	if err := sc.Err(); err != nil {
		return "", false, err
	}
	controllers, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil || !strings.Contains(" "+strings.TrimSpace(string(controllers))+" ", " memory ") {
		return "", false, errors.New("no cgroup v1 memory hierarchy and no memory controller in /sys/fs/cgroup (cgroup v2)")
	}
	return filepath.Join("/sys/fs/cgroup", unified), true, nil
}

// join moves pid and its children into the group. Their children forked
// later (every new backend) are born in it.
func (g *memoryGroup) join(pid int) error {
	children, err := childPids(pid)
	if err != nil {
		return err
	}
	procs := filepath.Join(g.dir, "cgroup.procs")
	for _, p := range append([]int{pid}, children...) {
		err := os.WriteFile(procs, []byte(strconv.Itoa(p)), 0o644)
		if errors.Is(err, syscall.ESRCH) && p != pid {
			continue // a child that has exited since it was listed
		}
		if err != nil {
			return fmt.Errorf("-pg-memory: move process %d into %s: %w", p, g.dir, err)
		}
	}
	return nil
}

// usage is the group's memory now and at its peak, in bytes.
func (g *memoryGroup) usage() (now, peak int64, err error) {
	nowFile, peakFile := "memory.usage_in_bytes", "memory.max_usage_in_bytes"
	if g.v2 {
		nowFile, peakFile = "memory.current", "memory.peak"
	}
	if now, err = readInt(filepath.Join(g.dir, nowFile)); err != nil {
		return 0, 0, err
	}
	peak, err = readInt(filepath.Join(g.dir, peakFile))
	return now, peak, err
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// remove deletes the group once PostgreSQL has exited.
func (g *memoryGroup) remove() error {
	return os.Remove(g.dir)
}

// parseBytes reads a size such as 1GiB, 512MiB or 1073741824.
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}, {"", 1}}
	for _, u := range units {
		num, ok := strings.CutSuffix(s, u.suffix)
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%q: want a positive size such as 1GiB, 512MiB or a number of bytes", s)
		}
		return n * u.mult, nil
	}
	return 0, fmt.Errorf("%q: want a size such as 1GiB", s)
}
