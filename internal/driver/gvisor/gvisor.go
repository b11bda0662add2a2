// Package gvisor is the gVisor driver: each sandbox is an OCI container run
// by runsc (systrap platform; kvm where asked and /dev/kvm exists), so the
// sandbox's processes talk to gVisor's user-space kernel, not the host's.
//
// Layout of a sandbox on the host:
//
//	<StateDir>/<id>/netns         its network namespace (nsfs bind mount),
//	                              with Options.Network only
//	<StateDir>/<id>/upper, work   the writable layer (host overlayfs over the
//	                              template's read-only rootfs)
//	<StateDir>/<id>/disk.img      with a disk limit: the layer's own ext4 of
//	                              that size, mounted at disk/ (upper, work in it)
//	<StateDir>/<id>/merged        the overlay, the container's root
//	<StateDir>/<id>/console/      a 1 MiB tmpfs holding console.log, the
//	                              container's stdout and stderr (bounded:
//	                              root inside can reopen them)
//	<StateDir>/<id>/config.json   the OCI bundle's spec
//	<StateDir>/<id>/state.json    what a restarted node needs (Attach)
//	<RunDir>/<id>/agent.sock      the agent's socket
//
// The `space` binary is bind-mounted read-only at /.space/agent and runs as
// the container's process (`agent --listen /.space/run/agent.sock`);
// <RunDir>/<id> is bind-mounted at /.space/run and runsc's --host-uds=create
// makes the agent's listening socket a host unix socket there, which the
// host dials (never following a link the sandbox may have put there). The
// container has a user namespace mapping its ids 0..UIDCount-1 to host ids
// UIDBase.., like the namespace driver, so templates and writable layers are
// interchangeable between the two drivers. Resource limits go to runsc as
// the spec's resources and land in cgroups below the node's own (relative
// cgroupsPath <CgroupBase>/<id>); the sentry sizes its memory to the limit.
// The pids limit is enforced on the sandbox's own tasks by the Sentry's
// cgroup v2 pids controller, the host cgroup getting headroom for runsc's
// host tasks (pids.go, package agentpids).
//
// Sandboxes outlive the node process (runsc run -detach) and are re-adopted
// with Attach. Destroy runs `runsc delete -force`, then removes cgroups,
// the overlay mount and every file.
package gvisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/consolelog"
	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/idmap"
	"github.com/space-sandbox/space/internal/uidpool"
	"golang.org/x/sys/unix"
)

// Name is the driver's name.
const Name = "gvisor"

// Defaults.
const (
	DefaultUIDBase      = 100000
	DefaultUIDCount     = 65536
	DefaultPids         = 4096
	defaultReadyTimeout = 15 * time.Second
	defaultDestroyWait  = 15 * time.Second
	maxSocketPath       = 107

	// Paths inside the sandbox.
	agentInside   = "/.space/agent"
	runDirInside  = "/.space/run"
	sockName      = "agent.sock"
	runscRootName = "runsc" // under RunDir
	netnsName     = "netns" // under <StateDir>/<id>: the pinned network namespace
)

var defaultAgentArgs = []string{"agent", "--listen"}

// Options configure the driver.
type Options struct {
	// Runsc is the runsc binary; default FindRunsc("").
	Runsc string
	// Platform is runsc's platform: systrap (default), ptrace or kvm.
	Platform string
	// StateDir holds one dir per sandbox (overlay, bundle, state.json).
	StateDir string
	// RunDir holds runsc's --root (RunDir/runsc) and the per-sandbox socket
	// dirs (RunDir/<id>); keep it short (unix socket paths).
	RunDir string
	// AgentPath is the `space` binary bind-mounted into each sandbox.
	AgentPath string
	// AgentArgs come before the socket path; default ["agent", "--listen"].
	AgentArgs []string
	// Env is the agent's environment; default PATH and HOME.
	Env []string
	// UIDBase and UIDCount are the host uid/gid range sandbox ids 0.. map
	// to without a Pool, and the ids templates' files are stored with.
	UIDBase, UIDCount uint32
	// Pool, if set, gives each sandbox its own block of host ids (runsc's
	// user namespace mapping, its layer, disk and socket dir) and shows it
	// the template through an idmapped mount onto that block, the lower
	// layer of its host overlay. Without it every sandbox shares UIDBase..
	// (the old layout, which sandboxes created before keep).
	Pool *uidpool.Pool
	// DefaultLimits fill in zero fields of a spec's limits.
	DefaultLimits driver.Limits
	// Disks, if set, gives each sandbox with a disk limit (the spec's or
	// DefaultLimits') a filesystem of that size for its writable layer;
	// without it a disk limit fails Create with driver.ErrUnsupported.
	Disks *diskquota.Manager
	// CgroupBase is the dir below the node's cgroups that holds sandbox
	// groups; default "space-gvisor".
	CgroupBase string
	// ReadyTimeout bounds how long Create waits for the agent.
	ReadyTimeout time.Duration
	// MaxStarting bounds the sandboxes that start at once (runsc, the
	// Sentry's boot and the agent's first answers); further creates wait
	// for a slot, as long as their context allows. Default: the number of
	// CPUs, at least 2. Unbounded, 32 creates on 2 CPUs starved each
	// other's agents until their first calls timed out (issue 25).
	MaxStarting int
	// Network, if set, gives each sandbox a network: the driver makes a
	// fresh network namespace pinned at <StateDir>/<id>/netns, Network puts
	// the sandbox's link in it (veth, addresses, host-side rules) before
	// runsc starts, and runsc runs the sandbox's netstack over that link
	// (--network=sandbox). Without it the sandbox has no network at all
	// (--network=none). The netns dies with the sandbox (and the veth with
	// it); host-side state the hook made is the caller's to release, as
	// with the namespace driver's hook (egress.Network.WrapDriver).
	Network func(ctx context.Context, id, netnsPath string) error
	// Probe, if set, runs once the agent's socket answers; Create fails if
	// it does.
	Probe func(ctx context.Context, inst driver.Instance) error
	// Debug keeps runsc's debug logs in <StateDir>/<id>/logs.
	Debug bool
	Logf  func(format string, args ...any)
}

// Driver implements driver.Driver with gVisor.
type Driver struct {
	opts    Options
	r       *runsc
	cg      *cgroups.Manager
	version string
	// idmaps holds a user namespace per pool block for the template's
	// idmapped mounts; nil without a Pool.
	idmaps *idmap.Cache
	// starting holds a token per sandbox starting (Options.MaxStarting).
	starting chan struct{}
}

var _ driver.Driver = (*Driver)(nil)

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// New finds and checks runsc and prepares the driver's dirs.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("gvisor: must run as root: %w", driver.ErrUnsupported)
	}
	if opts.StateDir == "" || opts.RunDir == "" || opts.AgentPath == "" {
		return nil, errors.New("gvisor: StateDir, RunDir and AgentPath are required")
	}
	var err error
	if opts.Runsc, err = FindRunsc(opts.Runsc); err != nil {
		return nil, err
	}
	for _, p := range []*string{&opts.StateDir, &opts.RunDir, &opts.AgentPath} {
		if *p, err = filepath.Abs(*p); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	switch opts.Platform {
	case "":
		opts.Platform = "systrap"
	case "systrap", "ptrace":
	case "kvm":
		if _, err := os.Stat("/dev/kvm"); err != nil {
			return nil, fmt.Errorf("gvisor: platform kvm: %w: %w", err, driver.ErrUnsupported)
		}
	default:
		return nil, fmt.Errorf("gvisor: unknown platform %q", opts.Platform)
	}
	if opts.AgentArgs == nil {
		opts.AgentArgs = defaultAgentArgs
	}
	if opts.Env == nil {
		opts.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	}
	if opts.UIDBase == 0 {
		opts.UIDBase = DefaultUIDBase
	}
	if opts.UIDCount == 0 {
		opts.UIDCount = DefaultUIDCount
	}
	if opts.Pool != nil && (opts.UIDCount != uidpool.BlockSize || opts.Pool.Overlaps(opts.UIDBase, opts.UIDCount)) {
		return nil, fmt.Errorf("gvisor: uid pool %s must not overlap the template range %d+%d, and sandboxes must have %d ids", opts.Pool, opts.UIDBase, opts.UIDCount, uidpool.BlockSize)
	}
	if opts.CgroupBase == "" {
		opts.CgroupBase = "space-gvisor"
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = defaultReadyTimeout
	}
	if opts.MaxStarting <= 0 {
		opts.MaxStarting = max(2, runtime.NumCPU())
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	// runsc keeps per-sandbox sockets in its root: runsc-<id>.sock.
	if room := maxSocketPath - len(filepath.Join(opts.RunDir, runscRootName)) - len("/runsc-.sock"); room < 64 {
		return nil, fmt.Errorf("gvisor: RunDir %q too long for unix socket paths (room for %d-byte ids, need 64)", opts.RunDir, room)
	}
	fi, err := os.Stat(opts.AgentPath)
	if err != nil {
		return nil, fmt.Errorf("gvisor: agent binary: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o001 == 0 {
		return nil, fmt.Errorf("gvisor: agent binary %s must be a regular file executable by others (mode %v)", opts.AgentPath, fi.Mode())
	}
	version, err := RunscVersion(ctx, opts.Runsc)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{opts.StateDir, opts.RunDir, filepath.Join(opts.RunDir, runscRootName)} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	for _, d := range []string{opts.StateDir, opts.RunDir, filepath.Dir(opts.AgentPath)} {
		if err := ensureTraversable(d, opts.Logf); err != nil {
			return nil, err
		}
	}
	cg, err := cgroups.New(opts.CgroupBase)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: %w", err, driver.ErrUnsupported)
	}
	d := &Driver{
		opts:     opts,
		cg:       cg,
		version:  version,
		starting: make(chan struct{}, opts.MaxStarting),
		r: &runsc{
			path:     opts.Runsc,
			root:     filepath.Join(opts.RunDir, runscRootName),
			platform: opts.Platform,
			debug:    opts.Debug,
		},
	}
	if opts.Pool != nil {
		d.idmaps = idmap.NewCache()
	}
	opts.Logf("gvisor driver: %s (%s), platform %s, cgroups %s", opts.Runsc, version, opts.Platform, cg)
	if w := cg.RestartWarning(); w != "" {
		opts.Logf("gvisor driver: %s", w)
	}
	return d, nil
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return Name }

// Runsc is the runsc binary and its version line.
func (d *Driver) Runsc() (path, version string) { return d.opts.Runsc, d.version }

func (d *Driver) sandboxDir(id string) string { return filepath.Join(d.opts.StateDir, id) }
func (d *Driver) sockDir(id string) string    { return filepath.Join(d.opts.RunDir, id) }
func (d *Driver) cgroupsPath(id string) string {
	return d.opts.CgroupBase + "/" + id // relative: below runsc's (the node's) cgroups
}

// A sandbox's own disk, where it has a disk limit: <id>/disk.img mounted
// at <id>/disk.
const (
	diskImage = "disk.img"
	diskMount = "disk"
)

// upperDir is the overlay's upper dir of the sandbox in dir: on its own
// disk where it has one.
func upperDir(dir string) string {
	if _, err := os.Lstat(filepath.Join(dir, diskImage)); err == nil {
		return filepath.Join(dir, diskMount, "upper")
	}
	return filepath.Join(dir, "upper")
}

// limits resolves zero fields: the spec, then Options.DefaultLimits, then
// DefaultPids for tasks; memory and CPU stay unlimited.
func (d *Driver) limits(l driver.Limits) cgroups.Limits {
	def := d.opts.DefaultLimits
	pick := func(v, dv, fallback int64) int64 {
		switch {
		case v > 0:
			return v
		case dv > 0:
			return dv
		}
		return fallback
	}
	return cgroups.Limits{
		MemoryBytes: pick(l.MemoryBytes, def.MemoryBytes, 0),
		CPUMillis:   pick(l.CPUMillis, def.CPUMillis, 0),
		Pids:        pick(l.Pids, def.Pids, DefaultPids),
	}
}

// hostLimits are the host cgroup limits for the sandbox's limits l: the
// pids and memory limits leave room for runsc's own host tasks and memory
// (hostPids, hostMemory), so the sandbox's processes meet their limits
// before gVisor's kernel meets the host's.
func hostLimits(l cgroups.Limits) cgroups.Limits {
	l.MemoryBytes = hostMemory(l.MemoryBytes, l.Pids)
	l.Pids = hostPids(l.Pids)
	return l
}

// cleanup is a stack of undo steps for a half-built sandbox.
type cleanup []func()

func (c *cleanup) push(f func()) { *c = append(*c, f) }

func (c *cleanup) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

// Create implements driver.Driver.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (driver.Instance, error) {
	return d.create(ctx, spec, "")
}

// create starts a sandbox afresh, or from a checkpoint image when
// imageDir is set.
func (d *Driver) create(ctx context.Context, spec driver.Spec, imageDir string) (_ driver.Instance, err error) {
	t0 := time.Now()
	id := spec.ID
	if !idRE.MatchString(id) || id == runscRootName {
		return nil, fmt.Errorf("gvisor: invalid sandbox id %q", id)
	}
	release, err := d.startSlot(ctx)
	if err != nil {
		return nil, fmt.Errorf("gvisor: sandbox %s: %w", id, err)
	}
	defer release()
	hostname := spec.Hostname
	if hostname == "" {
		hostname = id
	}
	rootfs := filepath.Clean(spec.RootfsDir)
	if fi, err := os.Stat(rootfs); err != nil || !fi.IsDir() || !filepath.IsAbs(rootfs) {
		return nil, fmt.Errorf("gvisor: rootfs %q is not an absolute directory path (%v)", spec.RootfsDir, err)
	}
	if strings.ContainsAny(rootfs, ",:") {
		return nil, fmt.Errorf("gvisor: rootfs %q: overlayfs cannot take a path with ',' or ':'", rootfs)
	}
	// runsc's gofer runs as the sandbox's root (host UIDBase): it must be
	// able to walk to the template and the agent.
	if err := ensureTraversable(filepath.Dir(rootfs), d.opts.Logf); err != nil {
		return nil, err
	}
	dir := d.sandboxDir(id)
	sdir := d.sockDir(id)
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()

	// 1. Host dirs. An existing dir means a live or leftover sandbox of
	// that id: refuse rather than clean up something that is not ours.
	if err := os.Mkdir(dir, 0o711); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("gvisor: sandbox %s already exists", id)
		}
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	undo.push(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil { // umask
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	// The sandbox's host ids: its own block (owned by dir, which exists
	// from here until teardown), else the shared range.
	uidBase := d.opts.UIDBase
	if d.opts.Pool != nil {
		if uidBase, err = d.opts.Pool.Alloc(dir); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
		b := uidBase
		undo.push(func() { _ = d.opts.Pool.Free(b, dir) })
	}
	if err := os.Mkdir(sdir, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	undo.push(func() { _ = os.RemoveAll(sdir) })
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	// With a disk limit the layer lives on the sandbox's own filesystem
	// of that size. unmountAll(dir) in the undo below unmounts it.
	var diskTook time.Duration
	if size := cmp.Or(spec.Limits.DiskBytes, d.opts.DefaultLimits.DiskBytes); size > 0 {
		if d.opts.Disks == nil {
			return nil, fmt.Errorf("gvisor: a disk limit needs disk images (none configured): %w", driver.ErrUnsupported)
		}
		td := time.Now()
		mnt := filepath.Join(dir, diskMount)
		if err := os.Mkdir(mnt, 0o755); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
		if err := d.opts.Disks.Create(ctx, filepath.Join(dir, diskImage), mnt, size); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
		undo.push(func() { _ = diskquota.Remove(filepath.Join(dir, diskImage), mnt) })
		upper, work = filepath.Join(mnt, "upper"), filepath.Join(mnt, "work")
		diskTook = time.Since(td)
	}
	for _, p := range []string{upper, work, merged} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	// The sandbox's root (host uidBase) owns its layer and socket dir.
	for _, p := range []string{upper, work, sdir} {
		if err := os.Lchown(p, int(uidBase), int(uidBase)); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	if spec.InitLayer != nil {
		if err := spec.InitLayer(ctx, driver.Layer{Dir: upper, UIDBase: uidBase, UIDCount: d.opts.UIDCount}); err != nil {
			return nil, fmt.Errorf("gvisor: init layer: %w", err)
		}
	}

	// 2. The writable layer: host overlayfs over the template.
	var timing driver.Timing
	tov := time.Now()
	lower := rootfs
	if uidBase != d.opts.UIDBase {
		// The template through an idmapped mount onto the sandbox's block.
		// Overlayfs keeps a private clone of each layer, so the host's
		// copy is detached once the overlay stands.
		lower = filepath.Join(dir, "lower")
		if err := d.mountLower(rootfs, lower, uidBase); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
		undo.push(func() { _ = unix.Unmount(lower, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) })
	}
	// volatile: a delete's unmount does not sync the whole host filesystem
	// that holds the upper layer (see sandboxinit.Config.OverlayOptions;
	// a restore, like a create, mounts a fresh layer and work dir).
	data := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",volatile"
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_NODEV, data); err != nil {
		return nil, fmt.Errorf("gvisor: mount overlay: %w", err)
	}
	undo.push(func() { _ = unmountAll(dir) })
	if lower != rootfs {
		if err := unix.Unmount(lower, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			return nil, fmt.Errorf("gvisor: detach idmapped template: %w", err)
		}
	}
	timing.Overlay = diskTook + time.Since(tov)

	// 3. Network namespace, if any: made and wired before runsc starts, so
	// the host's rules exist before the sandbox's first instruction. The
	// overlay's undo (unmountAll(dir)) unpins it on failure.
	network, netnsPath := "none", ""
	if d.opts.Network != nil {
		tn := time.Now()
		netnsPath = filepath.Join(dir, netnsName)
		if err := newNetNS(netnsPath); err != nil {
			return nil, fmt.Errorf("gvisor: network namespace: %w", err)
		}
		if err := d.opts.Network(ctx, id, netnsPath); err != nil {
			return nil, fmt.Errorf("gvisor: network: %w", err)
		}
		network = "sandbox"
		timing.Network = time.Since(tn)
	}

	// 4. The bundle.
	lim := d.limits(spec.Limits)
	cfg := d.ociSpec(id, hostname, merged, sdir, netnsPath, uidBase, lim)
	if err := writeJSON(filepath.Join(dir, "config.json"), cfg); err != nil {
		return nil, err
	}
	st := state{
		ID:       id,
		Network:  network,
		NetNS:    netnsPath,
		Cgroups:  d.cg.Paths(id),
		Created:  time.Now().UTC().Format(time.RFC3339Nano),
		Platform: d.opts.Platform,
		UIDBase:  uidBase,
	}
	if err := writeState(dir, st); err != nil {
		return nil, err
	}

	// 5. runsc run -detach: returns once the container's process runs
	// (Timing.Namespaces is this step: runsc, gofer and Sentry start).
	tStart := time.Now()
	undo.push(func() {
		ctx, cancel := context.WithTimeout(context.Background(), defaultDestroyWait)
		defer cancel()
		if err := d.teardown(ctx, id, st); err != nil {
			d.opts.Logf("gvisor: %s: %v", id, err)
		}
	})
	// runsc writes the sandbox's pid (what `runsc state` reports) to
	// pidFile: one runsc process fewer per create (30-50 ms here).
	pidFile := filepath.Join(dir, pidFileName)
	args := []string{"run", "-detach", "-pid-file", pidFile, "-bundle", dir, id}
	if imageDir != "" {
		args = d.restoreArgs(imageDir, dir, id, uidBase, pidFile)
	}
	if err := d.start(ctx, id, dir, network, args...); err != nil {
		return nil, err
	}
	timing.Namespaces = time.Since(tStart)
	if st.PID, err = readPID(pidFile); err != nil {
		d.opts.Logf("gvisor: %s: %v; asking runsc", id, err)
		cs, err := d.r.state(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
		st.PID = cs.PID
	}
	if st.StartTime, err = procStartTime(st.PID); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	if err := writeState(dir, st); err != nil {
		return nil, err
	}

	// runsc wrote the limits; this adds what it leaves out (v1 memsw, so
	// no swap on top of the memory limit).
	inst := &Instance{d: d, id: id, dir: dir, sock: filepath.Join(sdir, sockName), st: st, group: d.cg.Open(st.Cgroups)}
	tcg := time.Now()
	if err := inst.group.SetLimits(hostLimits(lim)); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	timing.Cgroups = time.Since(tcg)

	// 6. Wait for the agent's socket.
	if err := inst.watch(); err != nil {
		return nil, err
	}
	if err := d.waitReady(ctx, inst); err != nil {
		return nil, err
	}
	// The sandbox's own pids limit, in the Sentry (pids.go). Nothing runs
	// in the sandbox but the agent before Create returns.
	if err := inst.setSandboxPids(ctx, lim.Pids); err != nil {
		if !errors.Is(err, errNoPidsRoute) {
			return nil, fmt.Errorf("gvisor: sandbox %s: %w", id, err)
		}
		d.opts.Logf("gvisor: %s: %v: its pids limit holds on the host only", id, err)
	}
	if d.opts.Probe != nil {
		if err := d.opts.Probe(ctx, inst); err != nil {
			return nil, fmt.Errorf("gvisor: sandbox %s: agent probe: %w", id, err)
		}
	}
	timing.AgentReady = time.Since(tStart)
	timing.Total = time.Since(t0)
	inst.timing = timing
	d.opts.Logf("gvisor: created %s in %v (overlay %v, runsc run %v, ready %v)",
		id, timing.Total, timing.Overlay, timing.Namespaces, timing.AgentReady)
	return inst, nil
}

// pidFileName is the file in the sandbox's dir runsc writes its pid to.
const pidFileName = "runsc.pid"

// readPID reads a pid file runsc wrote.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("runsc pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("runsc pid file %s: bad pid %q", path, b)
	}
	return pid, nil
}

// consolePath is the container's stdout and stderr, which runsc run
// -detach hands to the sandbox as its PID 1's descriptors 1 and 2: root
// inside can reopen them through /proc/1/fd and write without end, so the
// file is bounded (consolelog).
func consolePath(dir string) string { return consolelog.Path(dir, "console.log") }

// start runs `runsc <args>` (run or restore) with the sandbox's global
// flags, its output going to the sandbox's bounded console file.
func (d *Driver) start(ctx context.Context, id, dir, network string, args ...string) error {
	if err := consolelog.Mount(dir); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	logf, err := os.OpenFile(consolePath(dir), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	defer logf.Close()
	var logDir string
	if d.opts.Debug {
		logDir = filepath.Join(dir, "logs")
	}
	cmd := d.r.command(ctx, d.r.globals(logDir, network), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = dir
	// The sandbox must outlive the node: its own session, no death signal.
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("gvisor: runsc %s %s: %w%s", args[0], id, err, logTail(consolePath(dir)))
	}
	return nil
}

// startSlot waits for one of the Options.MaxStarting start slots; release
// gives it back. Queued creates wait here rather than slow every start
// down until the agents' first calls time out.
func (d *Driver) startSlot(ctx context.Context) (release func(), err error) {
	select {
	case d.starting <- struct{}{}:
		return func() { <-d.starting }, nil
	default:
	}
	t := time.Now()
	select {
	case d.starting <- struct{}{}:
		d.opts.Logf("gvisor: waited %v for a start slot (%d sandboxes starting)", time.Since(t), d.opts.MaxStarting)
		return func() { <-d.starting }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waited %v for a start slot, %d sandboxes are starting: %w", time.Since(t).Round(time.Millisecond), d.opts.MaxStarting, ctx.Err())
	}
}

// waitReady polls the agent's socket until it accepts a connection.
func (d *Driver) waitReady(ctx context.Context, inst *Instance) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	wait := 200 * time.Microsecond
	var lastErr error
	for {
		c, err := inst.Dial(ctx)
		if err == nil {
			_ = c.Close()
			return nil
		}
		lastErr = err
		select {
		case <-inst.done:
			return fmt.Errorf("gvisor: sandbox %s stopped before its agent served%s", inst.id, logTail(consolePath(inst.dir)))
		default:
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("gvisor: sandbox %s: agent not ready: %w (%w)%s", inst.id, lastErr, ctx.Err(), logTail(consolePath(inst.dir)))
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Millisecond)
	}
}

// dialSocket connects to the unix socket at path without following a
// symlink in its last element (the sandbox controls the dir's contents):
// it opens the socket inode O_PATH|O_NOFOLLOW, checks it is a socket and
// connects through /proc/self/fd.
func dialSocket(ctx context.Context, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s is not a socket (mode %#o)", path, st.Mode)
	}
	var dd net.Dialer
	return dd.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

// unmountAll lazily unmounts every mount at or below dir, deepest first.
func unmountAll(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	// The calling thread's view: the namespace its unmounts act on (a
	// parked main thread, seen through /proc/self, may be in another).
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range splitLines(string(b)) {
		f := splitFields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeOctal(f[4])
		if mp == dir || (len(mp) > len(dir) && mp[:len(dir)] == dir && mp[len(dir)] == '/') {
			out = append(out, mp)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// newNetNS makes a fresh network namespace and pins it with a bind mount at
// path. It unshares on a locked thread and then returns that thread to its
// own namespace; if it cannot, it leaves the thread locked so the runtime
// retires it with the goroutine. (A retired main thread is parked, not
// ended, so returning matters: a parked thread would pin the namespace,
// and with it the sandbox's veth, for the life of the process.)
func newNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o400)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		orig, err := unix.Open(self, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open %s: %w", self, err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		merr := unix.Mount(self, path, "", unix.MS_BIND, "")
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("return to the host netns: %w", err) // thread stays locked
			return
		}
		runtime.UnlockOSThread()
		if merr != nil {
			merr = fmt.Errorf("pin %s: %w", path, merr)
		}
		errc <- merr
	}()
	if err := <-errc; err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
		return err
	}
	return nil
}

// selfTestID names the throwaway sandbox of SelfTest.
const selfTestID = "space-selftest"

// SelfTest starts and destroys a throwaway sandbox, without a network,
// over an empty root filesystem: it fails unless runsc, the platform, the
// user namespace, cgroups and the agent's socket all work here, which
// `runsc --version` alone does not show.
func (d *Driver) SelfTest(ctx context.Context) error {
	root := filepath.Join(d.opts.StateDir, ".selftest-root") // not an id: Sweep skips it
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("gvisor: self-test: %w", err)
	}
	defer os.RemoveAll(root)
	// A leftover of a crashed self-test would make Create refuse the id.
	_ = d.teardown(ctx, selfTestID, state{ID: selfTestID})
	plain := *d
	plain.opts.Network = nil
	plain.opts.Probe = nil
	inst, err := plain.create(ctx, driver.Spec{ID: selfTestID, RootfsDir: root}, "")
	if err != nil {
		return fmt.Errorf("gvisor: self-test: %w", err)
	}
	if err := inst.Destroy(ctx); err != nil {
		return fmt.Errorf("gvisor: self-test: %w", err)
	}
	return nil
}

// mountLower attaches the template at dst as the sandbox with host ids
// uidBase.. sees it: its files, stored as UIDBase.., owned by uidBase...
func (d *Driver) mountLower(rootfs, dst string, uidBase uint32) error {
	return d.idmaps.MountAt(rootfs, dst, idmap.Mapping{From: d.opts.UIDBase, To: uidBase, Count: d.opts.UIDCount})
}
