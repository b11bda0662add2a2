package namespace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/criu"
	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/dialgate"
)

// Instance is one namespace sandbox.
type Instance struct {
	d      *Driver
	id     string
	sock   string
	groups []*cgroups.Group // [0] is the live group; more only during cleanup
	proc   *process
	timing driver.Timing
	// uidBase is the sandbox's first host id.
	uidBase uint32
	// pages is the lazy-pages daemon of a lazy restore until it has
	// moved every page in (nil otherwise).
	pages *criu.Pages

	mu        sync.Mutex
	destroyed bool
	// ckMu makes checkpoints of the instance one at a time: a second
	// one would find the agent's listener handed off.
	ckMu sync.Mutex
	// gate is closed while a checkpoint has the agent's listener handed
	// off, until the driver hands a new one in (checkpoint.go).
	gate dialgate.Gate
}

var _ driver.Instance = (*Instance)(nil)

// ID implements driver.Instance.
func (i *Instance) ID() string { return i.id }

// PID is the host pid of the sandbox's PID 1.
func (i *Instance) PID() int { return i.proc.pid }

// NetNSPath implements driver.NetNSer: the network namespace of PID 1,
// which Attach has checked is the sandbox's own process.
func (i *Instance) NetNSPath() string { return fmt.Sprintf("/proc/%d/ns/net", i.proc.pid) }

// Done is closed when the sandbox's PID 1 has exited, i.e. the sandbox is
// dead (killed, OOM, agent crash) and only needs Destroy.
func (i *Instance) Done() <-chan struct{} { return i.proc.done }

// Cgroup is the sandbox's cgroup (freeze/thaw, stats).
func (i *Instance) Cgroup() *cgroups.Group { return i.groups[0] }

// Dial implements driver.Instance.
//
// While a checkpoint has the agent's listener handed off it waits for the
// new one (package dialgate): a command beside a periodic checkpoint
// would be refused otherwise.
func (i *Instance) Dial(ctx context.Context) (net.Conn, error) {
	c, err := i.gate.Dial(ctx, i.dialSocket, relistenPoll, relistenWait)
	if err != nil {
		return nil, fmt.Errorf("namespace: dial agent of %s: %w", i.id, err)
	}
	return c, nil
}

// The handed-in listener takes connections at once; the retry only covers
// a dial that raced the handoff itself.
const (
	relistenPoll = 5 * time.Millisecond
	relistenWait = 500 * time.Millisecond
)

// dialSocket dials the agent's socket, past the gate.
func (i *Instance) dialSocket(ctx context.Context) (net.Conn, error) {
	var dd net.Dialer
	return dd.DialContext(ctx, "unix", i.sock)
}

// SetLimits implements driver.Instance. Zero fields take the driver's
// defaults, as at create; the disk keeps the size it was made with (another
// size fails with driver.ErrUnsupported).
func (i *Instance) SetLimits(ctx context.Context, l driver.Limits) error {
	if err := diskquota.CheckSize(filepath.Join(i.d.sandboxDir(i.id), diskImage), l.DiskBytes); err != nil {
		return fmt.Errorf("namespace: %s: %w: %w", i.id, err, driver.ErrUnsupported)
	}
	if err := i.groups[0].SetLimits(i.d.limits(l)); err != nil {
		return fmt.Errorf("namespace: %s: %w", i.id, err)
	}
	return nil
}

// OOMKills implements driver.Instance.
func (i *Instance) OOMKills() (uint64, error) { return i.groups[0].OOMKills() }

// Timing implements driver.Instance.
func (i *Instance) Timing() driver.Timing { return i.timing }

// Destroy implements driver.Instance.
func (i *Instance) Destroy(ctx context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.destroyed {
		return nil
	}
	if err := i.d.teardown(ctx, i.id, i.proc, i.groups, []string{i.sock}, i.uidBase); err != nil {
		return err
	}
	if i.pages != nil {
		// After the tree: it may be waiting on a page only the daemon has.
		i.pages.Stop()
	}
	i.destroyed = true
	i.gate.Open() // waiting dials fail now rather than at their deadline
	return nil
}

// teardown kills a sandbox and removes everything it had on the host. proc
// may be nil (nothing verified to kill); every step tolerates what is
// already gone, so it can be repeated. uidBase's pool block, if it is one,
// is freed once nothing of the sandbox is left.
func (d *Driver) teardown(ctx context.Context, id string, proc *process, groups []*cgroups.Group, socks []string, uidBase uint32) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultDestroyWait)
		defer cancel()
	}
	var errs []error
	if proc != nil {
		// PID 1 dying tears down the pid namespace (the kernel kills every
		// other process in it) and with it the mount and network namespaces.
		if err := proc.kill(); err != nil {
			errs = append(errs, fmt.Errorf("kill pid %d: %w", proc.pid, err))
		}
		select {
		case <-proc.done:
			proc.release()
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("pid %d did not exit: %w", proc.pid, ctx.Err()))
		}
	}
	// Backstop for anything left in the cgroups, then remove them.
	for _, g := range groups {
		if err := g.Destroy(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// Keep the state dir so a later Destroy or Sweep can retry.
		return fmt.Errorf("namespace: destroy %s: %w", id, errors.Join(errs...))
	}
	for _, s := range socks {
		if err := os.Remove(s); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// The sandbox's own disk, if any: unmounted (PID 1 is gone, and with
	// it the sandbox's view of it) before its mount point is removed.
	dir := filepath.Join(d.opts.StateDir, id)
	if err := diskquota.Remove(filepath.Join(dir, diskImage), filepath.Join(dir, diskMount)); err != nil {
		return fmt.Errorf("namespace: destroy %s: %w", id, err)
	}
	unmountLower(dir)
	// upper/ holds files of the sandbox's uids; host root removes them all.
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	} else if d.opts.Pool != nil && d.opts.Pool.Contains(uidBase) {
		if err := d.opts.Pool.Free(uidBase, dir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("namespace: destroy %s: %w", id, errors.Join(errs...))
	}
	return nil
}
