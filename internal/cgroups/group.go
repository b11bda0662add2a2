package cgroups

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Limits of one group. Zero or negative means unlimited.
type Limits struct {
	MemoryBytes int64 // RAM; swap is not allowed on top of it
	CPUMillis   int64 // thousandths of a CPU
	Pids        int64
}

// Paths locates one sandbox's group in every hierarchy. It is kept in the
// sandbox's state file, so a restarted node finds the group even when the
// node itself now runs in a different cgroup.
type Paths struct {
	Dirs    []string `json:"dirs"`              // one per hierarchy
	Memory  string   `json:"memory,omitempty"`  // dir with the memory controller
	CPU     string   `json:"cpu,omitempty"`     // dir with the cpu controller
	Pids    string   `json:"pids,omitempty"`    // dir with the pids controller
	Freezer string   `json:"freezer,omitempty"` // v1 freezer dir
	Unified string   `json:"unified,omitempty"` // v2 dir (cgroup.kill, cgroup.freeze)
}

const cfsPeriod = 100000 // µs

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// Paths returns where the group of sandbox id lives (or would live) under
// this node's cgroups.
func (m *Manager) Paths(id string) Paths {
	var p Paths
	for _, h := range m.hier {
		dir := filepath.Join(h.base, id)
		p.Dirs = append(p.Dirs, dir)
		if h.v2 {
			p.Unified = dir
		}
		for _, c := range h.controllers {
			switch c {
			case "memory":
				p.Memory = dir
			case "cpu":
				p.CPU = dir
			case "pids":
				p.Pids = dir
			case "freezer":
				p.Freezer = dir
			}
		}
	}
	return p
}

// Validate checks that p, read back from disk, names the group of id and
// nothing else: every dir must be <cgroup mount>/.../space/<id>.
func (m *Manager) Validate(p Paths, id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("cgroups: invalid id %q", id)
	}
	if len(p.Dirs) == 0 {
		return errors.New("cgroups: no dirs")
	}
	for _, d := range p.Dirs {
		if d != filepath.Clean(d) || filepath.Base(d) != id || filepath.Base(filepath.Dir(d)) != m.base {
			return fmt.Errorf("cgroups: %q is not a group of %q", d, id)
		}
		if !slices.ContainsFunc(m.mounts, func(mp string) bool { return strings.HasPrefix(d, mp+"/") }) {
			return fmt.Errorf("cgroups: %q is not under a cgroup mount", d)
		}
	}
	for _, d := range []string{p.Memory, p.CPU, p.Pids, p.Freezer, p.Unified} {
		if d != "" && !slices.Contains(p.Dirs, d) {
			return fmt.Errorf("cgroups: %q is not one of the group's dirs", d)
		}
	}
	return nil
}

// ensureBase creates the space/ dirs and, on v2, delegates the controllers
// down to them. Done once per manager.
func (m *Manager) ensureBase() error {
	m.baseMu.Lock()
	defer m.baseMu.Unlock()
	if m.baseDone {
		return nil
	}
	if m.parent != "" {
		if err := m.makeParent(); err != nil {
			return err
		}
	}
	for _, h := range m.hier {
		if m.parent != "" {
			if err := mkGroup(h, h.base); err != nil {
				return err
			}
			if h.v2 && len(h.controllers) > 0 {
				if err := enable(h.base, h.controllers); err != nil {
					return err
				}
			}
			continue
		}
		if h.v2 && len(h.controllers) > 0 {
			// Parent first: a controller can only be enabled below a cgroup
			// that has it enabled itself.
			if err := enableOwn(filepath.Dir(h.base), h.controllers); err != nil {
				return err
			}
		}
		if err := os.Mkdir(h.base, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cgroups: %w", err)
		}
		if h.v2 && len(h.controllers) > 0 {
			if err := enable(h.base, h.controllers); err != nil {
				return err
			}
		}
	}
	m.baseDone = true
	return nil
}

// makeParent creates the fixed parent (NewUnder) and the dirs above it in
// every hierarchy, and on v2 enables the controllers from the root down to
// the parent (ensureBase enables them in the base).
func (m *Manager) makeParent() error {
	for _, h := range m.hier {
		dir := h.top
		for _, el := range strings.Split(strings.Trim(h.rel, "/"), "/") {
			if el == "" {
				continue
			}
			if h.v2 && len(h.controllers) > 0 {
				if err := enable(dir, h.controllers); err != nil {
					return err
				}
			}
			dir = filepath.Join(dir, el)
			if err := mkGroup(h, dir); err != nil {
				return err
			}
		}
		if h.v2 && len(h.controllers) > 0 {
			if err := enable(dir, h.controllers); err != nil {
				return err
			}
		}
	}
	return nil
}

// mkGroup makes one group dir of h (an existing one is fine), giving a new
// v1 cpuset group its parent's CPUs and memory nodes: it starts with none,
// and a process cannot join it before it has some.
func mkGroup(h hierarchy, dir string) error {
	err := os.Mkdir(dir, 0o755)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	if h.cpuset {
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
			if err != nil {
				return fmt.Errorf("cgroups: %w", err)
			}
			if err := write(filepath.Join(dir, f), strings.TrimSpace(string(v))); err != nil {
				return err
			}
		}
	}
	return nil
}

// ProcsLeaf is the child cgroup that the node's own processes move to on
// cgroup v2, so that its cgroup may delegate controllers (v2's "no internal
// processes" rule). A node started in it treats its parent as its own
// cgroup, so restarts don't nest leaves.
const ProcsLeaf = "space-procs"

// enableOwn enables controllers in the node's own cgroup. The kernel refuses
// (EBUSY) while that cgroup holds processes, which is the normal case for a
// systemd service with Delegate=yes or a container with its own cgroup
// namespace: the processes then move to a leaf child and the write is
// retried.
func enableOwn(dir string, ctls []string) error {
	err := enable(dir, ctls)
	if err == nil || !errors.Is(err, unix.EBUSY) {
		return err
	}
	if err := evacuate(dir, filepath.Join(dir, ProcsLeaf)); err != nil {
		return fmt.Errorf("cgroups: %s holds processes, so it cannot delegate controllers, and moving them to a leaf failed: %w", dir, err)
	}
	return enable(dir, ctls)
}

// evacuate moves every process of cgroup dir into leaf. Processes forked
// meanwhile land in dir, so it repeats until dir is empty.
func evacuate(dir, leaf string) error {
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("cgroups: %w", err)
	}
	for range 20 {
		data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			return fmt.Errorf("cgroups: %w", err)
		}
		pids := strings.Fields(string(data))
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := write(filepath.Join(leaf, "cgroup.procs"), pid); err != nil && !errors.Is(err, unix.ESRCH) {
				return err
			}
		}
	}
	return fmt.Errorf("cgroups: %s still holds processes after 20 passes", dir)
}

func enable(dir string, ctls []string) error {
	cur, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	have := strings.Fields(string(cur))
	var add []string
	for _, c := range ctls {
		if !slices.Contains(have, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return write(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(add, " "))
}

// Create makes the group of sandbox id in every hierarchy. An existing group
// of that id (a leftover) is reused.
func (m *Manager) Create(id string) (*Group, error) {
	if !idRE.MatchString(id) {
		return nil, fmt.Errorf("cgroups: invalid id %q", id)
	}
	if err := m.ensureBase(); err != nil {
		return nil, err
	}
	p := m.Paths(id)
	for i, dir := range p.Dirs {
		if err := mkGroup(m.hier[i], dir); err != nil {
			for _, d := range p.Dirs[:i] {
				_ = unix.Rmdir(d)
			}
			return nil, fmt.Errorf("cgroups: create: %w", err)
		}
	}
	return &Group{p: p}, nil
}

// RemoveBase removes the base dirs if they are empty (for tests and
// uninstall); non-empty ones are left alone.
func (m *Manager) RemoveBase() {
	for _, h := range m.hier {
		_ = unix.Rmdir(h.base)
	}
	m.baseMu.Lock()
	m.baseDone = false
	m.baseMu.Unlock()
}

// Open returns a handle on an existing group (from Paths or a state file).
func (m *Manager) Open(p Paths) *Group { return &Group{p: p} }

// List returns the ids of every group under the node's space/ dirs.
func (m *Manager) List() ([]string, error) {
	var ids []string
	for _, h := range m.hier {
		ents, err := os.ReadDir(h.base)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cgroups: %w", err)
		}
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(ids, e.Name()) {
				ids = append(ids, e.Name())
			}
		}
	}
	return ids, nil
}

// Group is one sandbox's cgroup.
type Group struct {
	p Paths

	// oom is the memory controller's file with the OOM-kill count, kept
	// open: the node reads it at every command's start, and opening a
	// cgroup file each time was 8 % of the server's CPU in an exec loop.
	oomMu  sync.Mutex
	oom    *os.File
	oomBuf []byte
}

// Paths returns where the group lives.
func (g *Group) Paths() Paths { return g.p }

// SetLimits applies l.
func (g *Group) SetLimits(l Limits) error {
	var errs []error
	if d := g.p.Memory; d != "" {
		if d == g.p.Unified {
			errs = append(errs, setV2Memory(d, l.MemoryBytes))
		} else {
			errs = append(errs, setV1Memory(d, l.MemoryBytes))
		}
	} else if l.MemoryBytes > 0 {
		errs = append(errs, errors.New("cgroups: no memory controller"))
	}
	if d := g.p.CPU; d != "" {
		quota := l.CPUMillis * cfsPeriod / 1000
		if l.CPUMillis > 0 && quota < 1000 {
			quota = 1000 // the kernel's minimum
		}
		if d == g.p.Unified {
			v := "max " + strconv.Itoa(cfsPeriod)
			if l.CPUMillis > 0 {
				v = fmt.Sprintf("%d %d", quota, cfsPeriod)
			}
			errs = append(errs, write(filepath.Join(d, "cpu.max"), v))
		} else {
			if l.CPUMillis <= 0 {
				quota = -1
			}
			errs = append(errs,
				write(filepath.Join(d, "cpu.cfs_period_us"), strconv.Itoa(cfsPeriod)),
				write(filepath.Join(d, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)))
		}
	} else if l.CPUMillis > 0 {
		errs = append(errs, errors.New("cgroups: no cpu controller"))
	}
	if d := g.p.Pids; d != "" {
		errs = append(errs, write(filepath.Join(d, "pids.max"), maxOr(l.Pids, "max")))
	} else if l.Pids > 0 {
		errs = append(errs, errors.New("cgroups: no pids controller"))
	}
	return errors.Join(errs...)
}

func maxOr(v int64, unlimited string) string {
	if v <= 0 {
		return unlimited
	}
	return strconv.FormatInt(v, 10)
}

func setV2Memory(dir string, bytes int64) error {
	if err := write(filepath.Join(dir, "memory.max"), maxOr(bytes, "max")); err != nil {
		return err
	}
	// memory.swap.max is absent when swap accounting is off.
	if err := write(filepath.Join(dir, "memory.swap.max"), "0"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func setV1Memory(dir string, bytes int64) error {
	v := maxOr(bytes, "-1")
	limit := filepath.Join(dir, "memory.limit_in_bytes")
	memsw := filepath.Join(dir, "memory.memsw.limit_in_bytes")
	if _, err := os.Stat(memsw); err != nil {
		return write(limit, v) // no swap accounting on this host
	}
	// The kernel keeps memsw >= limit: shrinking must lower the limit
	// first, growing must raise memsw first. Try the first order and fall
	// back to the other.
	if err := write(limit, v); err != nil {
		if err2 := write(memsw, v); err2 != nil {
			return err
		}
		return write(limit, v)
	}
	return write(memsw, v)
}

// Attach moves process pid (all its threads) into the group.
func (g *Group) Attach(pid int) error {
	for _, d := range g.p.Dirs {
		if err := write(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("cgroups: attach %d: %w", pid, err)
		}
	}
	return nil
}

// OOMKills returns how many processes the OOM killer killed in the group.
func (g *Group) OOMKills() (uint64, error) {
	d := g.p.Memory
	if d == "" {
		return 0, errors.New("cgroups: no memory controller")
	}
	file := "memory.oom_control"
	if d == g.p.Unified {
		file = "memory.events"
	}
	g.oomMu.Lock()
	defer g.oomMu.Unlock()
	if g.oom == nil {
		f, err := os.Open(filepath.Join(d, file))
		if err != nil {
			return 0, fmt.Errorf("cgroups: %w", err)
		}
		g.oom, g.oomBuf = f, make([]byte, 4<<10)
	}
	// A read at offset 0 of a cgroup file makes its content afresh.
	n, err := g.oom.ReadAt(g.oomBuf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		g.closeOOMLocked() // opened again at the next call
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	return parseKeyed(g.oomBuf[:n], "oom_kill")
}

func (g *Group) closeOOMLocked() {
	if g.oom != nil {
		g.oom.Close()
		g.oom, g.oomBuf = nil, nil
	}
}

// parseKeyed finds "key value" in a flat-keyed cgroup file.
func parseKeyed(data []byte, key string) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroups: %s: %w", key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("cgroups: no %q entry", key)
}

// Procs lists the processes in the group (union over hierarchies).
func (g *Group) Procs() ([]int, error) {
	var pids []int
	for _, d := range g.p.Dirs {
		data, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cgroups: %w", err)
		}
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err == nil && !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}

// Kill SIGKILLs every process in the group and waits until it is empty or
// ctx ends.
func (g *Group) Kill(ctx context.Context) error {
	if g.p.Unified != "" {
		// cgroup.kill (Linux 5.14+) kills the whole subtree atomically, even
		// processes forking while we look.
		_ = write(filepath.Join(g.p.Unified, "cgroup.kill"), "1")
	}
	wait := 200 * time.Microsecond
	for {
		pids, err := g.Procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		if g.p.Freezer != "" {
			// A v1-frozen task handles no signal, SIGKILL included, until
			// thawed.
			_ = write(filepath.Join(g.p.Freezer, "freezer.state"), "THAWED")
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("cgroups: %d processes still in %s: %w", len(pids), g.p.Dirs[0], ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 10*time.Millisecond)
	}
}

// Remove deletes the group's dirs. A group that is already gone is fine;
// a busy one is retried until ctx ends.
func (g *Group) Remove(ctx context.Context) error {
	g.oomMu.Lock()
	g.closeOOMLocked()
	g.oomMu.Unlock()
	var errs []error
	for _, d := range g.p.Dirs {
		wait := 200 * time.Microsecond
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				errs = append(errs, fmt.Errorf("cgroups: remove %s: %w", d, err))
				break
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return errors.Join(append(errs, fmt.Errorf("cgroups: remove %s: %w (%w)", d, err, ctx.Err()))...)
			case <-t.C:
			}
			wait = min(2*wait, 10*time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// Destroy kills everything in the group and removes it.
func (g *Group) Destroy(ctx context.Context) error {
	if err := g.Kill(ctx); err != nil {
		return err
	}
	return g.Remove(ctx)
}

// Freeze stops every process in the group and waits until they are frozen.
func (g *Group) Freeze(ctx context.Context) error { return g.freeze(ctx, true) }

// Thaw resumes a frozen group.
func (g *Group) Thaw(ctx context.Context) error { return g.freeze(ctx, false) }

func (g *Group) freeze(ctx context.Context, on bool) error {
	var file, val, check string
	var done func([]byte) bool
	switch {
	case g.p.Unified != "" && exists(filepath.Join(g.p.Unified, "cgroup.freeze")):
		file, check = filepath.Join(g.p.Unified, "cgroup.freeze"), filepath.Join(g.p.Unified, "cgroup.events")
		val = map[bool]string{true: "1", false: "0"}[on]
		done = func(b []byte) bool {
			n, err := parseKeyed(b, "frozen")
			return err == nil && (n == 1) == on
		}
	case g.p.Freezer != "":
		file, check = filepath.Join(g.p.Freezer, "freezer.state"), filepath.Join(g.p.Freezer, "freezer.state")
		val = map[bool]string{true: "FROZEN", false: "THAWED"}[on]
		done = func(b []byte) bool { return strings.TrimSpace(string(b)) == val }
	default:
		return errors.New("cgroups: no freezer")
	}
	if err := write(file, val); err != nil {
		return err
	}
	wait := 100 * time.Microsecond
	for {
		b, err := os.ReadFile(check)
		if err != nil {
			return fmt.Errorf("cgroups: %w", err)
		}
		if done(b) {
			return nil
		}
		if on && g.p.Unified == "" {
			// v1 can get stuck in FREEZING; asking again nudges it.
			_ = write(file, val)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("cgroups: freeze=%v: %w", on, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Millisecond)
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// write sets a control file. Control files always exist; a missing one
// means the controller or feature is absent, reported as fs.ErrNotExist.
func write(path, val string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	_, err = f.WriteString(val)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cgroups: write %q to %s: %w", val, path, err)
	}
	return nil
}
