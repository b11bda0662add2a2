package cluster

import (
	"context"
	"fmt"

	"github.com/space-sandbox/space/internal/core"
)

// placeConstraint narrows where Place may put a sandbox restored from a
// snapshot.
type placeConstraint struct {
	pinned  string // only this node (its snapshots stay on it)
	store   string // only nodes sharing this snapshot store
	prefer  string // of equally free nodes, this one (data on its disk)
	exclude string // never this node
	driver  string // only nodes running this driver (a drain keeps processes)
}

func (pc placeConstraint) allows(n core.NodeRecord) bool {
	if pc.store != "" && n.SnapshotStore != pc.store {
		return false
	}
	if pc.driver != "" && n.Driver != pc.driver {
		return false
	}
	return pc.exclude == "" || n.Name != pc.exclude
}

// snapshotConstraint says where data captured on node may be restored:
// anywhere sharing its snapshot store, else on node itself.
func (r *Remote) snapshotConstraint(ctx context.Context, node string) (placeConstraint, error) {
	rec, ok, err := r.nodeRecord(ctx, node)
	if err != nil {
		return placeConstraint{}, err
	}
	if ok && rec.SnapshotStore != "" {
		return placeConstraint{store: rec.SnapshotStore, prefer: node}, nil
	}
	return placeConstraint{pinned: node}, nil
}

func (r *Remote) nodeRecord(ctx context.Context, name string) (core.NodeRecord, bool, error) {
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return core.NodeRecord{}, false, err
	}
	for _, n := range nodes {
		if n.Name == name && n.Kind == core.NodeKindNode {
			return n, true, nil
		}
	}
	return core.NodeRecord{}, false, nil
}

// moveHibernated returns the hibernated sandbox sb to wake, on its own
// node when that node is ready and not drained, else (its node lost,
// silent or drained, and sharing its snapshot store) moved to another
// ready node sharing that store: the record names the new node before
// anything starts there, changed only if it still names the old one (of
// two replicas waking it at once, one moves it and the other fails with a
// conflict). A node without a shared store keeps its hibernated sandboxes
// until it is back; a drained node that is still ready keeps one no other
// node can take (it wakes where it is).
func (r *Remote) moveHibernated(ctx context.Context, sb core.Sandbox, progress core.Progress) (core.Sandbox, error) {
	rec, ok, err := r.nodeRecord(ctx, sb.Node)
	if err != nil {
		return sb, err
	}
	if !ok || rec.SnapshotStore == "" {
		return sb, nil
	}
	ready := r.fresh(rec, r.o.Now())
	if ready && !rec.Drained {
		return sb, nil
	}
	from, why := sb.Node, rec.State
	pc := placeConstraint{store: rec.SnapshotStore, exclude: from}
	if ready {
		// Drained for an upgrade: the same driver, so processes a
		// process snapshot captured come back too.
		why, pc.driver = "drained", rec.Driver
	}
	to, err := r.place(ctx, sb, pc)
	if err != nil && ready {
		r.o.Logf("sandbox %s: node %s is drained but no other node can take it (%v); waking it there", sb.ID, from, err)
		return sb, nil
	}
	if err != nil {
		return sb, fmt.Errorf("node %s of hibernated sandbox %s is not ready (%s), and no other node can take it: %w",
			from, sb.ID, rec.State, err)
	}
	moved, err := r.o.Store.UpdateSandbox(ctx, sb.ID, func(cur *core.Sandbox) error {
		if cur.State != core.SandboxHibernated || cur.Node != from {
			return fmt.Errorf("sandbox %s became %s on node %s while waking: %w", sb.ID, cur.State, cur.Node, core.ErrConflict)
		}
		cur.Node = to
		return nil
	})
	if err != nil {
		r.unreserve(to, sb.ID)
		return sb, err
	}
	r.o.Logf("sandbox %s: node %s is %s; waking it on node %s from the shared snapshot store %s", sb.ID, from, why, to, rec.SnapshotStore)
	progress(15, fmt.Sprintf("node %s is %s: restoring on node %s from the shared snapshot store", from, why, to))
	return moved, nil
}

var (
	_ core.Relocator    = (*Remote)(nil)
	_ core.DrainRuntime = (*Remote)(nil)
)

// NodesChanged implements core.DrainRuntime.
func (r *Remote) NodesChanged() { r.dropNodeCache() }

// DrainTarget implements core.DrainRuntime: the node a wake of sb would
// move it to were its node drained (the same driver, sharing its node's
// snapshot store, with room), or why there is none. Nothing is reserved.
func (r *Remote) DrainTarget(ctx context.Context, sb core.Sandbox) (string, error) {
	to, err := r.Relocate(ctx, sb)
	if err == nil {
		r.unreserve(to, sb.ID)
	}
	return to, err
}

// Relocate implements core.Relocator: a ready, undrained node other than
// sb.Node with its driver that shares sb.Node's snapshot store (where its
// checkpoints are), with room reserved for sb. Data kept only on a node's
// own disk cannot leave it.
func (r *Remote) Relocate(ctx context.Context, sb core.Sandbox) (string, error) {
	rec, ok, err := r.nodeRecord(ctx, sb.Node)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("node %s is not registered: %w", sb.Node, core.ErrNotFound)
	}
	if rec.SnapshotStore == "" {
		return "", fmt.Errorf("node %s has no shared snapshot store (space node --snapshot-store), so its sandboxes cannot restore on another node: %w",
			sb.Node, core.ErrUnavailable)
	}
	to, err := r.place(ctx, sb, placeConstraint{store: rec.SnapshotStore, exclude: sb.Node, driver: rec.Driver})
	if err != nil {
		return "", fmt.Errorf("no other ready, undrained %s node sharing snapshot store %s can take it: %w", rec.Driver, rec.SnapshotStore, err)
	}
	return to, nil
}
