// Package qemu is the QEMU microVM driver: each sandbox is a
// qemu-system-x86_64 process running `-M microvm` (KVM where /dev/kvm
// works, TCG otherwise) that boots the guest image from internal/vmimage:
// an uncompressed kernel (PVH entry), an initramfs with busybox and the
// virtio/ext4/overlay modules, the template as a read-only ext4
// disk shared by every VM of that template, and a per-sandbox blank ext4
// disk that takes the sandbox's writes (an overlay inside the guest), and a
// small read-only disk with the `space` binary (the agent).
//
// The agent is reached over one virtio-serial port whose host end is a
// unix socket (QEMU's `-chardev socket,server=on`). A port is a single byte
// stream, while the agent speaks HTTP/1.1 and Instance.Dial must return
// independent connections, so the driver multiplexes streams over the port
// with vmux (a small framed protocol with per-stream flow control). Hosts
// with vhost-vsock could use vsock instead; this one has none.
//
// A VM has no network device: it reaches nothing but the agent transport.
// QEMU runs in its own session, so sandboxes survive a restart of the node
// process and are re-adopted with Attach.
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/consolelog"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/qemu/vmux"
	"github.com/space-sandbox/space/internal/vmimage"
)

// Name is the driver's name.
const Name = "qemu"

// PortName is the virtio-serial port the agent serves on.
const PortName = "space.agent"

// Defaults.
const (
	DefaultMemoryMiB    = 256
	DefaultUpperSize    = 2 << 30
	defaultReadyTimeout = 60 * time.Second
	// guestOverheadMiB is added to a spec's memory limit: the guest
	// kernel, its page structures and the initramfs (busybox and modules,
	// held in RAM) must not eat the sandbox's share.
	guestOverheadMiB = 64
	maxSocketPath    = 107
	handshakeTimeout = 2 * time.Second
	// tcgBufferMiB bounds TCG's translated-code cache (QEMU's default is
	// 1 GiB, filled lazily), so the host budget below holds.
	tcgBufferMiB = 128
	// qemuOverheadMiB is QEMU's own memory besides guest RAM and the
	// TCG buffer (binary, device state, I/O buffers, page cache of
	// its disk writes, which the cgroup reclaims first).
	qemuOverheadMiB = 128
	// qemuMaxThreads bounds QEMU's threads on the host (vCPUs, I/O
	// workers: its thread pool grows to 64).
	qemuMaxThreads = 256
)

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// hostnameRE keeps the hostname a single, harmless kernel command line word.
var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$`)

// Options configure the driver.
type Options struct {
	// StateDir holds one dir per sandbox (upper.ext4, console/console.log
	// on a bounded tmpfs, state.json) and the image cache in StateDir/_images.
	StateDir string
	// RunDir holds the agent and QMP sockets; keep it short (sun_path).
	RunDir string
	// AgentPath is the static `space` binary put in the guest's initramfs.
	AgentPath string
	// QEMU is the qemu-system-x86_64 binary; default from PATH.
	QEMU string
	// Kernel is a vmlinux or an XZ bzImage; ModulesDir its
	// /lib/modules/<release>. Default: the newest /boot/vmlinuz-* with
	// modules.
	Kernel, ModulesDir string
	// Busybox is a static busybox; default /bin/busybox.
	Busybox string
	// Accel is "kvm", "tcg" or "" (KVM when /dev/kvm opens, else TCG).
	Accel string
	// MemoryMiB and CPUs size a VM when the spec's limits do not; default
	// 256 MiB and 1.
	MemoryMiB, CPUs int
	// UpperSize is the size of each sandbox's (sparse) writable disk.
	UpperSize int64
	// ReadyTimeout bounds boot to agent ready; default 60s (TCG boots take
	// ≈ 2.5 s on an idle host, far more on a loaded one).
	ReadyTimeout time.Duration
	// CgroupBase names the cgroup directory of the VMs (below the node's
	// own cgroup in every hierarchy); default "space-qemu".
	CgroupBase string
	// Network, if set, gives every VM a NIC: QEMU runs in a network
	// namespace of its own, Network sets that namespace up (pid is
	// QEMU's; the egress gateway's link and rules, as for a namespace
	// sandbox's PID 1), and the driver routes the guest's tap onto it.
	Network func(ctx context.Context, id string, pid int) error
	Logf    func(format string, args ...any)
}

// Driver implements driver.Driver with QEMU microVMs.
type Driver struct {
	opts Options
	cg   *cgroups.Manager

	imgMu   sync.Mutex
	boot    *bootFiles         // vmlinux + initramfs, built once
	disks   *vmimage.RootDisks // per template, shared by its VMs
	running sync.Map           // id -> *exec.Cmd of VMs this process started
}

type bootFiles struct{ vmlinux, initramfs, agentDisk string }

var _ driver.Driver = (*Driver)(nil)

// KVMUsable reports whether KVM can run guests here (see
// vmimage.KVMUsable).
func KVMUsable() bool { return vmimage.KVMUsable() }

// New checks the host and prepares the driver's dirs. It fails with
// driver.ErrUnsupported when QEMU or a kernel is missing.
func New(opts Options) (*Driver, error) {
	if opts.StateDir == "" || opts.RunDir == "" || opts.AgentPath == "" {
		return nil, errors.New("qemu: StateDir, RunDir and AgentPath are required")
	}
	var err error
	for _, p := range []*string{&opts.StateDir, &opts.RunDir, &opts.AgentPath} {
		if *p, err = filepath.Abs(*p); err != nil {
			return nil, fmt.Errorf("qemu: %w", err)
		}
	}
	if opts.QEMU == "" {
		if opts.QEMU, err = exec.LookPath("qemu-system-x86_64"); err != nil {
			return nil, fmt.Errorf("qemu: qemu-system-x86_64 not found (apt-get install qemu-system-x86, or scripts/vm-deps.sh): %w", driver.ErrUnsupported)
		}
	}
	if opts.Kernel == "" {
		if opts.Kernel, opts.ModulesDir, err = vmimage.FindKernel("/boot", "/lib/modules"); err != nil {
			return nil, fmt.Errorf("qemu: %w: %w", err, driver.ErrUnsupported)
		}
	}
	if opts.ModulesDir == "" {
		return nil, errors.New("qemu: ModulesDir is required with Kernel")
	}
	if opts.Busybox == "" {
		opts.Busybox = "/bin/busybox"
	}
	for _, p := range []string{opts.Kernel, opts.Busybox, opts.AgentPath} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("qemu: %w: %w", err, driver.ErrUnsupported)
		}
	}
	switch opts.Accel {
	case "":
		opts.Accel = "tcg"
		if KVMUsable() {
			opts.Accel = "kvm"
		}
	case "kvm", "tcg":
	default:
		return nil, fmt.Errorf("qemu: unknown accelerator %q", opts.Accel)
	}
	if opts.MemoryMiB <= 0 {
		opts.MemoryMiB = DefaultMemoryMiB
	}
	if opts.CPUs <= 0 {
		opts.CPUs = 1
	}
	if opts.UpperSize <= 0 {
		opts.UpperSize = DefaultUpperSize
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = defaultReadyTimeout
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if room := maxSocketPath - len(opts.RunDir) - len("/.agent"); room < 16 {
		return nil, fmt.Errorf("qemu: RunDir %q too long for unix socket paths", opts.RunDir)
	}
	if opts.CgroupBase == "" {
		opts.CgroupBase = "space-qemu"
	}
	cg, err := cgroups.New(opts.CgroupBase)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	for _, d := range []string{opts.StateDir, opts.RunDir, filepath.Join(opts.StateDir, "_images")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("qemu: %w", err)
		}
	}
	d := &Driver{opts: opts, cg: cg}
	d.disks = &vmimage.RootDisks{Dir: d.imageDir()}
	return d, nil
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return Name }

// Accel is the accelerator VMs run under ("kvm" or "tcg").
func (d *Driver) Accel() string { return d.opts.Accel }

func (d *Driver) sandboxDir(id string) string { return filepath.Join(d.opts.StateDir, id) }
func (d *Driver) agentSock(id string) string  { return filepath.Join(d.opts.RunDir, id+".agent") }
func (d *Driver) qmpSock(id string) string    { return filepath.Join(d.opts.RunDir, id+".qmp") }
func (d *Driver) imageDir() string            { return filepath.Join(d.opts.StateDir, "_images") }

// bootFiles builds (once, cached on disk) the vmlinux and the initramfs.
func (d *Driver) bootFiles(ctx context.Context) (*bootFiles, error) {
	d.imgMu.Lock()
	defer d.imgMu.Unlock()
	if d.boot != nil {
		return d.boot, nil
	}
	bb, err := vmimage.BuildBoot(ctx, vmimage.BootSpec{Dir: d.imageDir(), Kernel: d.opts.Kernel,
		Busybox: d.opts.Busybox, ModDir: d.opts.ModulesDir, AgentPath: d.opts.AgentPath,
		AgentArgs: []string{"--serial", PortName}, Flavor: ""})
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	d.boot = &bootFiles{vmlinux: bb.Vmlinux, initramfs: bb.Initramfs, agentDisk: bb.AgentDisk}
	return d.boot, nil
}

// rootDisk returns the template's read-only ext4 image, building it once.
func (d *Driver) rootDisk(ctx context.Context, rootfs string) (string, error) {
	p, err := d.disks.Get(ctx, rootfs)
	if err != nil {
		return "", fmt.Errorf("qemu: %w", err)
	}
	return p, nil
}

// vmConfig is everything the QEMU command line is made from besides the
// sandbox's id and dir. A checkpoint keeps it: an incoming migration needs
// the same machine as the one that was saved.
type vmConfig struct {
	Hostname  string `json:"hostname,omitempty"`
	MemoryMiB int    `json:"memory_mib"`
	CPUs      int    `json:"cpus"`
	Vmlinux   string `json:"vmlinux"`
	Initramfs string `json:"initramfs"`
	AgentDisk string `json:"agent_disk"`
	RootDisk  string `json:"root_disk"`
	Net       bool   `json:"net,omitempty"`
}

// state is what a sandbox leaves on disk for Attach and Sweep.
type state struct {
	PID       int           `json:"pid"`
	StartTime uint64        `json:"start_time"`
	MemoryMiB int           `json:"memory_mib"` // boot size
	CPUs      int           `json:"cpus"`
	VM        vmConfig      `json:"vm"`
	Cgroups   cgroups.Paths `json:"cgroups"`
	// BalloonMiB is the guest size SetLimits asked for (0: boot size).
	BalloonMiB int           `json:"balloon_mib,omitempty"`
	Limits     driver.Limits `json:"limits"`
}

func (d *Driver) readState(id string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(d.sandboxDir(id), "state.json"))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

func (d *Driver) writeState(id string, st state) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	tmp := filepath.Join(d.sandboxDir(id), "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(d.sandboxDir(id), "state.json")); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	return nil
}

type cleanup []func()

func (c *cleanup) push(f func()) { *c = append(*c, f) }

func (c *cleanup) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

func (d *Driver) vmSize(l driver.Limits) (memMiB, cpus int) {
	memMiB, cpus = d.opts.MemoryMiB, d.opts.CPUs
	if l.MemoryBytes > 0 {
		memMiB = int(l.MemoryBytes>>20) + guestOverheadMiB
	}
	if l.CPUMillis > 0 {
		cpus = max(int((l.CPUMillis+999)/1000), 1)
	}
	return memMiB, cpus
}

// hostLimits is the host cgroup budget of a VM whose guest has memMiB:
// the guest's RAM, TCG's code buffer and QEMU's own memory; QEMU's
// threads (vCPUs, I/O workers) bounded by a fixed number, because the
// sandbox's own tasks live in the guest kernel; CPU bandwidth as asked.
func (d *Driver) hostLimits(memMiB int, l driver.Limits) cgroups.Limits {
	mem := memMiB + qemuOverheadMiB
	if d.opts.Accel == "tcg" {
		mem += tcgBufferMiB
	}
	return cgroups.Limits{MemoryBytes: int64(mem) << 20, CPUMillis: l.CPUMillis, Pids: qemuMaxThreads}
}

// Create implements driver.Driver.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (_ driver.Instance, err error) {
	t0 := time.Now()
	if !idRE.MatchString(spec.ID) {
		return nil, fmt.Errorf("qemu: bad sandbox id %q", spec.ID)
	}
	if spec.Hostname != "" && !hostnameRE.MatchString(spec.Hostname) {
		return nil, fmt.Errorf("qemu: bad hostname %q", spec.Hostname)
	}
	if spec.InitLayer != nil {
		return nil, fmt.Errorf("qemu: restoring a writable layer: %w", driver.ErrUnsupported)
	}
	if fi, err := os.Stat(spec.RootfsDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("qemu: rootfs %q is not a directory", spec.RootfsDir)
	}
	id := spec.ID
	dir := d.sandboxDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("qemu: sandbox %s already exists", id)
		}
		return nil, fmt.Errorf("qemu: %w", err)
	}
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	undo.push(func() { _ = d.remove(context.Background(), id) })

	boot, err := d.bootFiles(ctx)
	if err != nil {
		return nil, err
	}
	root, err := d.rootDisk(ctx, spec.RootfsDir)
	if err != nil {
		return nil, err
	}
	if err := vmimage.BlankDisk(ctx, filepath.Join(dir, "upper.ext4"), vmimage.WritableSize(spec.Limits.DiskBytes, d.opts.UpperSize)); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	tDisk := time.Now()
	memMiB, cpus := d.vmSize(spec.Limits)
	cfg := vmConfig{Hostname: spec.Hostname, MemoryMiB: memMiB, CPUs: cpus, Vmlinux: boot.vmlinux,
		Initramfs: boot.initramfs, AgentDisk: boot.agentDisk, RootDisk: root, Net: d.opts.Network != nil}
	inst, err := d.launch(ctx, id, cfg, nil, spec.Limits)
	if err != nil {
		return nil, err
	}
	inst.timing = driver.Timing{Overlay: tDisk.Sub(t0), Network: inst.timing.Network, Cgroups: inst.timing.Cgroups,
		AgentReady: time.Since(tDisk), Total: time.Since(t0)}
	d.opts.Logf("qemu: sandbox %s ready in %v (%s, %d MiB, %d vCPU)", id, inst.timing.Total, d.opts.Accel, memMiB, cpus)
	return inst, nil
}

// Guest-side addressing of a VM's NIC. Every VM has the same: the NIC is
// a tap in QEMU's own network namespace, which routes and masquerades it
// onto the sandbox's veth (the egress gateway's link), so a restored or
// forked VM keeps a valid address whatever link it lands on.
const (
	tapName  = "vmtap0"
	tapAddr  = "169.254.0.1/30"
	guestNet = "169.254.0.2/30,169.254.0.1"
	guestMAC = "52:54:00:00:00:02"
	tapMAC   = "52:54:00:00:00:01"
)

// args is the QEMU command line of sandbox id.
func (d *Driver) args(id string, cfg vmConfig) []string {
	dir := d.sandboxDir(id)
	cmdline := "console=ttyS0 quiet panic=-1 tsc_early_khz=2000000 no_timer_check reboot=t"
	if cfg.Hostname != "" {
		cmdline += " space.hostname=" + cfg.Hostname
	}
	if cfg.Net {
		cmdline += " space.net=" + guestNet
	}
	accel := d.opts.Accel
	if accel == "tcg" {
		accel += ",tb-size=" + strconv.Itoa(tcgBufferMiB)
	}
	args := []string{
		"-name", "space-" + id,
		"-M", "microvm,x-option-roms=off,rtc=off,isa-serial=on",
		"-accel", accel,
		"-m", strconv.Itoa(cfg.MemoryMiB), "-smp", strconv.Itoa(cfg.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		// Stopped until the host has placed it in its cgroup and network.
		"-S",
		// Guest root can write the serial port without end: the file is
		// bounded (consolelog).
		"-serial", "file:" + consolelog.Path(dir, "console.log"),
		"-kernel", cfg.Vmlinux, "-initrd", cfg.Initramfs, "-append", cmdline,
		"-drive", "id=root,if=none,format=raw,readonly=on,file=" + cfg.RootDisk,
		"-device", "virtio-blk-device,drive=root,serial=" + vmimage.SerialRoot,
		"-drive", "id=upper,if=none,format=raw,file=" + filepath.Join(dir, "upper.ext4"),
		"-device", "virtio-blk-device,drive=upper,serial=" + vmimage.SerialUpper,
		"-drive", "id=agent,if=none,format=raw,readonly=on,file=" + cfg.AgentDisk,
		"-device", "virtio-blk-device,drive=agent,serial=" + vmimage.SerialAgent,
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path=" + d.agentSock(id) + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=" + PortName,
		"-device", "virtio-balloon-device,id=balloon0",
		"-qmp", "unix:" + d.qmpSock(id) + ",server=on,wait=off",
	}
	if cfg.Net {
		args = append(args,
			"-netdev", "tap,id=net0,ifname="+tapName+",script=no,downscript=no",
			"-device", "virtio-net-device,netdev=net0,mac="+guestMAC)
	}
	return args
}

// launch starts QEMU for sandbox id (whose dir holds upper.ext4), stopped;
// puts it in its cgroup and network; loads incoming (a saved migration
// stream) if given; lets it run and waits for its agent. On error the
// caller removes the sandbox.
func (d *Driver) launch(ctx context.Context, id string, cfg vmConfig, incoming *os.File, l driver.Limits) (*Instance, error) {
	dir := d.sandboxDir(id)
	agentSock, qmpSock := d.agentSock(id), d.qmpSock(id)
	_ = os.Remove(agentSock)
	_ = os.Remove(qmpSock)
	if err := consolelog.Mount(dir); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	args := d.args(id, cfg)
	if incoming != nil {
		// fd 3 in QEMU: the first of ExtraFiles.
		args = append(args, "-incoming", "fd:3")
	}
	logf, err := os.Create(filepath.Join(dir, "qemu.log"))
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	cmd := exec.Command(d.opts.QEMU, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if incoming != nil {
		cmd.ExtraFiles = []*os.File{incoming}
	}
	// Its own session: the VM outlives the node process (Attach). Its own
	// network namespace when it has a NIC: the tap lives there, and that
	// namespace is what the egress network sets up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cfg.Net {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return nil, fmt.Errorf("qemu: start: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	d.running.Store(id, exited)
	start, _, err := procStat(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("qemu: %w", err)
	}
	st := state{PID: cmd.Process.Pid, StartTime: start, MemoryMiB: cfg.MemoryMiB, CPUs: cfg.CPUs, VM: cfg,
		Cgroups: d.cg.Paths(id), Limits: l}
	if err := d.writeState(id, st); err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	inst := d.newInstance(id, st, exited)

	tcg := time.Now()
	g, err := d.cg.Create(id)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	// CPU bandwidth applies once the agent is ready: the guest kernel's
	// boot is the platform's cost, not the sandbox's.
	if err := g.SetLimits(d.hostLimits(cfg.MemoryMiB, driver.Limits{})); err != nil {
		return nil, fmt.Errorf("qemu: cgroup: %w", err)
	}
	if err := g.Attach(st.PID); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	inst.timing.Cgroups = time.Since(tcg)
	q, err := dialQMP(ctx, qmpSock, exited)
	if err != nil {
		return nil, fmt.Errorf("qemu: sandbox %s: %w%s", id, err, d.logTail(id))
	}
	// QMP answers once QEMU has made its devices, the tap included.
	if cfg.Net {
		tn := time.Now()
		if err := d.opts.Network(ctx, id, st.PID); err != nil {
			q.Close()
			return nil, fmt.Errorf("qemu: network: %w", err)
		}
		if err := routeTap(st.PID); err != nil {
			q.Close()
			return nil, fmt.Errorf("qemu: network: %w", err)
		}
		inst.timing.Network = time.Since(tn)
	}
	if incoming != nil {
		if err := waitIncoming(ctx, q, exited); err != nil {
			q.Close()
			return nil, fmt.Errorf("qemu: sandbox %s: restore: %w%s", id, err, d.logTail(id))
		}
	}
	if err := q.run("cont", nil, nil); err != nil {
		q.Close()
		return nil, fmt.Errorf("qemu: sandbox %s: %w", id, err)
	}
	// QEMU serves one QMP client at a time: let go before the wait.
	q.Close()
	rctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	attempt := time.Duration(0)
	if incoming != nil {
		// The restored guest may hold half a frame of the session that
		// was open when it was saved; bound each handshake, as Attach does.
		attempt = 3 * time.Second
	}
	if err := inst.waitReady(rctx, attempt); err != nil {
		return nil, fmt.Errorf("qemu: sandbox %s: agent not ready: %w%s", id, err, d.logTail(id))
	}
	if err := g.SetLimits(d.hostLimits(cfg.MemoryMiB, l)); err != nil {
		return nil, fmt.Errorf("qemu: cgroup: %w", err)
	}
	return inst, nil
}

// waitIncoming waits until an incoming migration has loaded (QEMU started
// with -S stays paused after it).
func waitIncoming(ctx context.Context, q *qmpConn, exited <-chan struct{}) error {
	for {
		st, err := q.status()
		if err != nil {
			return err
		}
		if st != "inmigrate" && st != "prelaunch" {
			if st != "paused" {
				return fmt.Errorf("VM in state %q after loading", st)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return errors.New("the VM exited while loading")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (d *Driver) logTail(id string) string {
	var parts []string
	for _, f := range []string{consolelog.Path(d.sandboxDir(id), "console.log"), filepath.Join(d.sandboxDir(id), "qemu.log")} {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue
		}
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		parts = append(parts, filepath.Base(f)+": "+strings.TrimSpace(string(b)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "\n" + strings.Join(parts, "\n")
}

// Attach implements driver.Driver.
func (d *Driver) Attach(ctx context.Context, id string) (driver.Instance, error) {
	if !idRE.MatchString(id) {
		return nil, fmt.Errorf("qemu: %s: %w", id, driver.ErrNotFound)
	}
	st, err := d.readState(id)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(d.sandboxDir(id)); serr == nil {
			_ = d.remove(ctx, id)
			return nil, fmt.Errorf("qemu: %s: no state (half-created): %w", id, driver.ErrLost)
		}
		return nil, fmt.Errorf("qemu: %s: %w", id, driver.ErrNotFound)
	}
	if err != nil {
		_ = d.remove(ctx, id)
		return nil, fmt.Errorf("qemu: %s: state: %v: %w", id, err, driver.ErrLost)
	}
	if !d.alive(st) {
		_ = d.remove(ctx, id)
		return nil, fmt.Errorf("qemu: %s: the VM process is gone: %w", id, driver.ErrLost)
	}
	var exited <-chan struct{}
	if c, ok := d.running.Load(id); ok {
		exited = c.(chan struct{})
	}
	inst := d.newInstance(id, st, exited)
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := inst.waitReady(hctx, 3*time.Second); err != nil {
		_ = d.remove(ctx, id)
		return nil, fmt.Errorf("qemu: %s: agent does not answer: %v: %w", id, err, driver.ErrLost)
	}
	return inst, nil
}

// alive reports whether st's process is still the VM it started.
func (d *Driver) alive(st state) bool {
	start, zombie, err := procStat(st.PID)
	return err == nil && !zombie && start == st.StartTime
}

// remove kills the VM (if its recorded process is still it) and deletes
// everything the sandbox had on the host.
func (d *Driver) remove(ctx context.Context, id string) error {
	if st, err := d.readState(id); err == nil && d.alive(st) {
		_ = unix.Kill(st.PID, unix.SIGKILL)
		var exited <-chan struct{}
		if c, ok := d.running.Load(id); ok {
			exited = c.(chan struct{})
		}
		if err := waitGone(ctx, st, exited, d); err != nil {
			return fmt.Errorf("qemu: %s: %w", id, err)
		}
	}
	d.running.Delete(id)
	var errs []error
	// The cgroup: whatever is still in it dies (a QEMU whose state file
	// was lost), then the group goes.
	g := d.cg.Open(d.cg.Paths(id))
	if err := g.Kill(ctx); err != nil {
		errs = append(errs, err)
	} else if err := g.Remove(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, p := range []string{d.agentSock(id), d.qmpSock(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := consolelog.Unmount(d.sandboxDir(id)); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.sandboxDir(id)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func waitGone(ctx context.Context, st state, exited <-chan struct{}, d *Driver) error {
	if exited != nil {
		select {
		case <-exited:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for d.alive(st) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// Sweep implements driver.Driver.
func (d *Driver) Sweep(ctx context.Context, keep map[string]bool) error {
	ents, err := os.ReadDir(d.opts.StateDir)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	var errs []error
	for _, e := range ents {
		id := e.Name()
		if !idRE.MatchString(id) || keep[id] {
			continue
		}
		if err := d.remove(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	// Groups whose sandbox dir is already gone.
	if ids, err := d.cg.List(); err == nil {
		for _, id := range ids {
			if keep[id] || !idRE.MatchString(id) {
				continue
			}
			if _, err := os.Stat(d.sandboxDir(id)); errors.Is(err, fs.ErrNotExist) {
				if err := d.remove(ctx, id); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	// Sockets whose sandbox dir is already gone.
	socks, _ := os.ReadDir(d.opts.RunDir)
	for _, s := range socks {
		id := strings.TrimSuffix(strings.TrimSuffix(s.Name(), ".agent"), ".qmp")
		if id == s.Name() || keep[id] || !idRE.MatchString(id) {
			continue
		}
		if _, err := os.Stat(d.sandboxDir(id)); errors.Is(err, fs.ErrNotExist) {
			_ = os.Remove(filepath.Join(d.opts.RunDir, s.Name()))
		}
	}
	return errors.Join(errs...)
}

// procStat returns a process's start time (field 22 of /proc/<pid>/stat)
// and whether it is a zombie.
func procStat(pid int) (start uint64, zombie bool, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false, fmt.Errorf("qemu: bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, false, fmt.Errorf("qemu: bad /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, f[0] == "Z", err
}

// dialSession connects to the agent socket and runs the vmux handshake.
// A guest under TCG on a loaded host can take longer than one bound to
// answer (the handshake after a restore failed at 2 s in CI), and a failed
// attempt leaves nothing behind in the guest (its listener sees the
// disconnect and waits for the next handshake), so it tries again with the
// bound doubled, up to handshakeAttempts, within ctx.
func dialSession(ctx context.Context, sock string) (*vmux.Session, error) {
	timeout := handshakeTimeout
	var err error
	for n := 0; n < handshakeAttempts; n++ {
		var s *vmux.Session
		if s, err = dialOnce(ctx, sock, timeout); err == nil {
			return s, nil
		}
		if ctx.Err() != nil || !isTimeout(err) {
			break
		}
		timeout *= 2
	}
	return nil, err
}

// handshakeAttempts bounds dialSession's tries: 2+4+8 s in all.
const handshakeAttempts = 3

func dialOnce(ctx context.Context, sock string, timeout time.Duration) (*vmux.Session, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	s, err := vmux.Client(c, timeout)
	if err != nil {
		c.Close()
		return nil, err
	}
	return s, nil
}

// isTimeout reports whether err is a deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// health runs GET /health over inst.
func health(ctx context.Context, inst driver.Instance) error {
	c := client.New(inst.Dial)
	defer c.Close()
	return c.Health(ctx)
}
