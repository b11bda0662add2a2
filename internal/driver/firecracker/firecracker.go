// Package firecracker is the Firecracker microVM driver, the production
// driver for hosts with KVM. It drives the firecracker binary (optionally
// under the jailer: chroot, uid/gid, cgroups, seccomp) through its REST API
// on a unix socket with github.com/firecracker-microvm/firecracker-go-sdk,
// boots the same guest image as the qemu driver (internal/vmimage: vmlinux,
// initramfs, a read-only template disk, a small agent disk and a blank
// per-sandbox writable disk) and reaches the agent over virtio-vsock: the
// host side is Firecracker's unix socket with its `CONNECT <port>`
// handshake, and every connection is an independent agent connection.
//
// It cannot run on the development hosts (no usable KVM, no firecracker
// binary): there its request sequence is unit-tested against a fake API
// socket, and New refuses with driver.ErrUnsupported.
package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sdk "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/consolelog"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/vmimage"
)

// Name is the driver's name.
const Name = "firecracker"

// AgentPort is the vsock port the agent listens on in the guest.
const AgentPort = 1024

// guestCID is every guest's vsock context id; each VM has its own vsock
// device and host socket, so they need not differ.
const guestCID = 3

// Defaults.
const (
	DefaultMemoryMiB    = 256
	DefaultUpperSize    = 2 << 30
	defaultReadyTimeout = 10 * time.Second
	guestOverheadMiB    = 64
)

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$`)

// Options configure the driver.
type Options struct {
	// StateDir holds one dir per sandbox (disks, sockets, logs,
	// state.json) and the image cache in StateDir/_images. Keep it short:
	// the API and vsock sockets live in it.
	StateDir string
	// AgentPath is the static `space` binary (the guest's agent).
	AgentPath string
	// Firecracker is the firecracker binary; default from PATH.
	Firecracker string
	// Jailer, if set, runs Firecracker under this jailer binary with
	// JailerUID/JailerGID in ChrootBase (default /srv/jailer).
	Jailer               string
	JailerUID, JailerGID int
	ChrootBase           string
	Kernel, ModulesDir   string // default: newest /boot/vmlinuz-* with modules
	Busybox              string // default /bin/busybox
	MemoryMiB, CPUs      int
	UpperSize            int64
	ReadyTimeout         time.Duration
	Logf                 func(format string, args ...any)
	skipHostCheck        bool                        // tests: fake firecracker
	command              func(sock string) *exec.Cmd // tests: fake firecracker
}

// Driver implements driver.Driver with Firecracker.
type Driver struct {
	opts  Options
	imgMu sync.Mutex
	boot  *bootFiles
	disks *vmimage.RootDisks // per template, shared by its VMs
}

type bootFiles struct{ vmlinux, initramfs, agentDisk string }

var _ driver.Driver = (*Driver)(nil)

// New checks the host: it fails with driver.ErrUnsupported (and says why)
// unless KVM works and the firecracker binary (and jailer, if asked for)
// exist.
func New(opts Options) (*Driver, error) {
	if opts.StateDir == "" || opts.AgentPath == "" {
		return nil, errors.New("firecracker: StateDir and AgentPath are required")
	}
	var err error
	for _, p := range []*string{&opts.StateDir, &opts.AgentPath} {
		if *p, err = filepath.Abs(*p); err != nil {
			return nil, fmt.Errorf("firecracker: %w", err)
		}
	}
	if !opts.skipHostCheck {
		if !vmimage.KVMUsable() {
			return nil, fmt.Errorf("firecracker: /dev/kvm is missing or cannot run guests (needs vmx/svm; in kind or a container, mount /dev/kvm): %w", driver.ErrUnsupported)
		}
		if opts.Firecracker == "" {
			if opts.Firecracker, err = exec.LookPath("firecracker"); err != nil {
				return nil, fmt.Errorf("firecracker: no firecracker binary on PATH (see docs/drivers.md): %w", driver.ErrUnsupported)
			}
		}
		if opts.Jailer != "" {
			if _, err := exec.LookPath(opts.Jailer); err != nil {
				return nil, fmt.Errorf("firecracker: jailer %s: %w: %w", opts.Jailer, err, driver.ErrUnsupported)
			}
		}
	}
	if opts.Kernel == "" {
		if opts.Kernel, opts.ModulesDir, err = vmimage.FindKernel("/boot", "/lib/modules"); err != nil {
			return nil, fmt.Errorf("firecracker: %w: %w", err, driver.ErrUnsupported)
		}
	}
	if opts.Busybox == "" {
		opts.Busybox = "/bin/busybox"
	}
	if opts.ChrootBase == "" {
		opts.ChrootBase = "/srv/jailer"
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
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "_images"), 0o700); err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	d := &Driver{opts: opts}
	d.disks = &vmimage.RootDisks{Dir: d.imageDir()}
	return d, nil
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return Name }

func (d *Driver) sandboxDir(id string) string { return filepath.Join(d.opts.StateDir, id) }
func (d *Driver) apiSock(id string) string    { return filepath.Join(d.sandboxDir(id), "api.sock") }
func (d *Driver) vsockPath(id string) string  { return filepath.Join(d.sandboxDir(id), "vsock.sock") }
func (d *Driver) imageDir() string            { return filepath.Join(d.opts.StateDir, "_images") }

func (d *Driver) bootFiles(ctx context.Context) (*bootFiles, error) {
	d.imgMu.Lock()
	defer d.imgMu.Unlock()
	if d.boot != nil {
		return d.boot, nil
	}
	bb, err := vmimage.BuildBoot(ctx, vmimage.BootSpec{Dir: d.imageDir(), Kernel: d.opts.Kernel,
		Busybox: d.opts.Busybox, ModDir: d.opts.ModulesDir, AgentPath: d.opts.AgentPath,
		AgentArgs: []string{"--vsock", strconv.Itoa(AgentPort)}, Flavor: "vsock"})
	if err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	d.boot = &bootFiles{vmlinux: bb.Vmlinux, initramfs: bb.Initramfs, agentDisk: bb.AgentDisk}
	return d.boot, nil
}

func (d *Driver) rootDisk(ctx context.Context, rootfs string) (string, error) {
	p, err := d.disks.Get(ctx, rootfs)
	if err != nil {
		return "", fmt.Errorf("firecracker: %w", err)
	}
	return p, nil
}

type state struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	MemoryMiB int    `json:"memory_mib"`
	CPUs      int    `json:"cpus"`
	// The files the VM was booted from: a snapshot is valid only with
	// the very same ones.
	Vmlinux   string `json:"vmlinux,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
	AgentDisk string `json:"agent_disk,omitempty"`
	RootDisk  string `json:"root_disk,omitempty"`
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

// machineConfig is the SDK configuration of sandbox id: what the unit
// tests check against Firecracker's API.
func (d *Driver) machineConfig(id, hostname string, boot *bootFiles, root, upper string, memMiB, cpus int) sdk.Config {
	args := "console=ttyS0 reboot=k panic=-1 pci=off quiet"
	if hostname != "" {
		args += " space.hostname=" + hostname
	}
	drive := func(name, path string, ro bool) models.Drive {
		return models.Drive{DriveID: sdk.String(name), PathOnHost: sdk.String(path),
			IsReadOnly: sdk.Bool(ro), IsRootDevice: sdk.Bool(false)}
	}
	cfg := sdk.Config{
		SocketPath:      d.apiSock(id),
		KernelImagePath: boot.vmlinux,
		InitrdPath:      boot.initramfs,
		KernelArgs:      args,
		// Firecracker answers virtio-blk GET_ID with the drive id, which
		// the guest's /init reads as /sys/block/vdX/serial.
		Drives: []models.Drive{
			drive(vmimage.SerialRoot, root, true),
			drive(vmimage.SerialUpper, upper, false),
			drive(vmimage.SerialAgent, boot.agentDisk, true),
		},
		VsockDevices: []sdk.VsockDevice{{ID: "agent", Path: d.vsockPath(id), CID: guestCID}},
		MachineCfg: models.MachineConfiguration{
			VcpuCount:       sdk.Int64(int64(cpus)),
			MemSizeMib:      sdk.Int64(int64(memMiB)),
			Smt:             sdk.Bool(false),
			TrackDirtyPages: true, // diff snapshots
		},
		VMID:           id,
		ForwardSignals: []os.Signal{}, // never pass the node's signals on
	}
	if d.opts.Jailer != "" {
		uid, gid := d.opts.JailerUID, d.opts.JailerGID
		cfg.JailerCfg = &sdk.JailerConfig{
			UID: &uid, GID: &gid, ID: id, NumaNode: sdk.Int(0),
			ExecFile: d.opts.Firecracker, JailerBinary: d.opts.Jailer,
			ChrootBaseDir: d.opts.ChrootBase, Daemonize: true,
			ChrootStrategy: sdk.NewNaiveChrootStrategy(boot.vmlinux),
			CgroupVersion:  "2",
		}
	}
	return cfg
}

// Create implements driver.Driver.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (_ driver.Instance, err error) {
	t0 := time.Now()
	if !idRE.MatchString(spec.ID) {
		return nil, fmt.Errorf("firecracker: bad sandbox id %q", spec.ID)
	}
	if spec.Hostname != "" && !hostnameRE.MatchString(spec.Hostname) {
		return nil, fmt.Errorf("firecracker: bad hostname %q", spec.Hostname)
	}
	if spec.InitLayer != nil {
		return nil, fmt.Errorf("firecracker: restoring a writable layer: %w", driver.ErrUnsupported)
	}
	if fi, err := os.Stat(spec.RootfsDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("firecracker: rootfs %q is not a directory", spec.RootfsDir)
	}
	id := spec.ID
	dir := d.sandboxDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("firecracker: sandbox %s already exists", id)
		}
		return nil, fmt.Errorf("firecracker: %w", err)
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
	upper := filepath.Join(dir, "upper.ext4")
	if err := vmimage.BlankDisk(ctx, upper, vmimage.WritableSize(spec.Limits.DiskBytes, d.opts.UpperSize)); err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	tDisk := time.Now()
	memMiB, cpus := d.vmSize(spec.Limits)
	cfg := d.machineConfig(id, spec.Hostname, boot, root, upper, memMiB, cpus)

	logger := logrus.New()
	logger.SetOutput(io.Discard)
	opts := []sdk.Opt{sdk.WithLogger(logrus.NewEntry(logger))}
	if cfg.JailerCfg == nil {
		var cmd *exec.Cmd
		if d.opts.command != nil {
			cmd = d.opts.command(cfg.SocketPath)
		} else {
			cmd = exec.Command(d.opts.Firecracker, "--api-sock", cfg.SocketPath, "--id", id)
		}
		// Its output includes the guest's serial console, which guest root
		// can write without end: the file is bounded (consolelog).
		if err := consolelog.Mount(dir); err != nil {
			return nil, fmt.Errorf("firecracker: %w", err)
		}
		logf, err := os.Create(consolelog.Path(dir, "firecracker.log"))
		if err != nil {
			return nil, fmt.Errorf("firecracker: %w", err)
		}
		defer logf.Close()
		cmd.Stdout, cmd.Stderr = logf, logf
		// Its own session: the VM outlives the node process (Attach).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		opts = append(opts, sdk.WithProcessRunner(cmd))
	}
	// The SDK stops the VM when the context given to Start ends: the VM
	// must outlive this call.
	vmCtx := context.WithoutCancel(ctx)
	m, err := sdk.NewMachine(vmCtx, cfg, opts...)
	if err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	startErr := make(chan error, 1)
	go func() { startErr <- m.Start(vmCtx) }()
	select {
	case err = <-startErr:
	case <-sctx.Done():
		err = sctx.Err()
	}
	if pid, perr := m.PID(); perr == nil {
		undo.push(func() { _ = unix.Kill(pid, unix.SIGKILL) })
		if err == nil {
			start, _, serr := procStat(pid)
			if serr != nil {
				err = serr
			} else {
				st := state{PID: pid, StartTime: start, MemoryMiB: memMiB, CPUs: cpus,
					Vmlinux: boot.vmlinux, Initramfs: boot.initramfs, AgentDisk: boot.agentDisk, RootDisk: root}
				b, _ := json.Marshal(st)
				err = os.WriteFile(filepath.Join(dir, "state.json"), b, 0o600)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("firecracker: sandbox %s: start: %w", id, err)
	}
	st, err := d.readState(id)
	if err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	inst := &Instance{d: d, id: id, st: st}
	if err := inst.waitReady(sctx); err != nil {
		return nil, fmt.Errorf("firecracker: sandbox %s: agent not ready: %w", id, err)
	}
	inst.timing = driver.Timing{Overlay: tDisk.Sub(t0), AgentReady: time.Since(tDisk), Total: time.Since(t0)}
	d.opts.Logf("firecracker: sandbox %s ready in %v", id, inst.timing.Total)
	return inst, nil
}

func (d *Driver) readState(id string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(d.sandboxDir(id), "state.json"))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

func (d *Driver) alive(st state) bool {
	start, zombie, err := procStat(st.PID)
	return err == nil && !zombie && start == st.StartTime
}

// Attach implements driver.Driver.
func (d *Driver) Attach(ctx context.Context, id string) (driver.Instance, error) {
	if !idRE.MatchString(id) {
		return nil, fmt.Errorf("firecracker: %s: %w", id, driver.ErrNotFound)
	}
	st, err := d.readState(id)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(d.sandboxDir(id)); serr == nil {
			_ = d.remove(ctx, id)
			return nil, fmt.Errorf("firecracker: %s: no state (half-created): %w", id, driver.ErrLost)
		}
		return nil, fmt.Errorf("firecracker: %s: %w", id, driver.ErrNotFound)
	}
	if err != nil || !d.alive(st) {
		_ = d.remove(ctx, id)
		return nil, fmt.Errorf("firecracker: %s: the VM process is gone: %w", id, driver.ErrLost)
	}
	inst := &Instance{d: d, id: id, st: st}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := inst.waitReady(hctx); err != nil {
		_ = d.remove(ctx, id)
		return nil, fmt.Errorf("firecracker: %s: agent does not answer: %v: %w", id, err, driver.ErrLost)
	}
	return inst, nil
}

// remove kills the VM if it still runs and deletes its dir (disks,
// sockets, logs) and its jail.
func (d *Driver) remove(ctx context.Context, id string) error {
	if st, err := d.readState(id); err == nil && d.alive(st) {
		_ = unix.Kill(st.PID, unix.SIGKILL)
		for d.alive(st) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	var errs []error
	if err := consolelog.Unmount(d.sandboxDir(id)); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.sandboxDir(id)); err != nil {
		errs = append(errs, err)
	}
	if d.opts.Jailer != "" {
		if err := os.RemoveAll(filepath.Join(d.opts.ChrootBase, filepath.Base(d.opts.Firecracker), id)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Sweep implements driver.Driver.
func (d *Driver) Sweep(ctx context.Context, keep map[string]bool) error {
	ents, err := os.ReadDir(d.opts.StateDir)
	if err != nil {
		return fmt.Errorf("firecracker: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if id := e.Name(); idRE.MatchString(id) && !keep[id] {
			if err := d.remove(ctx, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func procStat(pid int) (start uint64, zombie bool, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false, fmt.Errorf("firecracker: bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, false, fmt.Errorf("firecracker: bad /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, f[0] == "Z", err
}
