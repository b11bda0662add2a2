package node

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/snapshot"
)

// sandbox returns a sandbox of this node whether or not it is paused.
func (n *Node) sandbox(id string) (*Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.sandboxes[id]
	if h == nil {
		return nil, fmt.Errorf("sandbox %s is not running here: %w", id, core.ErrNotFound)
	}
	return h, nil
}

// lockedSandbox returns sandbox id with its state lock held (the caller
// unlocks), once no snapshot, pause or resume of it is in flight; a
// sandbox stopped meanwhile is not found.
func (n *Node) lockedSandbox(ctx context.Context, id string) (*Sandbox, error) {
	h, err := n.sandbox(id)
	if err != nil {
		return nil, err
	}
	if err := h.lockState(ctx); err != nil {
		return nil, err
	}
	if cur, err := n.sandbox(id); err != nil || cur != h {
		h.unlockState()
		return nil, fmt.Errorf("sandbox %s is not running here: %w", id, core.ErrNotFound)
	}
	return h, nil
}

func pauser(h *Sandbox) (driver.Pauser, error) {
	p, ok := driver.As[driver.Pauser](h.inst)
	if !ok {
		return nil, fmt.Errorf("driver cannot pause sandboxes: %w", core.ErrUnavailable)
	}
	return p, nil
}

// freeze stops every process of h and refuses its data plane.
func (n *Node) freeze(ctx context.Context, h *Sandbox) error {
	p, err := pauser(h)
	if err != nil {
		return err
	}
	// Refuse new data-plane calls first: one that reached a frozen agent
	// would hang instead of failing.
	h.paused.Store(true)
	h.dropParked()
	if err := p.Pause(ctx); err != nil {
		h.paused.Store(false)
		_ = p.Resume(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

// thaw continues h's processes (harmless when they run).
func (n *Node) thaw(ctx context.Context, h *Sandbox) error {
	p, err := pauser(h)
	if err != nil {
		return nil // nothing can have frozen it
	}
	if err := p.Resume(ctx); err != nil {
		return err
	}
	h.paused.Store(false)
	return nil
}

// PauseSandbox implements core.PauseRuntime.
func (n *Node) PauseSandbox(ctx context.Context, id string) error {
	h, err := n.lockedSandbox(ctx, id)
	if err != nil {
		return err
	}
	defer h.unlockState()
	return n.freeze(ctx, h)
}

// ResumeSandbox implements core.PauseRuntime.
func (n *Node) ResumeSandbox(ctx context.Context, id string) error {
	h, err := n.lockedSandbox(ctx, id)
	if err != nil {
		return err
	}
	defer h.unlockState()
	return n.thaw(ctx, h)
}

// CaptureSnapshot implements core.SnapshotRuntime: the sandbox is frozen
// (if it is not paused already) while its writable layer is read, and
// continues afterwards. Where the instance can checkpoint its processes
// and the driver restore them (gVisor, a VM), the checkpoint image is
// stored in the same manifest, taken in the same frozen moment as the
// layer (or alone, where the checkpoint holds the disk).
func (n *Node) CaptureSnapshot(ctx context.Context, id string, chain []string) (_ string, stats core.SnapshotStats, err error) {
	t0 := time.Now()
	defer func() { n.observer().SnapshotCaptured(n.o.Driver.Name(), stats, time.Since(t0), err) }()
	h, err := n.lockedSandbox(ctx, id)
	if err != nil {
		return "", stats, err
	}
	defer h.unlockState()
	cp, canCheckpoint := n.checkpointer(h)
	// A driver whose checkpoint holds the disk (a VM) has no host-side
	// layer: its snapshots are the checkpoint alone (layer.Dir "").
	var layer driver.Layer
	if li, ok := driver.As[driver.LayerInstance](h.inst); ok {
		if layer, err = li.WritableLayer(); err != nil {
			return "", stats, err
		}
	} else if !canCheckpoint {
		return "", stats, fmt.Errorf("driver has no host-side writable layer to snapshot: %w", core.ErrUnavailable)
	}
	parent, parentImg, err := n.snaps.LoadParent(ctx, chain)
	if err != nil {
		return "", stats, fmt.Errorf("load parent snapshot: %w", err)
	}
	var res snapshot.Result
	if canCheckpoint {
		res, err = n.captureProcess(ctx, h, cp, layer, parent, parentImg, &stats)
	} else {
		t0 := time.Now()
		res, err = n.captureLayer(ctx, h, layer, parent)
		stats.FrozenMS = time.Since(t0).Milliseconds()
	}
	if err != nil {
		return "", stats, err
	}
	stats.Entries, stats.Changed, stats.Removed, stats.Skipped = res.Entries, res.Changed, res.Removed, res.Skipped
	stats.LogicalBytes, stats.BytesRead, stats.NewChunks = res.LogicalBytes, res.BytesRead, res.NewChunks
	stats.ChunkBytes, stats.ManifestBytes, stats.BytesStored = res.ChunkBytes, res.ManifestBytes, res.BytesStored
	stats.ProcessImageFiles, stats.ProcessImageBytes = res.ImageFiles, res.ImageBytes
	stats.ProcessNewChunks, stats.ProcessChunkBytes = res.ImageNewChunks, res.ImageChunkBytes
	return res.Manifest, stats, nil
}

// checkpointer returns h's Checkpointer when this node's driver can also
// restore what it writes.
func (n *Node) checkpointer(h *Sandbox) (driver.Checkpointer, bool) {
	cp, ok := driver.As[driver.Checkpointer](h.inst)
	if !ok {
		return nil, false
	}
	_, ok = n.o.Driver.(driver.Restorer)
	return cp, ok
}

// captureLayer reads the writable layer with the sandbox frozen.
func (n *Node) captureLayer(ctx context.Context, h *Sandbox, layer driver.Layer, parent snapshot.State) (snapshot.Result, error) {
	if !h.paused.Load() {
		h.capturing.Add(1)
		defer h.capturing.Add(-1)
		if err := n.freeze(ctx, h); err != nil {
			return snapshot.Result{}, err
		}
		defer func() {
			if err := n.thaw(context.WithoutCancel(ctx), h); err != nil {
				n.o.Logf("sandbox %s: thaw after snapshot: %v", h.ID, err)
			}
		}()
	}
	return n.snaps.Capture(ctx, layer, parent)
}

// captureProcess checkpoints h into a temp dir (the instance is left
// paused), reads the layer of that same moment, resumes h unless it was
// paused before, and stores the image.
func (n *Node) captureProcess(ctx context.Context, h *Sandbox, cp driver.Checkpointer, layer driver.Layer, parent snapshot.State, parentImg *snapshot.ProcessImage, stats *core.SnapshotStats) (snapshot.Result, error) {
	dir, err := n.snaps.TempDir()
	if err != nil {
		return snapshot.Result{}, err
	}
	defer os.RemoveAll(dir)
	wasPaused := h.paused.Load()
	if !wasPaused {
		h.capturing.Add(1)
		defer h.capturing.Add(-1) // after the agent answers again (below)
	}
	// The data plane waits from here: the agent stops listening.
	h.paused.Store(true)
	h.dropParked()
	var once sync.Once
	t0 := time.Now()
	release := func() {
		once.Do(func() {
			bg := context.WithoutCancel(ctx)
			defer func() { stats.FrozenMS = time.Since(t0).Milliseconds() }()
			if wasPaused {
				if err := n.freeze(bg, h); err != nil { // idempotent: it stays paused
					n.o.Logf("sandbox %s: pause after snapshot: %v", h.ID, err)
				}
				return
			}
			if err := n.thaw(bg, h); err != nil {
				n.o.Logf("sandbox %s: resume after snapshot: %v", h.ID, err)
			}
		})
	}
	defer func() {
		release()
		if !wasPaused {
			n.waitAgent(context.WithoutCancel(ctx), h)
		}
	}()
	if err := cp.Checkpoint(ctx, dir); err != nil {
		if ctx.Err() != nil {
			return snapshot.Result{}, fmt.Errorf("checkpoint processes: %w", err)
		}
		// Something in the sandbox cannot be saved (e.g. a socket of its
		// own bound on the host): the files still make a snapshot, and
		// the record says why the processes are not in it.
		if layer.Dir == "" {
			return snapshot.Result{}, fmt.Errorf("checkpoint: %w", err)
		}
		n.o.Logf("sandbox %s: checkpoint failed, snapshot without processes: %v", h.ID, err)
		stats.ProcessNotCaptured = truncate(err.Error(), 512)
		if ferr := n.freeze(ctx, h); ferr != nil {
			return snapshot.Result{}, fmt.Errorf("checkpoint processes: %w; freeze: %w", err, ferr)
		}
		return n.snaps.Capture(ctx, layer, parent)
	}
	stats.CheckpointMS = time.Since(t0).Milliseconds()
	stats.ProcessDriver = n.o.Driver.Name()
	// The sandbox may run again once its layer is read: the image is
	// files of the past moment already.
	return n.snaps.CaptureProcess(ctx, layer, parent, snapshot.ImageSource{Dir: dir, Driver: n.o.Driver.Name(), LayerDone: release, Parent: parentImg})
}

// truncate bounds a message recorded in a snapshot.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// waitAgent waits (briefly) until h's agent accepts connections again
// after a checkpoint released its listener, so the first data-plane call
// after the snapshot does not fail.
func (n *Node) waitAgent(ctx context.Context, h *Sandbox) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if c, err := h.inst.Dial(ctx); err == nil {
			c.Close()
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	n.o.Logf("sandbox %s: agent not listening 5 s after a snapshot", h.ID)
}

// StartSandboxFromSnapshot implements core.SnapshotRuntime. A snapshot
// with a process image of this node's driver is restored with it: the
// processes continue where they were. On another driver only the files
// come back (the progress message says so).
func (n *Node) StartSandboxFromSnapshot(ctx context.Context, sb core.Sandbox, chain []string, progress core.Progress) (core.Placement, error) {
	// Where a restore's time goes, logged once it has started: the
	// chain's manifests, the files, the process image and the driver.
	var tChain, tFiles, tImage, tDriver time.Duration
	var imgBytes int64
	t0 := time.Now()
	st, img, err := n.snaps.LoadChain(ctx, chain)
	if err != nil {
		return core.Placement{}, fmt.Errorf("load snapshot: %w", err)
	}
	tChain = time.Since(t0)
	initLayer := func(ctx context.Context, l driver.Layer) error {
		t := time.Now()
		res, err := n.snaps.Materialize(ctx, st, l)
		tFiles = time.Since(t)
		if err == nil {
			progress(40, fmt.Sprintf("restored %d files (%d bytes)", res.Entries, res.Bytes))
		}
		return err
	}
	var restore func(context.Context, driver.Spec) (driver.Instance, error)
	if img != nil {
		r, ok := n.o.Driver.(driver.Restorer)
		if !ok || img.Driver != n.o.Driver.Name() {
			n.o.Logf("sandbox %s: snapshot has %s processes; driver %s restores its files only", sb.ID, img.Driver, n.o.Driver.Name())
			progress(15, fmt.Sprintf("processes were captured by driver %s, this node runs %s: restoring files only", img.Driver, n.o.Driver.Name()))
		} else {
			restore = func(ctx context.Context, spec driver.Spec) (driver.Instance, error) {
				dir, err := n.snaps.TempDir()
				if err != nil {
					return nil, err
				}
				defer os.RemoveAll(dir)
				t := time.Now()
				size, err := n.snaps.MaterializeImage(ctx, img, dir)
				tImage, imgBytes = time.Since(t), size
				if err != nil {
					return nil, fmt.Errorf("process image: %w", err)
				}
				progress(50, fmt.Sprintf("restoring processes (%d-byte image)", size))
				t = time.Now()
				inst, err := r.Restore(ctx, spec, dir)
				tDriver = time.Since(t) - tFiles // the driver lays the files down itself
				return inst, err
			}
		}
	}
	pl, err := n.startSandbox(ctx, sb, progress, initLayer, restore)
	if err == nil {
		n.o.Logf("sandbox %s: started from snapshot in %v (manifests %v, files %v, process image %v for %d bytes, driver %v)",
			sb.ID, time.Since(t0).Round(time.Millisecond), tChain.Round(time.Millisecond), tFiles.Round(time.Millisecond),
			tImage.Round(time.Millisecond), imgBytes, tDriver.Round(time.Millisecond))
	}
	return pl, err
}

// followRestored records the output of the commands a restored agent
// still runs (or retains), as AdoptSandbox does after a restart.
func (n *Node) followRestored(ctx context.Context, h *Sandbox) {
	procs, err := h.Agent.List(ctx)
	if err != nil {
		n.o.Logf("sandbox %s: list restored commands: %v", h.ID, err)
		return
	}
	for _, p := range procs {
		if err := h.follow(p, nil); err != nil {
			n.o.Logf("sandbox %s: follow restored command %s: %v", h.ID, p.ID, err)
		}
	}
}

// CollectSnapshots implements core.SnapshotRuntime.
func (n *Node) CollectSnapshots(ctx context.Context, keep []string) (any, error) {
	return n.snaps.GC(ctx, keep)
}

// IdleFor implements core.IdleRuntime: the time since the last data-plane
// call or the end of a command (a running command is activity); false for
// a sandbox not running here or paused.
func (n *Node) IdleFor(id string) (time.Duration, bool) {
	h, err := n.sandbox(id)
	if err != nil || h.paused.Load() {
		return 0, false
	}
	h.mu.Lock()
	cmds := make([]*Command, 0, len(h.cmds))
	for _, c := range h.cmds {
		cmds = append(cmds, c)
	}
	h.mu.Unlock()
	if h.openTunnels.Load() > 0 {
		// An open forwarded connection (a WebSocket, a download) is activity.
		h.lastActive.Store(time.Now().UnixNano())
		return 0, true
	}
	for _, c := range cmds {
		if c.Exit() == nil {
			h.lastActive.Store(time.Now().UnixNano())
			return 0, true
		}
	}
	return time.Since(time.Unix(0, h.lastActive.Load())), true
}
