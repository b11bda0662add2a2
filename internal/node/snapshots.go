package node

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver"
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
	h, err := n.sandbox(id)
	if err != nil {
		return err
	}
	return n.freeze(ctx, h)
}

// ResumeSandbox implements core.PauseRuntime.
func (n *Node) ResumeSandbox(ctx context.Context, id string) error {
	h, err := n.sandbox(id)
	if err != nil {
		return err
	}
	return n.thaw(ctx, h)
}

// CaptureSnapshot implements core.SnapshotRuntime: the sandbox is frozen
// (if it is not paused already) while its writable layer is read, and
// continues afterwards.
func (n *Node) CaptureSnapshot(ctx context.Context, id string, chain []string) (string, core.SnapshotStats, error) {
	var stats core.SnapshotStats
	h, err := n.sandbox(id)
	if err != nil {
		return "", stats, err
	}
	li, ok := driver.As[driver.LayerInstance](h.inst)
	if !ok {
		return "", stats, fmt.Errorf("driver has no host-side writable layer to snapshot: %w", core.ErrUnavailable)
	}
	layer, err := li.WritableLayer()
	if err != nil {
		return "", stats, err
	}
	parent, err := n.snaps.LoadState(ctx, chain)
	if err != nil {
		return "", stats, fmt.Errorf("load parent snapshot: %w", err)
	}
	wasPaused := h.paused.Load()
	t0 := time.Now()
	if !wasPaused {
		if err := n.freeze(ctx, h); err != nil {
			return "", stats, err
		}
		defer func() {
			if err := n.thaw(context.WithoutCancel(ctx), h); err != nil {
				n.o.Logf("sandbox %s: thaw after snapshot: %v", id, err)
			}
		}()
	}
	res, err := n.snaps.Capture(ctx, layer, parent)
	stats.FrozenMS = time.Since(t0).Milliseconds()
	if err != nil {
		return "", stats, err
	}
	stats.Entries, stats.Changed, stats.Removed, stats.Skipped = res.Entries, res.Changed, res.Removed, res.Skipped
	stats.LogicalBytes, stats.BytesRead, stats.NewChunks = res.LogicalBytes, res.BytesRead, res.NewChunks
	stats.ChunkBytes, stats.ManifestBytes, stats.BytesStored = res.ChunkBytes, res.ManifestBytes, res.BytesStored
	return res.Manifest, stats, nil
}

// StartSandboxFromSnapshot implements core.SnapshotRuntime.
func (n *Node) StartSandboxFromSnapshot(ctx context.Context, sb core.Sandbox, chain []string, progress core.Progress) (core.Placement, error) {
	st, err := n.snaps.LoadState(ctx, chain)
	if err != nil {
		return core.Placement{}, fmt.Errorf("load snapshot: %w", err)
	}
	return n.startSandbox(ctx, sb, progress, func(ctx context.Context, l driver.Layer) error {
		res, err := n.snaps.Materialize(ctx, st, l)
		if err == nil {
			progress(40, fmt.Sprintf("restored %d files (%d bytes)", res.Entries, res.Bytes))
		}
		return err
	})
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
	for _, c := range cmds {
		if c.Exit() == nil {
			h.lastActive.Store(time.Now().UnixNano())
			return 0, true
		}
	}
	return time.Since(time.Unix(0, h.lastActive.Load())), true
}
