// Package driver defines the isolation back-end interface that every SPACE
// driver (namespace, gvisor, qemu, firecracker) implements. The node talks to a
// sandbox only through an Instance: it never reaches into the sandbox's
// filesystem by path (invariant 1); everything inside goes through the agent,
// which the instance exposes as a stream dialer.
package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
)

// Sentinel errors. Callers match with errors.Is; the API edge maps them to HTTP.
var (
	ErrNotFound    = errors.New("driver: sandbox not found")
	ErrUnsupported = errors.New("driver: not supported on this host")
	ErrLost        = errors.New("driver: sandbox lost")
)

// Limits are the resource limits of one sandbox. Zero means "driver default".
type Limits struct {
	MemoryBytes int64 // hard memory limit (RAM + swap where the host allows)
	CPUMillis   int64 // CPU bandwidth in thousandths of a CPU (1000 = one full core)
	Pids        int64 // maximum number of tasks
	// DiskBytes is the size of the sandbox's writable layer: its own
	// filesystem of this size (drivers with a disk manager; VM drivers:
	// the writable disk), so writes past it fail with ENOSPC inside.
	// Zero: the driver's default (none for the container drivers without
	// one). It is fixed at create: SetLimits with another size fails with
	// ErrUnsupported.
	DiskBytes int64
}

// Spec describes a sandbox to create.
type Spec struct {
	ID       string // sandbox id; safe for use in file names ([a-z0-9-], ≤ 64 chars)
	Hostname string // UTS hostname inside the sandbox
	// RootfsDir is the template's immutable, read-only root filesystem. Its
	// files are owned by the node's shifted uid range (see namespace driver).
	RootfsDir string
	Limits    Limits
	// InitLayer, if set, fills the sandbox's empty writable layer before
	// anything runs in the sandbox (restore and fork from a snapshot).
	// Drivers without a host-side writable layer fail Create with
	// ErrUnsupported when it is set.
	InitLayer func(ctx context.Context, l Layer) error
}

// Timing breaks down where create time went, for benchmarks and logs.
type Timing struct {
	Namespaces time.Duration // clone + user/pid/mount/... namespaces
	Overlay    time.Duration // writable layer prepared and mounted
	Cgroups    time.Duration // cgroup creation, limits, attach
	Network    time.Duration // network namespace setup
	AgentReady time.Duration // agent answered its first health check
	// Hardening is the agent's own hardening and seccomp filter install
	// inside the sandbox (part of AgentReady; namespace driver only).
	Hardening time.Duration
	Total     time.Duration
}

// Instance is one running sandbox.
type Instance interface {
	ID() string
	// Dial opens a new stream to the sandbox's agent. Each call returns an
	// independent connection; the agent speaks HTTP/1.1 over it.
	Dial(ctx context.Context) (net.Conn, error)
	// SetLimits changes resource limits of a running sandbox (used when a
	// warm-pool sandbox is claimed).
	SetLimits(ctx context.Context, l Limits) error
	// OOMKills returns how many processes the kernel OOM-killed in this
	// sandbox so far, so the node can tell an OOM kill from a plain SIGKILL.
	OOMKills() (uint64, error)
	// Timing reports the create breakdown (zero for re-attached instances).
	Timing() Timing
	// Destroy kills everything in the sandbox and removes every host-side
	// resource it had (mounts, cgroups, namespaces, sockets, files). It is
	// idempotent.
	Destroy(ctx context.Context) error
}

// Closer is a driver that holds host resources of its own beyond its
// sandboxes (the namespace driver's fork helper process): its node closes
// it when it stops. Sandboxes keep running.
type Closer interface {
	Close()
}

// Close closes d, or the driver it wraps (an Unwrap() Driver method), if
// that is a Closer.
func Close(d Driver) {
	for i := 0; i < 4 && d != nil; i++ {
		if c, ok := d.(Closer); ok {
			c.Close()
			return
		}
		u, ok := d.(interface{ Unwrap() Driver })
		if !ok {
			return
		}
		d = u.Unwrap()
	}
}

// Driver creates and re-attaches sandboxes.
type Driver interface {
	Name() string
	// Create starts a sandbox and returns once its agent is ready. On error
	// nothing is left behind.
	Create(ctx context.Context, spec Spec) (Instance, error)
	// Attach re-adopts a sandbox that survived a restart of the node process.
	// It returns ErrLost (wrapped, with the reason) when the sandbox is gone;
	// host-side leftovers are removed in that case.
	Attach(ctx context.Context, id string) (Instance, error)
	// Sweep removes host-side leftovers of every sandbox the driver knows of
	// on disk whose id is not in keep. It is the leak safety net run at start.
	Sweep(ctx context.Context, keep map[string]bool) error
}

// NetNSer is implemented by instances whose network namespace the host
// can enter again for as long as the sandbox lives (the namespace driver:
// its PID 1's). The egress network gives such a sandbox a new link when it
// is re-adopted without its old one.
type NetNSer interface {
	NetNSPath() string
}

// Pauser is implemented by instances that can stop every process of the
// sandbox at once and continue them exactly where they were (a freezer;
// VM pause). Both calls are idempotent.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Layer is a sandbox's writable layer as a directory on the host (the
// overlay upper dir for namespaces). Files in it carry host ids: sandbox id
// n is host id UIDBase+n for n < UIDCount.
type Layer struct {
	Dir               string
	UIDBase, UIDCount uint32
}

// LayerInstance is implemented by instances whose writable layer is a host
// directory. The node reads it only while the instance is paused, and never
// follows a link inside it.
type LayerInstance interface {
	WritableLayer() (Layer, error)
}

// As finds an optional interface T on inst or on the instances it wraps
// (wrappers expose theirs with Unwrap() Instance).
func As[T any](inst Instance) (T, bool) {
	for i := 0; i < 8 && inst != nil; i++ {
		if t, ok := inst.(T); ok {
			return t, true
		}
		u, ok := inst.(interface{ Unwrap() Instance })
		if !ok {
			break
		}
		inst = u.Unwrap()
	}
	var zero T
	return zero, false
}

// Checkpointer is implemented by instances that can save every process of
// the sandbox with its memory (gVisor's checkpoint, a VM's memory and
// device state) as files in a directory. Checkpoint pauses the sandbox if
// it runs and leaves it paused and alive, so that the caller reads the
// writable layer of the same moment (LayerInstance) and then resumes it
// (Pauser) or destroys it. An instance without a LayerInstance puts its
// writable disk in dir too: the node stores dir as the whole snapshot.
// dir is an empty directory the caller owns; the node stores every
// regular file below it (no links or special files).
type Checkpointer interface {
	Checkpoint(ctx context.Context, dir string) error
}

// Restorer is implemented by drivers that start a sandbox from a
// Checkpointer's directory: its processes continue where they were.
// spec.InitLayer must fill the writable layer with the files of the
// checkpointed moment; spec.ID may differ from the checkpointed sandbox's
// (a fork), and one directory may be restored any number of times. The
// directory is only read and may be removed once Restore returns.
type Restorer interface {
	Restore(ctx context.Context, spec Spec, dir string) (Instance, error)
}

// Stats is what the host charges a sandbox for, from its cgroup.
type Stats struct {
	// CPUUsageNs is the CPU time used since the sandbox started (all its
	// processes, and runsc's own under gVisor); 0 with CPUUnknown.
	CPUUsageNs uint64
	CPUUnknown bool
	// CPULimitMillis is the CPU bandwidth limit (0: none).
	CPULimitMillis int64
	MemUsedBytes   int64 // page cache that could be reclaimed excluded
	MemLimitBytes  int64 // 0: none
	MemCacheBytes  int64
}

// Statser is implemented by instances whose resource use the host can
// read itself (cgroups). Without it, the node asks the sandbox's agent.
type Statser interface {
	Stats(ctx context.Context) (Stats, error)
}

// CgroupStats is Stats from a sandbox's host cgroup (the container
// drivers' Statser).
func CgroupStats(g *cgroups.Group) (Stats, error) {
	st, err := g.Stats()
	if err != nil {
		return Stats{}, fmt.Errorf("stats: %w", err)
	}
	return Stats{CPUUsageNs: st.CPUUsageNs, CPUUnknown: !st.CPUKnown, CPULimitMillis: st.CPULimitMillis,
		MemUsedBytes: st.MemUsedBytes, MemLimitBytes: st.MemLimitBytes, MemCacheBytes: st.MemCacheBytes}, nil
}
