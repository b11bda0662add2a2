package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The namespace driver puts sandbox cgroups in <the node's own cgroup>/<base>/
// and a node sweeps every group it finds below its base when it starts. A
// benchmark run first moves this process into a cgroup of its own (a
// "scope"), so that whatever base the server picks, the run's groups are
// private to it: nothing another server on the host does can touch them and
// the run cannot touch anyone else's, its cleanup can sweep everything below
// the scope, and the idle-memory measurement can read exactly what the run's
// sandboxes are charged.
// scopeControllers are the v1 hierarchies the driver uses (plus cgroup v2).
var scopeControllers = []string{"memory", "cpu", "pids", "freezer"}

// cgMount is one cgroup hierarchy as this process sees it.
type cgMount struct {
	point string   // mount point
	root  string   // root of the mount within the hierarchy
	v2    bool     // cgroup2
	ctls  []string // v1 super options that name controllers (or name=)
}

// cgPlace is this process's cgroup directory in one hierarchy.
type cgPlace struct {
	dir  string // <mount>/<own path>
	ctls []string
}

// parseCgroupMounts returns the cgroup mounts in a mountinfo table.
func parseCgroupMounts(mountinfo []byte) []cgMount {
	var out []cgMount
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 6 || len(f) < sep+4 {
			continue
		}
		fstype, super := f[sep+1], f[sep+3]
		m := cgMount{point: unescapeOctal(f[4]), root: unescapeOctal(f[3])}
		switch fstype {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			for _, o := range strings.Split(super, ",") {
				if (o != "rw" && o != "ro" && !strings.Contains(o, "=")) || strings.HasPrefix(o, "name=") {
					m.ctls = append(m.ctls, o)
				}
			}
		default:
			continue
		}
		out = append(out, m)
	}
	return out
}

func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownPlaces pairs /proc/self/cgroup with the mounts: where this process sits
// in every mounted hierarchy the driver uses.
func ownPlaces(mountinfo, procCgroup []byte) []cgPlace {
	mounts := parseCgroupMounts(mountinfo)
	var out []cgPlace
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(procCgroup)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		ctls, path := parts[1], parts[2]
		var want []string
		if ctls != "" {
			for _, c := range strings.Split(ctls, ",") {
				for _, w := range scopeControllers {
					if c == w {
						want = append(want, c)
					}
				}
			}
			if len(want) == 0 {
				continue
			}
		}
		for _, m := range mounts {
			if m.v2 != (ctls == "") {
				continue
			}
			if !m.v2 && !containsAll(m.ctls, strings.Split(ctls, ",")) {
				continue
			}
			rel := path
			if m.root != "/" {
				r, ok := strings.CutPrefix(path, m.root)
				if !ok {
					continue
				}
				rel = r
			}
			dir := filepath.Join(m.point, rel)
			if !seen[dir] {
				seen[dir] = true
				out = append(out, cgPlace{dir: dir, ctls: want})
			}
			break
		}
	}
	return out
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// cgroupScope is a private cgroup this process moved into.
type cgroupScope struct {
	name    string
	parents []string  // the process's cgroups before the move
	dirs    []cgPlace // the scope's dirs, one per hierarchy (same order)
}

// enterCgroupScope makes <own>/name in every hierarchy the driver uses and
// moves the whole process (all threads) into it.
func enterCgroupScope(name string) (_ *cgroupScope, err error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup scope: %w", err)
	}
	pc, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup scope: %w", err)
	}
	places := ownPlaces(mi, pc)
	if len(places) == 0 {
		return nil, errors.New("cgroup scope: no cgroup hierarchy found")
	}
	s := &cgroupScope{name: name}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	pid := []byte(strconv.Itoa(os.Getpid()))
	for _, p := range places {
		dir := filepath.Join(p.dir, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup scope: %w", err)
		}
		s.parents = append(s.parents, p.dir)
		s.dirs = append(s.dirs, cgPlace{dir: dir, ctls: p.ctls})
		// A new cpuset group starts empty and cannot hold tasks.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(p.dir, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), v, 0); err != nil {
					return nil, fmt.Errorf("cgroup scope: %w", err)
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
			return nil, fmt.Errorf("cgroup scope: move into %s: %w", dir, err)
		}
	}
	return s, nil
}

// Close moves the process back and removes the scope's dirs, including the
// driver's (empty) base dir below them. A dir that still holds a group
// (a sandbox that was not cleaned up) is an error.
func (s *cgroupScope) Close() error {
	if s == nil {
		return nil
	}
	var errs []error
	pid := []byte(strconv.Itoa(os.Getpid()))
	for i, d := range s.dirs {
		if err := os.WriteFile(filepath.Join(s.parents[i], "cgroup.procs"), pid, 0); err != nil {
			errs = append(errs, fmt.Errorf("cgroup scope: move back to %s: %w", s.parents[i], err))
			continue
		}
		if err := rmdirTree(d.dir); err != nil {
			errs = append(errs, err)
		}
	}
	s.dirs, s.parents = nil, nil
	return errors.Join(errs...)
}

// rmdirTree removes an (empty of tasks) cgroup dir and its sub-groups,
// deepest first. cgroup dirs hold only control files, which rmdir ignores.
func rmdirTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cgroup scope: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			if err := rmdirTree(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := rmdirWhenEmpty(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// busyWait bounds how long rmdirWhenEmpty waits for a group's last tasks:
// processes the run started (the fork helper, a sandbox's last process)
// leave their cgroup only when they are reaped, which can come just after
// the run's close returns (CI: EBUSY on every hierarchy of the scope).
const busyWait = 5 * time.Second

// rmdirWhenEmpty removes a cgroup dir, waiting up to busyWait while it
// still holds tasks; the error then names them.
func rmdirWhenEmpty(dir string) error {
	deadline := time.Now().Add(busyWait)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			return fmt.Errorf("cgroup scope: remove %s (tasks: %q): %w", dir, strings.Fields(string(procs)), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// memoryDir returns the scope's directory in the v1 memory hierarchy, or ""
// (for the idle-memory cross-check).
func (s *cgroupScope) memoryDir() string {
	for _, p := range s.dirs {
		for _, c := range p.ctls {
			if c == "memory" {
				return p.dir
			}
		}
	}
	return ""
}

// bases lists the dirs below the scope (the driver's cgroup base dirs).
func (s *cgroupScope) bases() []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, p := range s.dirs {
		ents, err := os.ReadDir(p.dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(out, e.Name()) {
				out = append(out, e.Name())
			}
		}
	}
	return out
}
