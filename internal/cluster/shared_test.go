package cluster

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// TestPlaceSharedSnapshotStore: a fork of a snapshot taken on a node that
// shares its snapshot store goes to that node while it has room and is
// ready, else to another node sharing the store (never to one with another
// store or none); a snapshot of a node without a shared store stays pinned
// there. A hibernated sandbox of a silent node sharing its store moves to
// another node (once: a second waker gets a conflict); one of a node
// without a shared store stays put.
func TestPlaceSharedSnapshotStore(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now().UTC()
	const shared = "s3://snaps/space@127.0.0.1:9000"
	put := func(name, store string, used int64, age time.Duration) {
		if _, err := st.PutNode(ctx, core.NodeRecord{Name: name, Kind: core.NodeKindNode, RPCURL: "http://127.0.0.1:1",
			MemoryBytes: 8 << 30, UsedMemoryBytes: used, Templates: []string{"minimal"}, SnapshotStore: store,
			HeartbeatAt: now.Add(-age)}); err != nil {
			t.Fatal(err)
		}
	}
	put("x", shared, 6<<30, 0) // busy, but holds the data
	put("y", shared, 1<<30, 0)
	put("z", "", 0, 0)               // the most room, no shared store
	put("w", "dir:/elsewhere", 0, 0) // another store
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}, Timeout: 5 * time.Second, NodeCacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	sandbox := func(node string, state core.SandboxState) core.Sandbox {
		n++
		sb := core.Sandbox{ID: core.NewID("sbx-"), ProjectID: "p", Template: "minimal", State: state, Node: node,
			Limits: core.Limits{MemoryBytes: 32 << 20}, CreatedAt: now, UpdatedAt: now}
		if _, _, err := st.CreateSandboxOp(ctx, sb, core.Operation{ID: core.NewID("op-"), ProjectID: "p", Kind: "sandbox.create",
			Target: sb.ID, State: core.OpSucceeded}, ""); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	snapshotOf := func(sb core.Sandbox) string {
		snap := core.Snapshot{ID: core.NewID("snap-"), ProjectID: "p", SandboxID: sb.ID, Template: "minimal",
			State: core.SnapshotReady, CreatedAt: now, UpdatedAt: now}
		if _, _, err := st.CreateSnapshotOp(ctx, snap, core.Operation{ID: core.NewID("op-"), ProjectID: "p", Kind: "sandbox.snapshot",
			Target: sb.ID, State: core.OpSucceeded}, ""); err != nil {
			t.Fatal(err)
		}
		return snap.ID
	}
	fork := func(snap string) (string, error) {
		return r.Place(ctx, core.Sandbox{ID: core.NewID("sbx-"), ProjectID: "p", Template: "minimal", Snapshot: snap,
			Limits: core.Limits{MemoryBytes: 32 << 20}})
	}
	onX := snapshotOf(sandbox("x", core.SandboxRunning))
	// Forks spread by free memory like creates: busy x gets none until y
	// is as full; of equals, x (the data is on its disk).
	for i := 0; i < 3; i++ {
		if got, err := fork(onX); err != nil || got != "y" {
			t.Fatalf("fork %d of a snapshot on busy x: %q %v, want y (more room, shares the store)", i, got, err)
		}
	}
	put("x", shared, 1<<30, 0)
	put("y", shared, 1<<30, 0)
	r2, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}, Timeout: 5 * time.Second, NodeCacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	forks := map[string]int{}
	for i := 0; i < 4; i++ {
		got, err := r2.Place(ctx, core.Sandbox{ID: core.NewID("sbx-"), ProjectID: "p", Template: "minimal", Snapshot: onX,
			Limits: core.Limits{MemoryBytes: 32 << 20}})
		if err != nil || i == 0 && got != "x" {
			t.Fatalf("fork %d of a snapshot on x, both as free: %q %v, want x first", i, got, err)
		}
		forks[got]++
	}
	if forks["x"] != 2 || forks["y"] != 2 {
		t.Fatalf("forks of a snapshot on x: %v, want two each", forks)
	}
	onZ := snapshotOf(sandbox("z", core.SandboxRunning))
	if got, err := fork(onZ); err != nil || got != "z" {
		t.Fatalf("fork of a snapshot on z (no shared store): %q %v, want z", got, err)
	}

	hib := sandbox("x", core.SandboxHibernated)
	hibZ := sandbox("z", core.SandboxHibernated)
	noop := func(int, string) {}
	if got, err := r.moveHibernated(ctx, hib, noop); err != nil || got.Node != "x" {
		t.Fatalf("wake with x ready: %q %v, want x", got.Node, err)
	}

	// x and z fall silent.
	put("x", shared, 6<<30, time.Minute)
	put("z", "", 0, time.Minute)
	for i := 0; i < 3; i++ {
		if got, err := fork(onX); err != nil || got != "y" {
			t.Fatalf("fork of a snapshot on silent x: %q %v, want y (shares the store)", got, err)
		}
	}
	if _, err := fork(onZ); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("fork of a snapshot on silent z: %v, want unavailable", err)
	}
	got, err := r.moveHibernated(ctx, hib, noop)
	if err != nil || got.Node != "y" {
		t.Fatalf("wake with x silent: %q %v, want y", got.Node, err)
	}
	if rec, err := st.GetSandbox(ctx, "p", hib.ID); err != nil || rec.Node != "y" || rec.State != core.SandboxHibernated {
		t.Fatalf("record after the move: %+v %v", rec, err)
	}
	if _, err := r.moveHibernated(ctx, hib, noop); !errors.Is(err, core.ErrConflict) {
		t.Fatalf("second waker with the old record: %v, want conflict", err)
	}
	if got, err := r.moveHibernated(ctx, hibZ, noop); err != nil || got.Node != "z" {
		t.Fatalf("wake of a sandbox of z (no shared store): %q %v, want z (kept until it is back)", got.Node, err)
	}
	// Nobody else shares the store: the wake fails, the record stays.
	put("y", shared, 1<<30, time.Minute)
	hib2 := sandbox("x", core.SandboxHibernated)
	if _, err := r.moveHibernated(ctx, hib2, noop); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("no node shares the store: %v", err)
	}
	if rec, _ := st.GetSandbox(ctx, "p", hib2.ID); rec.Node != "x" {
		t.Fatalf("record moved to %q without a node to go to", rec.Node)
	}
}
