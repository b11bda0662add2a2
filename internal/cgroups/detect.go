// Package cgroups places sandboxes in per-sandbox control groups below the
// node's own cgroup and sets their limits. It handles cgroup v1 (legacy), v2
// (unified) and the hybrid layout where the resource controllers sit on v1
// and an otherwise empty v2 tree is mounted beside them; in that case the v2
// tree is still used for what v2 offers without controllers (cgroup.kill,
// cgroup.events).
package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Layout is how the host mounts cgroups.
type Layout int

const (
	LayoutNone   Layout = iota
	LayoutV1            // only v1 hierarchies
	LayoutV2            // only the unified hierarchy
	LayoutHybrid        // both
)

func (l Layout) String() string {
	switch l {
	case LayoutV1:
		return "v1"
	case LayoutV2:
		return "v2"
	case LayoutHybrid:
		return "hybrid"
	}
	return "none"
}

// ErrNoCgroups is returned when no usable cgroup hierarchy is mounted.
var ErrNoCgroups = errors.New("cgroups: no usable cgroup hierarchy mounted")

// DefaultBase is the directory, below the node's own cgroup in every
// hierarchy, that holds one group per sandbox.
const DefaultBase = "space"

var baseRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// Controllers the sandboxes are limited by. Every hierarchy costs a mkdir,
// an attach and an rmdir per sandbox, so only these are used: cpuset is
// left out (a new v1 cpuset group starts empty and must be filled in),
// cpuacct too (cpu usage is also in cpu.stat on v2; on v1 it comes along
// when co-mounted with cpu), and the v1 freezer only when there is no v2
// tree, whose cgroup.freeze does the same job.
var wanted = []string{"memory", "cpu", "pids", "freezer"}

type mount struct {
	point string   // mount point
	root  string   // root of the mount inside the hierarchy
	opts  []string // super options (v1 controller names among them)
	v2    bool
}

// parseMountinfo returns the cgroup and cgroup2 mounts of a mountinfo table.
func parseMountinfo(data []byte) ([]mount, error) {
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || len(fields) < sep+3 {
			continue
		}
		fstype := fields[sep+1]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		out = append(out, mount{
			point: unescapeMount(fields[4]),
			root:  unescapeMount(fields[3]),
			opts:  strings.Split(fields[sep+3], ","),
			v2:    fstype == "cgroup2",
		})
	}
	return out, sc.Err()
}

// unescapeMount undoes the octal escapes (\040 etc.) of /proc mount tables.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1:i+4]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '7' {
			return false
		}
	}
	return true
}

// parseProcCgroup maps each v1 controller (and "" for v2) to the process's
// cgroup path from a /proc/<pid>/cgroup table.
func parseProcCgroup(data []byte) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

// hierarchy is one mounted hierarchy the manager uses.
type hierarchy struct {
	base        string   // <mount>/<own path>/space
	controllers []string // wanted controllers it carries (empty for v2 in hybrid)
	v2          bool
	// cpuset: a v1 hierarchy with the cpuset controller, whose new groups
	// start with no CPUs and no memory nodes (NewUnder only).
	cpuset bool
	// top and rel: the mount point and the parent's path below it, for
	// NewUnder's groups (made one level at a time).
	top, rel string
}

// Manager creates per-sandbox groups. It is safe for concurrent use.
type Manager struct {
	base   string
	layout Layout
	hier   []hierarchy
	mounts []string // every cgroup mount point, to validate stored paths
	// v2ctl are the controllers the unified hierarchy provides for groups.
	v2ctl []string

	// unit is the node's own v2 cgroup when it is a systemd service's and
	// the node does not run in its leaf (see RestartWarning).
	unit string

	// parent is the fixed cgroup path groups go below (NewUnder), "" for
	// the node's own cgroup.
	parent string

	baseMu   sync.Mutex
	baseDone bool
}

// New detects the host's layout from /proc/self/mountinfo and
// /proc/self/cgroup. Groups go to <own cgroup>/<base>/<id>; base is one path
// element, DefaultBase when empty (tests use their own so that they never
// touch a running node's groups).
func New(base string) (*Manager, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	return NewFromTables(mi, cg, base)
}

// NewUnder is New with groups below the fixed cgroup path parent (absolute
// from each hierarchy's root, e.g. /space-sandboxes) instead of the node's
// own cgroup, in every v1 hierarchy mounted with its root visible (not only
// the limited controllers'), and the unified one. A node in a Kubernetes
// pod uses it, with the host's cgroup tree mounted in the pod, so that its
// sandboxes are in none of the pod's cgroups: the runtime and the kubelet
// kill whatever is in those when the pod goes, and the sandboxes must
// outlive it for the next pod to re-adopt them.
func NewUnder(parent, base string) (*Manager, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	return NewUnderFromTables(mi, parent, base)
}

// NewUnderFromTables is NewUnder with a given mountinfo table.
func NewUnderFromTables(mountinfo []byte, parent, base string) (*Manager, error) {
	if base == "" {
		base = DefaultBase
	}
	if !baseRE.MatchString(base) {
		return nil, fmt.Errorf("cgroups: invalid base %q", base)
	}
	if !filepath.IsAbs(parent) || filepath.Clean(parent) != parent || parent == "/" {
		return nil, fmt.Errorf("cgroups: parent %q must be a clean absolute cgroup path below the root", parent)
	}
	mounts, err := parseMountinfo(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("cgroups: mountinfo: %w", err)
	}
	m := &Manager{base: base, parent: parent}
	seenV1 := map[string]bool{}
	var haveV1, haveV2 bool
	for _, mt := range mounts {
		m.mounts = append(m.mounts, mt.point)
		// A mount of a container's own subtree cannot reach parent.
		rel, ok := strings.CutPrefix(parent, mt.root)
		if mt.root != "/" && (!ok || (rel != "" && rel[0] != '/')) {
			continue
		}
		if mt.root == "/" {
			rel = parent
		}
		dir := filepath.Join(mt.point, rel, base)
		if mt.v2 {
			if haveV2 {
				continue
			}
			haveV2 = true
			m.hier = append(m.hier, hierarchy{base: dir, v2: true, top: mt.point, rel: rel})
			m.v2ctl = v2Controllers(mt.point)
			continue
		}
		// The hierarchy's identity is its controllers (or name=): the same
		// one may be mounted twice (the pod's view and the host's).
		var ctls []string
		id := ""
		cpuset := false
		for _, o := range mt.opts {
			switch {
			case strings.HasPrefix(o, "name="):
				id += o + ","
			case slices.Contains(v1Controllers, o):
				id += o + ","
				cpuset = cpuset || o == "cpuset"
				if slices.Contains(wanted, o) {
					ctls = append(ctls, o)
				}
			}
		}
		if id == "" || seenV1[id] {
			continue
		}
		seenV1[id] = true
		haveV1 = true
		m.hier = append(m.hier, hierarchy{base: dir, controllers: ctls, cpuset: cpuset, top: mt.point, rel: rel})
	}
	if haveV2 {
		// The v1 freezer's hierarchy stays (the pod's cgroups are in it
		// too); only the controller goes, cgroup.freeze does its job.
		for i := range m.hier {
			if !m.hier[i].v2 {
				m.hier[i].controllers = slices.DeleteFunc(m.hier[i].controllers, func(c string) bool { return c == "freezer" })
			}
		}
	}
	onV1 := func(c string) bool {
		return slices.ContainsFunc(m.hier, func(h hierarchy) bool { return !h.v2 && slices.Contains(h.controllers, c) })
	}
	if err := m.settle(haveV1, haveV2, onV1); err != nil {
		return nil, fmt.Errorf("%w from which %s is reachable (mount the host's cgroup tree)", err, parent)
	}
	return m, nil
}

// v1Controllers are the v1 controllers a hierarchy may carry (NewUnder
// moves sandboxes out of the pod's group in each).
var v1Controllers = []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "net_prio",
	"blkio", "perf_event", "hugetlb", "pids", "rdma", "misc"}

// NewFromTables builds a manager from a mountinfo and a /proc/<pid>/cgroup
// table (New reads the process's own; tests pass their own).
func NewFromTables(mountinfo, procCgroup []byte, base string) (*Manager, error) {
	if base == "" {
		base = DefaultBase
	}
	if !baseRE.MatchString(base) {
		return nil, fmt.Errorf("cgroups: invalid base %q", base)
	}
	mounts, err := parseMountinfo(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("cgroups: mountinfo: %w", err)
	}
	own := parseProcCgroup(procCgroup)
	m := &Manager{base: base}
	seen := map[string]bool{}
	var haveV1, haveV2 bool
	for _, mt := range mounts {
		m.mounts = append(m.mounts, mt.point)
		if mt.v2 {
			path, ok := own[""]
			if !ok || haveV2 {
				continue
			}
			haveV2 = true
			// A node whose processes were moved to the leaf (enableOwn) still
			// owns the leaf's parent.
			if filepath.Base(path) == ProcsLeaf {
				path = filepath.Dir(path)
			} else if strings.HasSuffix(path, ".service") {
				m.unit = path
			}
			dir := join(mt, path)
			m.hier = append(m.hier, hierarchy{base: filepath.Join(dir, base), v2: true})
			m.v2ctl = v2Controllers(dir)
			continue
		}
		var ctls []string
		var path string
		for _, o := range mt.opts {
			for _, w := range wanted {
				if o == w && !seen[w] {
					ctls = append(ctls, w)
					path = own[w]
				}
			}
		}
		if len(ctls) == 0 {
			continue
		}
		for _, c := range ctls {
			seen[c] = true
		}
		haveV1 = true
		m.hier = append(m.hier, hierarchy{base: filepath.Join(join(mt, path), base), controllers: ctls})
	}
	if haveV2 {
		m.dropFreezerV1()
	}
	if err := m.settle(haveV1, haveV2, func(c string) bool { return seen[c] }); err != nil {
		return nil, err
	}
	return m, nil
}

// settle sets the layout from the hierarchies found (ErrNoCgroups without
// any) and gives every controller exactly one home: one bound to v1
// (onV1) cannot also be on v2, so it leaves the v2 list.
func (m *Manager) settle(haveV1, haveV2 bool, onV1 func(c string) bool) error {
	switch {
	case haveV1 && haveV2:
		m.layout = LayoutHybrid
	case haveV1:
		m.layout = LayoutV1
	case haveV2:
		m.layout = LayoutV2
	default:
		return ErrNoCgroups
	}
	var v2 []string
	for _, c := range m.v2ctl {
		if !onV1(c) {
			v2 = append(v2, c)
		}
	}
	m.v2ctl = v2
	for i := range m.hier {
		if m.hier[i].v2 {
			m.hier[i].controllers = v2
		}
	}
	return nil
}

// dropFreezerV1 removes the v1 freezer hierarchy (or just the controller
// from a hierarchy shared with others).
func (m *Manager) dropFreezerV1() {
	out := m.hier[:0]
	for _, h := range m.hier {
		if !h.v2 {
			h.controllers = slices.DeleteFunc(h.controllers, func(c string) bool { return c == "freezer" })
			if len(h.controllers) == 0 {
				continue
			}
		}
		out = append(out, h)
	}
	m.hier = out
}

// join maps a cgroup path as seen in /proc/self/cgroup to a directory under
// the mount, which may itself be rooted below the hierarchy's root (a
// container's bind mount of its own subtree).
func join(mt mount, path string) string {
	if mt.root != "/" {
		if rel, ok := strings.CutPrefix(path, mt.root); ok && (rel == "" || rel[0] == '/') {
			path = rel
		} else {
			// Our cgroup is not visible through this mount; use its root.
			path = "/"
		}
	}
	return filepath.Join(mt.point, path)
}

// v2Controllers lists the controllers a v2 cgroup dir offers its children,
// keeping the ones the manager uses.
func v2Controllers(dir string) []string {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil
	}
	var out []string
	for _, c := range strings.Fields(string(data)) {
		for _, w := range wanted {
			if c == w && w != "freezer" {
				out = append(out, c)
			}
		}
	}
	return out
}

// RestartWarning explains, for a node that systemd started in its unit's
// own cgroup on a v2-only host, that a restart of the unit will fail while
// sandboxes run; "" otherwise. On v2 the node delegates controllers from
// that cgroup to its sandboxes' groups after moving itself into the leaf
// ProcsLeaf, and from then on the kernel refuses to put a process in it:
// systemd before 254, which cannot start a unit in a subgroup
// (DelegateSubgroup=), fails the restart with status 219/CGROUP.
func (m *Manager) RestartWarning() string {
	if m.layout != LayoutV2 || m.unit == "" {
		return ""
	}
	return fmt.Sprintf("cgroup v2: systemd started this server in its unit's own cgroup %s, not in its leaf %s: "+
		"once sandboxes run, restarting the unit fails (status=219/CGROUP) until they are deleted; "+
		"set DelegateSubgroup=%s in the unit (systemd 254 or later; deploy/systemd/space-server.service)",
		m.unit, ProcsLeaf, ProcsLeaf)
}

// Layout reports the detected layout.
func (m *Manager) Layout() Layout { return m.layout }

// String describes the layout and where groups go, for logs.
func (m *Manager) String() string {
	var b strings.Builder
	b.WriteString(m.layout.String())
	for _, h := range m.hier {
		name := strings.Join(h.controllers, ",")
		if name == "" && !h.v2 {
			name = "(" + filepath.Base(h.top) + ")" // a NewUnder hierarchy without a limit
		}
		if h.v2 {
			name = "unified[" + name + "]"
		}
		fmt.Fprintf(&b, " %s=%s", name, h.base)
	}
	return b.String()
}
