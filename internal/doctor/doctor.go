// Package doctor reports what a host offers SPACE: KVM, runsc, qemu and
// firecracker, the cgroup layout, nftables, user namespaces, overlayfs,
// disk quota support on the data dir's filesystem and whether it has a
// journal, /dev/net/tun and /dev/fuse. `space doctor` prints it with the
// driver `auto` picks (that part is the server's own selection,
// internal/server.ExplainAuto).
package doctor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/criu"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/internal/vmimage"
)

// Report is `space doctor --json`.
type Report struct {
	Host   Host    `json:"host"`
	Checks []Check `json:"checks"`
	// Driver is what `space server --driver auto` would pick here.
	Driver Driver `json:"driver"`
}

// Host is the machine doctor ran on.
type Host struct {
	Kernel  string `json:"kernel"`
	Arch    string `json:"arch"`
	CPUs    int    `json:"cpus"`
	Root    bool   `json:"root"`
	DataDir string `json:"data_dir"`
}

// Check is one capability.
type Check struct {
	Name string `json:"name"` // stable: kvm, runsc, cgroups, ...
	OK   bool   `json:"ok"`   // the capability is there and works
	// Detail says what was found (a version, a layout, a path) or why not.
	Detail string `json:"detail"`
	// For names what needs it (drivers, features).
	For string `json:"for"`
}

// Driver is the outcome of the server's own driver selection.
type Driver struct {
	Auto   string   `json:"auto"`            // the driver auto picks ("" if none works)
	Reason string   `json:"reason"`          // why (the server's driver_reason)
	Error  string   `json:"error,omitempty"` // why even the fallback failed
	Log    []string `json:"log,omitempty"`   // what the drivers said while being tried
}

// CheckNames are the checks Probe makes, in order.
var CheckNames = []string{"root", "kvm", "firecracker", "qemu", "runsc", "criu", "cgroups", "user_namespaces", "overlayfs",
	"nftables", "tun", "fuse", "disk_quota", "data_dir_fs", "loop_devices", "mmdebstrap"}

// Options configure Probe.
type Options struct {
	DataDir string // whose filesystem the quota check looks at (the nearest existing parent)
	Runsc   string // as --runsc ("" = the server's search)
	CRIU    string // a CRIU binary ("" = $SPACE_CRIU, the pinned build, PATH)
}

// Probe checks the host. It changes nothing on it.
func Probe(ctx context.Context, o Options) Report {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	r := Report{Host: Host{Kernel: unix.ByteSliceToString(uts.Release[:]), Arch: runtime.GOARCH, CPUs: runtime.NumCPU(),
		Root: os.Geteuid() == 0, DataDir: o.DataDir}}
	add := func(name, forWhat string, ok bool, detail string) {
		r.Checks = append(r.Checks, Check{Name: name, OK: ok, Detail: detail, For: forWhat})
	}
	if r.Host.Root {
		add("root", "space server and space node (namespaces, cgroups, nftables)", true, "running as root")
	} else {
		add("root", "space server and space node (namespaces, cgroups, nftables)", false, fmt.Sprintf("running as uid %d: the server needs root", os.Geteuid()))
	}
	ok, detail := kvm()
	add("kvm", "drivers firecracker, qemu with KVM", ok, detail)
	ok, detail = binary(ctx, "firecracker", "--version")
	if ok {
		if _, err := exec.LookPath("jailer"); err != nil {
			detail += "; no jailer on PATH"
		}
	}
	add("firecracker", "driver firecracker (with KVM)", ok, detail)
	ok, detail = binary(ctx, "qemu-system-x86_64", "--version")
	add("qemu", "driver qemu (KVM, or TCG without it)", ok, detail)
	ok, detail = runsc(ctx, o.Runsc)
	add("runsc", "driver gvisor", ok, detail)
	ok, detail = criuCheck(ctx, o.CRIU)
	add("criu", "driver namespace: processes in snapshots (scripts/criu.sh builds it)", ok, detail)
	ok, detail = cgroupLayout()
	add("cgroups", "sandbox limits, pause (freezer), OOM reports", ok, detail)
	ok, detail = userNamespaces()
	add("user_namespaces", "drivers namespace, gvisor (root inside is not root outside)", ok, detail)
	ok, detail = overlayfs()
	add("overlayfs", "driver namespace (template + writable layer)", ok, detail)
	ok, detail = nftablesUsable()
	add("nftables", "--egress (per-sandbox host rules)", ok, detail)
	ok, detail = charDevice("/dev/net/tun")
	add("tun", "driver qemu with --egress (tap devices)", ok, detail)
	ok, detail = charDevice("/dev/fuse")
	add("fuse", "nothing yet (FUSE inside sandboxes is not offered)", ok, detail)
	ok, detail = diskQuota(ctx, o.DataDir)
	if !ok {
		// Disk limits do not need them: each limited sandbox gets its own
		// ext4 image (the loop_devices check).
		detail += "; disk limits use an ext4 image per sandbox instead (loop_devices)"
	}
	add("disk_quota", "project quotas on the data dir (informational: disk limits use loop_devices)", ok, detail)
	ok, detail = dataDirFS(o.DataDir)
	add("data_dir_fs", "sandbox creates and deletes (their directories under the data dir)", ok, detail)
	ok, detail = loopDevices()
	add("loop_devices", "an ext4 image per sandbox (a disk limit without project quotas); VM drivers' disks", ok, detail)
	ok, detail = binary(ctx, "mmdebstrap", "--version")
	add("mmdebstrap", "the builtin base template (Debian)", ok, detail)
	return r
}

func kvm() (bool, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, errText(err)
	}
	f.Close()
	if !vmimage.KVMUsable() {
		return false, "/dev/kvm opens but cannot run guests (no vmx/svm flag, or KVM_CREATE_VM fails)"
	}
	return true, "/dev/kvm can run guests"
}

// binary finds name on PATH and asks it its version (first line).
func binary(ctx context.Context, name string, versionArg string) (bool, string) {
	p, err := exec.LookPath(name)
	if err != nil {
		return false, name + " not on PATH"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, versionArg).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if err != nil {
		return false, fmt.Sprintf("%s: %s %s: %v", p, name, versionArg, err)
	}
	return true, p + ": " + line
}

func runsc(ctx context.Context, explicit string) (bool, string) {
	p, err := gvisor.FindRunsc(explicit)
	if err != nil {
		return false, errText(err)
	}
	v, err := gvisor.RunscVersion(ctx, p)
	if err != nil {
		return false, errText(err)
	}
	return true, p + ": " + v
}

// criuCheck finds CRIU and runs `criu check` (which needs root): its
// path, version and verdict, or why it cannot be used.
// The namespace driver also needs scripts/criu.sh's patched build.
func criuCheck(ctx context.Context, explicit string) (bool, string) {
	path, v, err := criu.ProbeSandboxes(ctx, explicit)
	if err != nil {
		return false, errText(err)
	}
	return true, path + ": " + v + " (" + criu.BuildTag + "), criu check: Looks good."
}

func cgroupLayout() (bool, string) {
	m, err := cgroups.New("")
	if err != nil {
		return false, errText(err)
	}
	if m.Layout() == cgroups.LayoutNone {
		return false, "no cgroup hierarchy mounted"
	}
	// Not a failure when off: creates work, each a few ms slower
	// (the server turns it on unless --cgroup-favordynmods=false).
	if d, err := cgroups.ReadDynMods(); err == nil && d.Mount != "" {
		return true, m.String() + "; " + d.String()
	}
	return true, m.String()
}

// userNamespaces starts /bin/true in a new user namespace: what the
// namespace driver does for every sandbox.
func userNamespaces() (bool, string) {
	limit := readTrim("/proc/sys/user/max_user_namespaces")
	if limit == "0" {
		return false, "user.max_user_namespaces is 0"
	}
	bin := "/bin/true"
	if _, err := os.Stat(bin); err != nil {
		bin = "/usr/bin/true"
	}
	cmd := exec.Command(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}}
	if err := cmd.Run(); err != nil {
		return false, "cannot create one: " + err.Error()
	}
	d := "a new user namespace starts"
	if limit != "" {
		d += " (user.max_user_namespaces " + limit + ")"
	}
	return true, d
}

func overlayfs() (bool, string) {
	data, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false, errText(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "overlay" {
			return true, "overlay in /proc/filesystems"
		}
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	ko, _ := filepath.Glob("/lib/modules/" + unix.ByteSliceToString(uts.Release[:]) + "/kernel/fs/overlayfs/overlay.ko*")
	if len(ko) > 0 {
		return true, "overlay module present (loaded on first mount): " + ko[0]
	}
	return false, "overlay is not in /proc/filesystems and no module was found"
}

// nftablesUsable lists the host's nftables tables over netlink, in
// process, as the egress gateway does (no nft binary needed).
func nftablesUsable() (bool, string) {
	c, err := nftables.New()
	if err != nil {
		return false, "netlink: " + err.Error()
	}
	tables, err := c.ListTables()
	if err != nil {
		return false, "list tables: " + err.Error()
	}
	return true, fmt.Sprintf("netlink works (%d tables)", len(tables))
}

func charDevice(path string) (bool, string) {
	fi, err := os.Stat(path)
	if err != nil {
		return false, errText(err)
	}
	if fi.Mode()&os.ModeCharDevice == 0 {
		return false, path + " is not a character device"
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false, path + " exists but does not open: " + errText(err)
	}
	f.Close()
	return true, path + " opens"
}

// existingParent is dir or its nearest existing parent.
func existingParent(dir string) string {
	d := filepath.Clean(dir)
	for {
		if _, err := os.Stat(d); err == nil || d == "/" || d == "." {
			return d
		}
		d = filepath.Dir(d)
	}
}

// mount is a mountinfo entry.
type mount struct {
	point, fstype, source string
	opts                  string // the mount's and the superblock's options
	dev                   string // major:minor
}

// mountOf returns the mountinfo entry of the filesystem holding path.
func mountOf(path string) (mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return mount{}, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return mount{}, err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	var m mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 3 {
			continue
		}
		mp := unescape(f[4])
		if abs == mp || mp == "/" || strings.HasPrefix(abs, mp+"/") {
			if len(mp) >= len(m.point) { // the deepest (and, among equals, the last) mount wins
				m = mount{point: mp, fstype: g[0], source: g[1], opts: f[5] + "," + g[2], dev: f[2]}
			}
		}
	}
	if m.point == "" {
		return mount{}, fmt.Errorf("no mount holds %s", abs)
	}
	return m, nil
}

func unescape(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// diskQuota says whether the data dir's filesystem can limit a
// sandbox's writable layer by itself (project quotas), and how.
func diskQuota(ctx context.Context, dataDir string) (bool, string) {
	at := existingParent(dataDir)
	m, err := mountOf(at)
	if err != nil {
		return false, errText(err)
	}
	point, fstype, source := m.point, m.fstype, m.source
	has := func(o ...string) bool {
		for _, x := range strings.Split(m.opts, ",") {
			for _, want := range o {
				if x == want {
					return true
				}
			}
		}
		return false
	}
	where := fmt.Sprintf("%s on %s (%s, from %s)", at, point, fstype, source)
	switch fstype {
	case "xfs":
		if has("prjquota", "pquota", "pqnoenforce") {
			return true, where + ": XFS project quotas are on"
		}
		return false, where + ": XFS without project quotas (mount with -o prjquota)"
	case "ext4":
		if has("prjquota") {
			return true, where + ": ext4 project quotas are on"
		}
		feat := ext4Features(ctx, source)
		if strings.Contains(" "+feat+" ", " project ") && strings.Contains(" "+feat+" ", " quota ") {
			return true, where + ": ext4 with the project and quota features (quotas enforced by the feature)"
		}
		d := where + ": ext4 without project quotas (needs tune2fs -O project,quota and a remount with prjquota)"
		if feat != "" {
			d += "; features: " + feat
		}
		return false, d
	case "btrfs":
		return false, where + ": btrfs (qgroups per subvolume, not used)"
	case "tmpfs":
		return false, where + ": tmpfs (a size= per mount limits it, no per-directory quota)"
	}
	return false, where + ": no project quota support known for " + fstype
}

// FS is the filesystem that holds a directory.
type FS struct {
	Dir    string // the directory, or its nearest existing parent
	Point  string // its mount point
	Type   string // ext4, xfs, tmpfs, ...
	Source string // the mount's source (a device for disk filesystems)
	// Journal is ext4's journal: "yes", "no", or "" where unknown (or
	// not ext4).
	Journal string
}

// FSOf describes the filesystem holding dir (its nearest existing parent).
func FSOf(dir string) (FS, error) {
	at := existingParent(dir)
	m, err := mountOf(at)
	if err != nil {
		return FS{}, err
	}
	f := FS{Dir: at, Point: m.point, Type: m.fstype, Source: m.source}
	if m.fstype == "ext4" {
		switch ext4Journal(m.dev) {
		case "":
		case "<none>":
			f.Journal = "no"
		default:
			f.Journal = "yes"
		}
	}
	return f, nil
}

// String is the filesystem in a few words, e.g. "ext4 without a journal
// on / (/dev/vda)".
func (f FS) String() string {
	kind := f.Type
	switch f.Journal {
	case "yes":
		kind += " with a journal"
	case "no":
		kind += " without a journal"
	}
	return fmt.Sprintf("%s on %s (%s)", kind, f.Point, f.Source)
}

// dataDirFS says whether the data dir's filesystem keeps the churn of
// sandbox directories cheap. ext4 without a journal does not: its inode
// allocator skips every inode deleted in the last minute (six while the
// inode's table block is dirty) and reads each to find out, so a node's
// creates slow down the more it has deleted (docs/operations.md).
func dataDirFS(dataDir string) (bool, string) {
	f, err := FSOf(dataDir)
	if err != nil {
		return false, errText(err)
	}
	where := fmt.Sprintf("%s on %s (%s, from %s)", f.Dir, f.Point, f.Type, f.Source)
	switch {
	case f.Type != "ext4":
		return true, where
	case f.Journal == "no":
		return false, where + ": ext4 without a journal: inode allocation skips every recently deleted inode, so creates slow down on a busy node (use a journaled ext4 or XFS, docs/operations.md)"
	case f.Journal == "yes":
		return true, where + ": ext4 with a journal"
	}
	return true, where + ": ext4 (whether it has a journal is not known here)"
}

// ext4Journal is the ext4 filesystem on block device dev (major:minor)'s
// journal_task in sysfs: a pid, "<none>" for no journal, "" if unknown.
func ext4Journal(dev string) string {
	link, err := os.Readlink("/sys/dev/block/" + dev)
	if err != nil {
		return ""
	}
	return readTrim(filepath.Join("/sys/fs/ext4", filepath.Base(link), "journal_task"))
}

// ext4Features is tune2fs -l's feature list of dev, "" if it cannot be read.
func ext4Features(ctx context.Context, dev string) string {
	p, err := exec.LookPath("tune2fs")
	if err != nil || !strings.HasPrefix(dev, "/dev/") {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "-l", dev).Output()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Filesystem features" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func loopDevices() (bool, string) {
	f, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return false, "/dev/loop-control: " + errText(err)
	}
	f.Close()
	d := "/dev/loop-control opens"
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		d += "; " + p
	} else {
		d += "; no mkfs.ext4 on PATH (apt-get install e2fsprogs)"
	}
	return true, d
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func errText(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Path + ": " + pe.Err.Error()
	}
	return err.Error()
}
