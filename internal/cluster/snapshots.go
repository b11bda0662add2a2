package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// Snapshot RPC paths. Snapshot data stays in the store of the node that
// captured it, so a restore (fork, wake from hibernation) runs on that
// node: Place pins a fork to its snapshot's node.
const (
	PathCapture = "/node/v1/capture"
	PathRestore = "/node/v1/restore"
)

// maxChainLen bounds a snapshot chain on the wire.
const maxChainLen = 1000

// SnapshotBackend is what a node that keeps snapshots offers.
type SnapshotBackend interface {
	CaptureSnapshot(ctx context.Context, id string, chain []string) (string, core.SnapshotStats, error)
	StartSandboxFromSnapshot(ctx context.Context, sb core.Sandbox, chain []string, progress core.Progress) (core.Placement, error)
}

type captureReq struct {
	ID    string   `json:"id"`
	Chain []string `json:"chain"`
}

type captureResp struct {
	Digest string             `json:"digest"`
	Stats  core.SnapshotStats `json:"stats"`
}

type restoreReq struct {
	Sandbox core.Sandbox `json:"sandbox"`
	Chain   []string     `json:"chain"`
}

func validChain(chain []string) error {
	if len(chain) > maxChainLen {
		return fmt.Errorf("snapshot chain longer than %d: %w", maxChainLen, core.ErrInvalid)
	}
	for _, d := range chain {
		if len(d) == 0 || len(d) > 128 {
			return fmt.Errorf("bad manifest digest in chain: %w", core.ErrInvalid)
		}
	}
	return nil
}

// snapshotRoutes adds the snapshot routes when the backend keeps snapshots.
func (h *Handler) snapshotRoutes() {
	sb, ok := h.b.(SnapshotBackend)
	if !ok {
		return
	}
	h.route(PathCapture, func(ctx context.Context, body []byte) (any, error) {
		var r captureReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.ID) {
			return nil, fmt.Errorf("sandbox id %.40q: %w", r.ID, core.ErrInvalid)
		}
		if err := validChain(r.Chain); err != nil {
			return nil, err
		}
		d, st, err := sb.CaptureSnapshot(ctx, r.ID, r.Chain)
		return captureResp{Digest: d, Stats: st}, err
	})
	h.route(PathRestore, func(ctx context.Context, body []byte) (any, error) {
		var r restoreReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.Sandbox.ID) {
			return nil, fmt.Errorf("sandbox id %.40q: %w", r.Sandbox.ID, core.ErrInvalid)
		}
		if err := validChain(r.Chain); err != nil {
			return nil, err
		}
		pl, err := sb.StartSandboxFromSnapshot(ctx, r.Sandbox, r.Chain, func(int, string) {})
		return placementResp{Placement: pl}, err
	})
}

// CaptureSnapshot asks the node to capture a sandbox's writable layer.
func (c *Client) CaptureSnapshot(ctx context.Context, id string, chain []string) (string, core.SnapshotStats, error) {
	var out captureResp
	err := c.call(ctx, PathCapture, captureReq{ID: id, Chain: chain}, &out)
	return out.Digest, out.Stats, err
}

// StartSandboxFromSnapshot asks the node to start sb from a chain it keeps.
func (c *Client) StartSandboxFromSnapshot(ctx context.Context, sb core.Sandbox, chain []string) (core.Placement, error) {
	var out placementResp
	err := c.call(ctx, PathRestore, restoreReq{Sandbox: sb, Chain: chain}, &out)
	return out.Placement, err
}

var _ core.SnapshotRuntime = (*Remote)(nil)

// CaptureSnapshot implements core.SnapshotRuntime on the sandbox's node.
func (r *Remote) CaptureSnapshot(ctx context.Context, id string, chain []string) (string, core.SnapshotStats, error) {
	var d string
	var st core.SnapshotStats
	err := r.onNode(ctx, id, func(c *Client) error {
		var err error
		d, st, err = c.CaptureSnapshot(ctx, id, chain)
		return err
	})
	return d, st, err
}

// StartSandboxFromSnapshot implements core.SnapshotRuntime on the node the
// record names (Place chose it for a fork; a hibernated sandbox keeps its
// node, unless that node is gone and shares its snapshot store: then the
// sandbox moves to another node sharing it, see moveHibernated). Like
// StartSandbox, a failed call is followed by a stop.
func (r *Remote) StartSandboxFromSnapshot(ctx context.Context, sb core.Sandbox, chain []string, progress core.Progress) (core.Placement, error) {
	if sb.Node == "" {
		return core.Placement{}, fmt.Errorf("sandbox %s was not placed on a node: %w", sb.ID, core.ErrUnavailable)
	}
	if sb.State == core.SandboxHibernated {
		moved, err := r.moveHibernated(ctx, sb, progress)
		if err != nil {
			return core.Placement{}, err
		}
		sb = moved
	}
	c, err := r.client(ctx, sb.Node)
	if errors.Is(err, errNodeLost) {
		err = fmt.Errorf("%v (its snapshots are kept there): %w", err, core.ErrUnavailable)
	}
	if err != nil {
		r.unreserve(sb.Node, sb.ID)
		return core.Placement{}, err
	}
	progress(20, "restoring on node "+sb.Node)
	gctx, gens := withGenSink(ctx)
	pl, err := c.StartSandboxFromSnapshot(gctx, sb, chain)
	if err != nil {
		r.unreserve(sb.Node, sb.ID)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if stopErr := c.StopSandbox(sctx, sb.ID); stopErr != nil && !errors.Is(stopErr, core.ErrUnavailable) {
			r.o.Logf("sandbox %s: stop on node %s after failed restore: %v", sb.ID, sb.Node, stopErr)
		}
		return core.Placement{}, err
	}
	r.started(sb.Node, sb.ID, gens.gen)
	return pl, nil
}

// CollectSnapshots implements core.SnapshotRuntime. With several replicas a
// collection could race another replica's capture on the same node, so
// nodes reclaim unreferenced snapshot data only at their own start, before
// they serve (see docs/scale-out.md).
func (r *Remote) CollectSnapshots(ctx context.Context, keep []string) (any, error) { return nil, nil }

// snapshotNode returns the node that keeps a snapshot's data: the node of
// the sandbox it was captured from.
func (r *Remote) snapshotNode(ctx context.Context, snapID string) (string, error) {
	snap, err := r.o.Store.GetSnapshot(ctx, "", snapID)
	if err != nil {
		return "", err
	}
	return r.nodeOf(ctx, snap.SandboxID)
}
