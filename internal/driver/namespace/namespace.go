// Package namespace is the Linux-namespaces driver: each sandbox is the
// `space` binary running `agent --init` as PID 1 of new user, mount, pid,
// uts, ipc, net (and, from inside, cgroup) namespaces, on an overlay of the
// template, in its own cgroups, under seccomp and no_new_privs. Its uid 0 is
// an unprivileged uid on the host. It is the fastest driver and the weakest
// boundary: the sandbox shares the host kernel.
//
// The host talks to the agent over a unix socket that the driver creates and
// passes to PID 1 as a listening descriptor; the socket file stays on the
// host, out of the sandbox's view. Sandboxes are not tied to the node
// process: they survive its restart and are re-adopted with Attach.
package namespace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/idmap"
	"github.com/space-sandbox/space/internal/sandboxinit"
	"github.com/space-sandbox/space/internal/spawner"
	"github.com/space-sandbox/space/internal/uidpool"
	"golang.org/x/sys/unix"
)

// Name is the driver's name.
const Name = "namespace"

// Defaults.
const (
	DefaultUIDBase  = 100000
	DefaultUIDCount = 65536
	// DefaultPids caps tasks when neither the spec nor Options say
	// otherwise: pid exhaustion is host-wide.
	DefaultPids         = 4096
	defaultReadyTimeout = 10 * time.Second
	// defaultCheckpointTimeout bounds a CRIU checkpoint; an idle sandbox
	// dumps in a quarter second, one of 1 GiB in a few seconds.
	defaultCheckpointTimeout = 60 * time.Second
	defaultDestroyWait       = 10 * time.Second
	maxSocketPath            = 107 // sun_path holds 108 bytes with the NUL
)

var (
	defaultAgentArgs   = []string{"agent", "--init"}
	defaultSpawnerArgs = []string{"agent", "--spawner"}
)

// A sandbox's own disk, where it has a disk limit: <id>/disk.img mounted
// at <id>/disk.
const (
	diskImage = "disk.img"
	diskMount = "disk"
)

// Options configure the driver.
type Options struct {
	// StateDir holds one dir per sandbox: upper/, work/, merged/,
	// state.json and init.log; with a disk limit, disk.img mounted at
	// disk/, which holds upper/ and work/ instead.
	StateDir string
	// RunDir holds the agent sockets, <RunDir>/<id>.sock; keep it short.
	RunDir string
	// AgentPath is the `space` binary run as the sandbox's PID 1.
	AgentPath string
	// AgentArgs come before the init flags; default ["agent", "--init"].
	AgentArgs []string
	// Env is the agent's environment; default PATH and HOME. GOMAXPROCS=1
	// is added unless Env sets GOMAXPROCS (see agentEnv).
	Env []string
	// UIDBase and UIDCount are the host uid/gid range sandbox ids 0.. map
	// to without a Pool, and the ids templates' files are stored with.
	UIDBase, UIDCount uint32
	// Pool, if set, gives each sandbox its own block of host ids: its
	// processes, writable layer and disk run under that block, and it sees
	// the template (stored as UIDBase..) through an idmapped mount onto
	// it. Without it every sandbox shares UIDBase.. (the old layout, which
	// sandboxes created before a Pool was configured keep).
	Pool *uidpool.Pool
	// DefaultLimits fill in zero fields of a spec's limits.
	DefaultLimits driver.Limits
	// Disks, if set, gives each sandbox with a disk limit (the spec's or
	// DefaultLimits') a filesystem of that size for its writable layer;
	// without it a disk limit fails Create with driver.ErrUnsupported.
	Disks *diskquota.Manager
	// CgroupBase is the dir below the node's cgroups that holds sandbox
	// groups; default cgroups.DefaultBase ("space").
	CgroupBase string
	// CgroupParent, if set, is a cgroup path (from each hierarchy's root)
	// that holds CgroupBase instead of the node's own cgroup: a node in a
	// Kubernetes pod, whose sandboxes must be in none of the pod's cgroups
	// to outlive it (cgroups.NewUnder).
	CgroupParent string
	// ReadyTimeout bounds how long Create waits for the agent; default 10s.
	ReadyTimeout time.Duration
	// CheckpointTimeout bounds a checkpoint's wait for its turn (at most
	// max(2, CPUs) dumps run at once) and then the checkpoint itself (the
	// agent's listener handoff and CRIU's dump); default 60s each. One
	// that runs out fails and leaves the sandbox running with its
	// listener back; a CRIU dump under way when it runs out is left to
	// finish (criu.Dump).
	CheckpointTimeout time.Duration
	// SpawnerArgs run AgentPath as the fork helper (internal/spawner)
	// that starts every sandbox's PID 1; default ["agent", "--spawner"].
	SpawnerArgs []string
	// DirectFork forks PID 1 from this process instead, copying its page
	// tables each time (the helper's fallback; for comparisons).
	DirectFork bool
	// Network, if set, runs on the host once the sandbox's PID 1 exists and
	// before it is released (e.g. to put a veth into its network
	// namespace, /proc/<pid>/ns/net). Its time is Timing.Network.
	Network func(ctx context.Context, id string, pid int) error
	// Probe, if set, runs once the agent reports ready (e.g. GET /health
	// over inst.Dial); Create fails if it does.
	Probe func(ctx context.Context, inst driver.Instance) error
	// Checkpoints turns on process checkpoints with CRIU (space server
	// and space node turn it on unless --namespace-criu=false). Off, or
	// without a working CRIU, Checkpoint and Restore fail with
	// driver.ErrUnsupported (snapshots keep files only).
	Checkpoints bool
	// CRIU is the criu binary checkpoints use (driver.Checkpointer); ""
	// looks where criu.Find does.
	CRIU string
	// LazyRestore restores a checkpoint's anonymous memory on demand
	// (criu.RestoreLazy) when its image holds at least LazyRestoreMin
	// bytes of pages: the sandbox runs once its state is back and its
	// pages follow, those it touches first. Without /dev/userfaultfd
	// restores stay eager.
	LazyRestore    bool
	LazyRestoreMin int64
	Logf           func(format string, args ...any)
}

// DefaultLazyRestoreMin is where a lazy restore starts to pay on a
// 2-core host (BenchmarkRestoreHeld): below it the lazy-pages daemon's
// start costs more than copying the pages in.
const DefaultLazyRestoreMin = 128 << 20

// Driver implements driver.Driver with Linux namespaces.
type Driver struct {
	opts      Options
	cg        *cgroups.Manager
	oomWarned atomic.Bool
	// agent is a sealed, read-only memfd copy of AgentPath that every
	// sandbox's PID 1 is exec'd from, so /proc/1/exe and /proc/1/maps
	// inside show "/memfd:space-agent (deleted)" rather than a host path;
	// nil where memfds cannot be exec'd (then AgentPath itself is run).
	agent *os.File
	// idmaps holds a user namespace per pool block for the template's
	// idmapped mounts; nil without a Pool.
	idmaps *idmap.Cache

	// helper forks the sandboxes' PID 1 (see start); started on the first
	// Create, again after it died, not retried for a minute after a failed
	// start (helperFailed).
	helperMu     sync.Mutex
	helper       *spawner.Client
	helperFailed time.Time

	// CRIU, probed at the first checkpoint or restore.
	criuOnce sync.Once
	// uffdOnce/uffdOK: /dev/userfaultfd opens (lazy restores can run).
	uffdOnce sync.Once
	uffdOK   bool
	criuPath string
	criuErr  error
	// dumps bounds the CRIU dumps that run at once: each freezes its
	// sandbox while it runs, and thirty at once on two cores (periodic
	// checkpoints of a busy node) froze every sandbox for 10 s instead of
	// each for a quarter second in turn.
	dumps chan struct{}
}

var _ driver.Driver = (*Driver)(nil)

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// New checks the host and prepares the driver's dirs.
func New(opts Options) (*Driver, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("namespace: must run as root: %w", driver.ErrUnsupported)
	}
	if opts.StateDir == "" || opts.RunDir == "" || opts.AgentPath == "" {
		return nil, errors.New("namespace: StateDir, RunDir and AgentPath are required")
	}
	var err error
	for _, p := range []*string{&opts.StateDir, &opts.RunDir, &opts.AgentPath} {
		if *p, err = filepath.Abs(*p); err != nil {
			return nil, fmt.Errorf("namespace: %w", err)
		}
	}
	if opts.AgentArgs == nil {
		opts.AgentArgs = defaultAgentArgs
	}
	if opts.SpawnerArgs == nil {
		opts.SpawnerArgs = defaultSpawnerArgs
	}
	if opts.Env == nil {
		opts.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	}
	opts.Env = agentEnv(opts.Env)
	if opts.UIDBase == 0 {
		opts.UIDBase = DefaultUIDBase
	}
	if opts.UIDCount == 0 {
		opts.UIDCount = DefaultUIDCount
	}
	if opts.Pool != nil && (opts.UIDCount != uidpool.BlockSize || opts.Pool.Overlaps(opts.UIDBase, opts.UIDCount)) {
		return nil, fmt.Errorf("namespace: uid pool %s must not overlap the template range %d+%d, and sandboxes must have %d ids", opts.Pool, opts.UIDBase, opts.UIDCount, uidpool.BlockSize)
	}
	if opts.CheckpointTimeout <= 0 {
		opts.CheckpointTimeout = defaultCheckpointTimeout
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = defaultReadyTimeout
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if room := maxSocketPath - len(opts.RunDir) - len("/.sock"); room < 64 {
		if room < 16 {
			return nil, fmt.Errorf("namespace: RunDir %q too long for unix socket paths", opts.RunDir)
		}
		opts.Logf("namespace: RunDir %s leaves room for sandbox ids of %d bytes only", opts.RunDir, room)
	}
	if err := os.MkdirAll(opts.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	if err := os.MkdirAll(opts.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	// The sandbox's root is "other" on the host: it must be able to walk to
	// its overlay dirs and to the binary it execs.
	if err := ensureTraversable(opts.StateDir, opts.Logf); err != nil {
		return nil, err
	}
	if err := ensureTraversable(filepath.Dir(opts.AgentPath), opts.Logf); err != nil {
		return nil, err
	}
	fi, err := os.Stat(opts.AgentPath)
	if err != nil {
		return nil, fmt.Errorf("namespace: agent binary: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o001 == 0 {
		return nil, fmt.Errorf("namespace: agent binary %s must be a regular file executable by others (mode %v)", opts.AgentPath, fi.Mode())
	}
	var cg *cgroups.Manager
	if opts.CgroupParent != "" {
		cg, err = cgroups.NewUnder(opts.CgroupParent, opts.CgroupBase)
	} else {
		cg, err = cgroups.New(opts.CgroupBase)
	}
	if err != nil {
		return nil, fmt.Errorf("namespace: %w: %w", err, driver.ErrUnsupported)
	}
	opts.Logf("namespace driver: cgroups %s", cg)
	if w := cg.RestartWarning(); w != "" {
		opts.Logf("namespace driver: %s", w)
	}
	agent, err := agentMemfd(opts.AgentPath)
	if err != nil {
		opts.Logf("namespace: sandboxes run the agent from %s (no memfd copy: %v)", opts.AgentPath, err)
	}
	d := &Driver{opts: opts, cg: cg, agent: agent, dumps: make(chan struct{}, max(2, runtime.NumCPU()))}
	if opts.Pool != nil {
		d.idmaps = idmap.NewCache()
	}
	return d, nil
}

// agentMemfd copies the agent binary into a sealed memfd and returns it
// opened read-only (a file open for writing cannot be exec'd). One copy
// serves every sandbox of the driver: its pages are shared like any
// file's.
func agentMemfd(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	fd, err := unix.MemfdCreate("space-agent", flags|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) { // kernels before 6.3 know no MFD_EXEC
		fd, err = unix.MemfdCreate("space-agent", flags)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	rw := os.NewFile(uintptr(fd), "memfd:space-agent")
	defer rw.Close()
	if _, err := io.Copy(rw, src); err != nil {
		return nil, fmt.Errorf("copy agent: %w", err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	ro, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if fi, err := ro.Stat(); err != nil || fi.Mode().Perm()&0o001 == 0 {
		ro.Close()
		return nil, fmt.Errorf("memfd not executable by others (%v)", err)
	}
	return ro, nil
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return Name }

// Cgroups exposes the cgroup manager (e.g. for the node's metrics).
func (d *Driver) Cgroups() *cgroups.Manager { return d.cg }

func (d *Driver) sandboxDir(id string) string { return filepath.Join(d.opts.StateDir, id) }
func (d *Driver) sockPath(id string) string   { return filepath.Join(d.opts.RunDir, id+".sock") }

// upperDir is a sandbox's overlay upper dir: on its own disk where it has
// one.
func (d *Driver) upperDir(id string) string {
	dir := d.sandboxDir(id)
	if _, err := os.Lstat(filepath.Join(dir, diskImage)); err == nil {
		return filepath.Join(dir, diskMount, "upper")
	}
	return filepath.Join(dir, "upper")
}

// diskBytes is a spec's disk limit, else the default; 0 = none.
func (d *Driver) diskBytes(l driver.Limits) int64 {
	if l.DiskBytes > 0 {
		return l.DiskBytes
	}
	return d.opts.DefaultLimits.DiskBytes
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
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (_ driver.Instance, err error) {
	t0 := time.Now()
	id := spec.ID
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	lay, err := d.layout(ctx, spec, &undo)
	if err != nil {
		return nil, err
	}
	dir, cfg, uidBase, idmapped, diskTook := lay.dir, lay.cfg, lay.uidBase, lay.idmapped, lay.diskTook

	// 2. The agent's socket, created here so it never appears inside.
	sock := d.sockPath(id)
	undo.push(func() { _ = os.Remove(sock) })
	lnFile, err := listen(sock)
	if err != nil {
		return nil, err
	}
	defer lnFile.Close()

	syncR, syncW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	defer syncR.Close()
	defer syncW.Close()
	statR, statW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	defer statR.Close()
	defer statW.Close()
	logFile, err := os.OpenFile(filepath.Join(dir, "init.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	defer logFile.Close()

	// 3. PID 1 in new namespaces. No Pdeathsig: the sandbox must outlive
	// a restart of the node process.
	idMap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(uidBase), Size: int(d.opts.UIDCount)}}
	extra := []*os.File{lnFile, syncR, statW} // fds 3, 4, 5
	path := d.opts.AgentPath
	if d.agent != nil {
		// fd 6 (sandboxinit.AgentFD), opened by the child itself.
		extra = append(extra, d.agent)
		path = "/proc/self/fd/" + strconv.Itoa(sandboxinit.AgentFD)
	}
	cmd := &exec.Cmd{
		Path:       path,
		Args:       append(append([]string{"space"}, d.opts.AgentArgs...), cfg.Args()...),
		Env:        d.opts.Env,
		Dir:        dir, // cfg's relative paths resolve here
		Stdout:     logFile,
		Stderr:     logFile,
		ExtraFiles: extra,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID |
				unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWNET,
			UidMappings:                idMap,
			GidMappings:                idMap,
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
			Setsid:                     true,
		},
	}
	// The cgroup dirs and limits need no pid: make them while the kernel
	// clones and execs, then only the attach is left.
	var (
		group  *cgroups.Group
		cgErr  error
		cgTook time.Duration
		cgDone = make(chan struct{})
	)
	go func() {
		defer close(cgDone)
		t := time.Now()
		group, cgErr = d.cg.Create(id)
		if cgErr == nil {
			cgErr = group.SetLimits(d.limits(spec.Limits))
		}
		cgTook = time.Since(t)
	}()
	undo.push(func() {
		<-cgDone
		if group == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), defaultDestroyWait)
		defer cancel()
		if err := group.Destroy(ctx); err != nil {
			d.opts.Logf("namespace: %s: %v", id, err)
		}
	})

	var timing driver.Timing
	tStart := time.Now()
	proc, err := d.start(ctx, cmd, logFile)
	if err != nil {
		return nil, fmt.Errorf("namespace: start %s: %w", d.opts.AgentPath, err)
	}
	timing.Namespaces = time.Since(tStart)
	undo.push(func() {
		_ = proc.kill()
		select {
		case <-proc.done:
		case <-time.After(defaultDestroyWait):
			d.opts.Logf("namespace: %s: pid %d did not exit", id, proc.pid)
		}
	})
	// The child holds its own copies now.
	for _, f := range []*os.File{lnFile, syncR, statW, logFile} {
		_ = f.Close()
	}

	startTime, err := procStartTime(proc.pid)
	if err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	pidNS, err := pidNamespace(proc.pid)
	if err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	st := state{
		ID:        id,
		PID:       proc.pid,
		StartTime: startTime,
		PidNS:     pidNS,
		Socket:    sock,
		Cgroups:   d.cg.Paths(id),
		Created:   time.Now().UTC(),
		UIDBase:   uidBase,
	}
	if err := writeState(dir, st); err != nil {
		return nil, err
	}

	// 4. Cgroups and OOM protection, then release the child.
	<-cgDone
	if cgErr != nil {
		return nil, fmt.Errorf("namespace: %w", cgErr)
	}
	tcg := time.Now()
	if err := group.Attach(proc.pid); err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	// The agent must survive its sandbox's OOM kills (its commands are the
	// ones to go); children inherit this, so the agent resets it for them.
	// Lowering it needs CAP_SYS_RESOURCE, which some hosts withhold even
	// from root; then the agent merely competes on size (it is small).
	if err := os.WriteFile("/proc/"+strconv.Itoa(proc.pid)+"/oom_score_adj", []byte("-1000"), 0); err != nil {
		if !errors.Is(err, fs.ErrPermission) {
			return nil, fmt.Errorf("namespace: oom_score_adj: %w", err)
		}
		if d.oomWarned.CompareAndSwap(false, true) {
			d.opts.Logf("namespace: cannot protect agents from the OOM killer (no CAP_SYS_RESOURCE): %v", err)
		}
	}
	timing.Cgroups = cgTook + time.Since(tcg)

	if d.opts.Network != nil {
		tn := time.Now()
		if err := d.opts.Network(ctx, id, proc.pid); err != nil {
			return nil, fmt.Errorf("namespace: network: %w", err)
		}
		timing.Network = time.Since(tn)
	}

	if _, err := syncW.Write([]byte{1}); err != nil {
		return nil, fmt.Errorf("namespace: release init: %w", err)
	}
	_ = syncW.Close()

	// 5. Wait for init's status: setup done, filter installed, serving.
	_ = statR.SetReadDeadline(time.Now().Add(d.opts.ReadyTimeout))
	stop := context.AfterFunc(ctx, func() { _ = statR.SetReadDeadline(time.Now()) })
	it, err := sandboxinit.ReadStatus(statR)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		if errors.Is(err, sandboxinit.ErrNoStatus) {
			select {
			case <-proc.done:
				err = fmt.Errorf("%w: %v", err, proc.exitErr)
			case <-time.After(100 * time.Millisecond):
			}
		}
		return nil, fmt.Errorf("namespace: sandbox %s: %w%s", id, err, logTail(filepath.Join(dir, "init.log")))
	}
	timing.Overlay = diskTook + it.Mounts + it.Pivot
	timing.Network += it.Network
	timing.Hardening = it.Harden + it.Seccomp
	if idmapped {
		unmountLower(dir)
	}

	inst := &Instance{
		d:       d,
		id:      id,
		sock:    sock,
		groups:  []*cgroups.Group{group},
		proc:    proc,
		uidBase: uidBase,
	}
	if d.opts.Probe != nil {
		if err := d.opts.Probe(ctx, inst); err != nil {
			return nil, fmt.Errorf("namespace: sandbox %s: agent probe: %w", id, err)
		}
	}
	timing.AgentReady = time.Since(tStart)
	timing.Total = time.Since(t0)
	inst.timing = timing
	d.opts.Logf("namespace: created %s in %v (start %v, cgroups %v, ready %v; init: cgroupns %v, mounts %v, pivot %v, net %v, harden %v, seccomp %v)",
		id, timing.Total, timing.Namespaces, timing.Cgroups, timing.AgentReady,
		it.CgroupNS, it.Mounts, it.Pivot, it.Network, it.Harden, it.Seccomp)
	return inst, nil
}

// checkSpec checks a new sandbox's id and returns its hostname.
func (d *Driver) checkSpec(spec driver.Spec) (string, error) {
	if !idRE.MatchString(spec.ID) {
		return "", fmt.Errorf("namespace: invalid sandbox id %q", spec.ID)
	}
	if len(d.sockPath(spec.ID)) > maxSocketPath {
		return "", fmt.Errorf("namespace: socket path for %q too long; use a shorter RunDir", spec.ID)
	}
	if spec.Hostname != "" {
		return spec.Hostname, nil
	}
	return spec.ID, nil
}

// layout is a new sandbox's host side before anything of it runs.
type layout struct {
	dir      string
	hostname string
	hostPath func(string) string // a name relative to dir on the host
	cfg      sandboxinit.Config
	uidBase  uint32
	idmapped bool // lower is an idmapped mount the host must detach
	diskTook time.Duration
}

// layout checks spec and makes sandbox spec.ID's state dir, uid block,
// disk, overlay dirs and lower, and fills its writable layer
// (spec.InitLayer); undo receives the steps that take them back.
func (d *Driver) layout(ctx context.Context, spec driver.Spec, undo *cleanup) (lay layout, err error) {
	id := spec.ID
	hostname, err := d.checkSpec(spec)
	if err != nil {
		return lay, err
	}
	lay.hostname = hostname
	rootfs := filepath.Clean(spec.RootfsDir)
	if fi, err := os.Stat(rootfs); err != nil || !fi.IsDir() || !filepath.IsAbs(rootfs) {
		return lay, fmt.Errorf("namespace: rootfs %q is not an absolute directory path (%v)", spec.RootfsDir, err)
	}
	if err := ensureTraversable(filepath.Dir(rootfs), d.opts.Logf); err != nil {
		return lay, err
	}
	dir := d.sandboxDir(id)
	// Init runs in dir and gets names relative to it; the template is
	// linked in as "lower". Overlayfs shows its options in mountinfo as
	// given and /proc/1/cmdline is readable inside, so no host path may
	// appear in either.
	cfg := sandboxinit.Config{
		Rootfs:   "lower",
		Upper:    "upper",
		Work:     "work",
		Merged:   "merged",
		Hostname: hostname,
		ShmBytes: sandboxinit.ShmSize(spec.Limits.MemoryBytes),
	}
	if err := cfg.Validate(); err != nil {
		return lay, fmt.Errorf("namespace: %w", err)
	}
	hostPath := func(p string) string { return filepath.Join(dir, p) }
	lay.dir, lay.hostPath = dir, hostPath

	// 1. Host dirs. An existing dir means a live or leftover sandbox of
	// that id: refuse rather than clean up something that is not ours.
	if err := os.Mkdir(dir, 0o711); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return lay, fmt.Errorf("namespace: sandbox %s already exists", id)
		}
		return lay, fmt.Errorf("namespace: %w", err)
	}
	undo.push(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil { // umask
		return lay, fmt.Errorf("namespace: %w", err)
	}
	// The sandbox's host ids: its own block (owned by dir, which exists
	// from here until teardown), else the shared range.
	uidBase := d.opts.UIDBase
	if d.opts.Pool != nil {
		if uidBase, err = d.opts.Pool.Alloc(dir); err != nil {
			return lay, fmt.Errorf("namespace: %w", err)
		}
		b := uidBase
		undo.push(func() { _ = d.opts.Pool.Free(b, dir) })
	}
	// With a disk limit, upper and work live on the sandbox's own
	// filesystem of that size (still named relative to dir).
	var diskTook time.Duration
	if size := d.diskBytes(spec.Limits); size > 0 {
		if d.opts.Disks == nil {
			return lay, fmt.Errorf("namespace: a disk limit needs disk images (none configured): %w", driver.ErrUnsupported)
		}
		td := time.Now()
		if err := os.Mkdir(hostPath(diskMount), 0o755); err != nil {
			return lay, fmt.Errorf("namespace: %w", err)
		}
		if err := d.opts.Disks.Create(ctx, hostPath(diskImage), hostPath(diskMount), size); err != nil {
			return lay, fmt.Errorf("namespace: %w", err)
		}
		undo.push(func() { _ = diskquota.Remove(hostPath(diskImage), hostPath(diskMount)) })
		cfg.Upper, cfg.Work = diskMount+"/upper", diskMount+"/work"
		diskTook = time.Since(td)
	}
	for _, p := range []string{cfg.Upper, cfg.Work, cfg.Merged} {
		if err := os.Mkdir(hostPath(p), 0o755); err != nil {
			return lay, fmt.Errorf("namespace: %w", err)
		}
	}
	idmapped := uidBase != d.opts.UIDBase
	if idmapped {
		// The template through an idmapped mount onto the sandbox's block.
		// The child's mount namespace copies it at clone; the host's copy
		// is detached once the sandbox is ready: init makes its mounts
		// private first thing, and until then a host unmount could
		// propagate into its copy (a shared host root makes it a slave).
		if err := d.mountLower(rootfs, hostPath(cfg.Rootfs), uidBase); err != nil {
			return lay, fmt.Errorf("namespace: %w", err)
		}
		undo.push(func() { unmountLower(dir) })
	} else if err := os.Symlink(rootfs, hostPath(cfg.Rootfs)); err != nil {
		return lay, fmt.Errorf("namespace: %w", err)
	}
	// Overlay needs upper and work owned by the sandbox's root.
	for _, p := range []string{cfg.Upper, cfg.Work} {
		if err := os.Lchown(hostPath(p), int(uidBase), int(uidBase)); err != nil {
			return lay, fmt.Errorf("namespace: %w", err)
		}
	}
	// A restored layer is written while nothing of the sandbox runs yet.
	if spec.InitLayer != nil {
		if err := spec.InitLayer(ctx, driver.Layer{Dir: hostPath(cfg.Upper), UIDBase: uidBase, UIDCount: d.opts.UIDCount}); err != nil {
			return lay, fmt.Errorf("namespace: init layer: %w", err)
		}
	}

	lay.cfg, lay.uidBase, lay.idmapped, lay.diskTook = cfg, uidBase, idmapped, diskTook
	return lay, nil
}

// listen makes the agent's listening socket at sock (replacing a stale
// file) and returns it as a file to pass on.
func listen(sock string) (*os.File, error) {
	_ = os.Remove(sock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("namespace: listen: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	_ = ln.Close()
	if err != nil {
		return nil, fmt.Errorf("namespace: listener fd: %w", err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("namespace: %w", err)
	}
	return f, nil
}

// logTail returns the end of init's log for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return "; init.log: " + string(b)
}

// ensureTraversable adds search permission for others to dir and every
// parent lacking it: the sandbox's root is an unprivileged "other" user on
// the host and has to walk these paths.
func ensureTraversable(dir string, logf func(string, ...any)) error {
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("namespace: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(p, fi.Mode()|0o001); err != nil {
				return fmt.Errorf("namespace: %w", err)
			}
			logf("namespace: added o+x to %s so sandboxes can reach their files", p)
		}
		if p == "/" {
			return nil
		}
	}
}

// mountLower attaches the template at dst as the sandbox with host ids
// uidBase.. sees it: its files, stored as UIDBase.., owned by uidBase...
// Close stops the fork helper (driver.Closer); sandboxes keep running, and
// a later Create starts a new helper.
func (d *Driver) Close() {
	d.helperMu.Lock()
	defer d.helperMu.Unlock()
	if d.helper != nil {
		d.helper.Close()
		d.helper = nil
	}
}

// start starts a sandbox's PID 1 (cmd, whose Stdout and Stderr are log)
// through the fork helper: a fork from the server copies the page tables
// of the whole server process, the helper's a few MiB (internal/spawner).
// Without a helper (DirectFork, or it cannot start) the server forks.
func (d *Driver) start(ctx context.Context, cmd *exec.Cmd, log *os.File) (*process, error) {
	if h := d.forkHelper(ctx); h != nil {
		req := spawner.Request{Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, Attr: *cmd.SysProcAttr}
		sp, err := h.Spawn(ctx, req, append([]*os.File{log, log}, cmd.ExtraFiles...))
		if err == nil {
			return newSpawned(sp)
		}
		if !spawner.IsHelperFailure(err) {
			return nil, err
		}
		// The request never reached it: nothing was started.
		d.opts.Logf("namespace: fork helper gone, forking from this process: %v", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return newChild(cmd), nil
}

// forkHelper returns the running fork helper, starting one if needed; nil
// means fork directly.
func (d *Driver) forkHelper(ctx context.Context) *spawner.Client {
	if d.opts.DirectFork {
		return nil
	}
	d.helperMu.Lock()
	defer d.helperMu.Unlock()
	if d.helper != nil && d.helper.Alive() {
		return d.helper
	}
	if d.helper != nil {
		d.helper.Close()
		d.helper = nil
	}
	if time.Since(d.helperFailed) < time.Minute {
		return nil
	}
	h, err := spawner.Start(ctx, d.opts.AgentPath, d.opts.SpawnerArgs)
	if err != nil {
		d.helperFailed = time.Now()
		d.opts.Logf("namespace: no fork helper, sandboxes are forked from this process: %v", err)
		return nil
	}
	d.helper = h
	return h
}

func (d *Driver) mountLower(rootfs, dst string, uidBase uint32) error {
	return d.idmaps.MountAt(rootfs, dst, idmap.Mapping{From: d.opts.UIDBase, To: uidBase, Count: d.opts.UIDCount})
}

// unmountLower detaches the host's copy of a sandbox's idmapped template,
// if it has one (a create interrupted between mount and clone).
func unmountLower(dir string) {
	_ = unix.Unmount(filepath.Join(dir, "lower"), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
}

// agentEnv is env with GOMAXPROCS=1 added unless env sets it. PID 1 is
// I/O-bound and idle most of its life; with one P the Go runtime starts
// fewer threads (every one is covered by the hardening's all-thread calls
// and read-backs, and costs kernel and runtime memory for the sandbox's
// life) and keeps one P's caches instead of one per CPU: about 0.25 MiB
// less charged per idle sandbox and a faster hardening on two CPUs
// (docs/PERFORMANCE.md, stop 45). It is set in the environment, not with
// runtime.GOMAXPROCS, because the runtime sizes itself before main runs.
// Commands never inherit the agent's environment (agent.buildEnv).
func agentEnv(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return env
		}
	}
	return append(slices.Clip(env), "GOMAXPROCS=1")
}
