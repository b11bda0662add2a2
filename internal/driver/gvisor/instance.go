package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/dialgate"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentlisten"
)

// Instance is one gVisor sandbox.
type Instance struct {
	d      *Driver
	id     string
	dir    string
	sock   string
	st     state
	group  *cgroups.Group
	timing driver.Timing
	done   <-chan struct{}

	guardKills atomic.Uint64 // commands killed by the memory guard (memguard.go)
	// guardKilling is set while the guard's kill request is under way:
	// the commands' exits reach the node before the agent answers it.
	guardKilling atomic.Bool

	mu        sync.Mutex
	destroyed bool

	// gate is closed from a checkpoint's release of the agent's
	// listener until the sandbox runs again (checkpoint.go).
	gate dialgate.Gate
}

var (
	_ driver.Instance      = (*Instance)(nil)
	_ driver.Pauser        = (*Instance)(nil)
	_ driver.LayerInstance = (*Instance)(nil)
)

// ID implements driver.Instance.
func (i *Instance) ID() string { return i.id }

// PID is the host pid of runsc's sandbox process (the sentry).
func (i *Instance) PID() int { return i.st.PID }

// Done is closed when the sandbox's process has exited, i.e. the sandbox
// is dead (killed, OOM) and only needs Destroy.
func (i *Instance) Done() <-chan struct{} { return i.done }

// watch starts watching the sandbox process for Done.
func (i *Instance) watch() error {
	done, err := watchExit(i.st.PID, i.st.StartTime)
	if err != nil {
		return fmt.Errorf("gvisor: %s: %w", i.id, err)
	}
	i.done = done
	go i.guardMemory(done)
	return nil
}

// Cgroup is the sandbox's cgroup.
func (i *Instance) Cgroup() *cgroups.Group { return i.group }

// Dial implements driver.Instance.
//
// While a checkpoint has the agent's listener released (and until the
// sandbox runs again) it waits, then gives the agent relistenWait to
// listen again (it polls every agentlisten.PollInterval once resumed):
// see package dialgate.
func (i *Instance) Dial(ctx context.Context) (net.Conn, error) {
	c, err := i.gate.Dial(ctx, func(ctx context.Context) (net.Conn, error) { return dialSocket(ctx, i.sock) },
		agentlisten.PollInterval, relistenWait)
	if err != nil {
		return nil, fmt.Errorf("gvisor: dial agent of %s: %w", i.id, err)
	}
	return c, nil
}

// relistenWait bounds how long Dial waits for the agent to listen again
// after a checkpoint.
const relistenWait = 2 * time.Second

// SetLimits implements driver.Instance. Zero fields take the driver's
// defaults. The sentry sized its memory at start; a lower limit later is
// enforced by the host cgroup (the sandbox is then OOM-killed as a whole).
// The pids limit goes to both the host cgroup (with headroom for runsc's
// tasks) and the commands' cgroup in the Sentry (pids.go).
func (i *Instance) SetLimits(ctx context.Context, l driver.Limits) error {
	if err := diskquota.CheckSize(filepath.Join(i.dir, diskImage), l.DiskBytes); err != nil {
		return fmt.Errorf("gvisor: %s: %w: %w", i.id, err, driver.ErrUnsupported)
	}
	lim := i.d.limits(l)
	if err := i.group.SetLimits(hostLimits(lim)); err != nil {
		return fmt.Errorf("gvisor: %s: %w", i.id, err)
	}
	if err := i.setSandboxPids(ctx, lim.Pids); err != nil {
		if !errors.Is(err, errNoPidsRoute) {
			return fmt.Errorf("gvisor: %s: %w", i.id, err)
		}
		i.d.opts.Logf("gvisor: %s: %v: its pids limit holds on the host only", i.id, err)
	}
	return nil
}

// OOMKills implements driver.Instance: host OOM kills in the sandbox's
// cgroup (each one kills the sandbox) plus the memory guard's kills of the
// commands (memguard.go), counting a kill under way as done: the node
// reads this when a command's exit arrives, which for the commands the
// guard kills is before the agent has answered the guard.
func (i *Instance) OOMKills() (uint64, error) {
	n, err := i.group.OOMKills()
	n += i.guardKills.Load()
	if i.guardKilling.Load() {
		n++
	}
	return n, err
}

// Timing implements driver.Instance.
func (i *Instance) Timing() driver.Timing { return i.timing }

// WritableLayer implements driver.LayerInstance: the host overlay's upper
// dir. Read it only while the sandbox is paused.
func (i *Instance) WritableLayer() (driver.Layer, error) {
	return driver.Layer{Dir: upperDir(i.dir), UIDBase: i.uidBase(), UIDCount: i.d.opts.UIDCount}, nil
}

// uidBase is the sandbox's first host id: its own block, or the shared
// range for sandboxes made before per-sandbox ranges.
func (i *Instance) uidBase() uint32 {
	if i.st.UIDBase != 0 {
		return i.st.UIDBase
	}
	return i.d.opts.UIDBase
}

// Pause implements driver.Pauser (runsc pause). Idempotent.
func (i *Instance) Pause(ctx context.Context) error {
	cs, err := i.d.r.state(ctx, i.id)
	if err != nil {
		return fmt.Errorf("gvisor: pause %s: %w", i.id, err)
	}
	if cs.Status == "paused" {
		return nil
	}
	if _, err := i.d.r.run(ctx, "pause", i.id); err != nil {
		return fmt.Errorf("gvisor: pause %s: %w", i.id, err)
	}
	return nil
}

// Resume implements driver.Pauser (runsc resume). Idempotent.
func (i *Instance) Resume(ctx context.Context) error {
	cs, err := i.d.r.state(ctx, i.id)
	if err != nil {
		return fmt.Errorf("gvisor: resume %s: %w", i.id, err)
	}
	if cs.Status != "paused" {
		i.gate.Open()
		return nil
	}
	if _, err := i.d.r.run(ctx, "resume", i.id); err != nil {
		return fmt.Errorf("gvisor: resume %s: %w", i.id, err)
	}
	i.gate.Open()
	return nil
}

// Destroy implements driver.Instance.
func (i *Instance) Destroy(ctx context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.destroyed {
		return nil
	}
	if err := i.d.teardown(ctx, i.id, i.st); err != nil {
		return err
	}
	i.destroyed = true
	i.gate.Open() // waiting dials fail now rather than at their deadline
	return nil
}

// teardown kills a sandbox and removes everything it had on the host. Each
// step tolerates what is already gone, so it can be repeated.
func (d *Driver) teardown(ctx context.Context, id string, st state) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultDestroyWait)
		defer cancel()
	}
	var errs []error
	// runsc kills the sandbox and gofer, removes the cgroups it made and
	// its files in --root.
	if err := d.r.remove(ctx, id); err != nil {
		errs = append(errs, err)
	}
	// Backstop: a sandbox process runsc lost track of.
	if st.PID > 0 {
		if t, err := procStartTime(st.PID); err == nil && t == st.StartTime {
			_ = killPid(st.PID)
			if err := waitGone(ctx, st.PID, st.StartTime); err != nil {
				errs = append(errs, err)
			}
		}
	}
	groups := []*cgroups.Group{d.cg.Open(d.cg.Paths(id))}
	if d.cg.Validate(st.Cgroups, id) == nil {
		groups = append(groups, d.cg.Open(st.Cgroups))
	}
	for _, g := range groups {
		if err := g.Destroy(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	// Hierarchies the cgroups package does not manage (blkio, devices, ...)
	// where runsc made dirs too.
	removeOtherCgroupDirs(d.opts.CgroupBase, id)
	if len(errs) > 0 {
		// Keep the state so a later Destroy or Sweep can retry.
		return fmt.Errorf("gvisor: destroy %s: %w", id, errors.Join(errs...))
	}
	d.removeRunscFiles(id)
	// unmountAll(dir) also unpins the network namespace (<dir>/netns): with
	// runsc's processes gone, the netns and the sandbox's veth go with it.
	dir := d.sandboxDir(id)
	if err := unmountAll(dir); err != nil {
		errs = append(errs, err)
	}
	if err := unmountAll(d.sockDir(id)); err != nil {
		errs = append(errs, err)
	}
	for _, p := range []string{d.sockDir(id), dir} {
		if err := os.RemoveAll(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// Its uid block, once nothing of the sandbox is left.
	if len(errs) == 0 && d.opts.Pool != nil && d.opts.Pool.Contains(st.UIDBase) {
		if err := d.opts.Pool.Free(st.UIDBase, dir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("gvisor: destroy %s: %w", id, errors.Join(errs...))
	}
	return nil
}

// removeRunscFiles removes runsc's own files for id from --root when runsc
// no longer knows the container (a crash mid-create, a deleted state).
func (d *Driver) removeRunscFiles(id string) {
	for _, name := range []string{"runsc-" + id + ".sock", id + "_sandbox:" + id + ".state", id + "_sandbox:" + id + ".lock"} {
		_ = os.Remove(filepath.Join(d.r.root, name))
	}
}

// waitGone waits until pid has exited or ctx ends.
func waitGone(ctx context.Context, pid int, start uint64) error {
	for {
		t, err := procStartTime(pid)
		if err != nil || t != start || isZombie(pid) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pid %d still running: %w", pid, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
