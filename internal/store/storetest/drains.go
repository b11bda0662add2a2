package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// testNodeDrains checks drained nodes (core.NodeDrainStore): a drain shows
// in ListNodes, survives heartbeats and the node's own record being
// deleted and written again (a restart), keeps its first time when set
// twice, and an undrain removes it.
func testNodeDrains(t *testing.T, st core.Store) {
	ns, ok := st.(core.NodeStore)
	ds, ok2 := st.(core.NodeDrainStore)
	if !ok || !ok2 {
		t.Skip("store has no node drains")
	}
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0).UTC()
	for _, name := range []string{"n1", "n2"} {
		if _, err := ns.PutNode(ctx, core.NodeRecord{Name: name, Kind: core.NodeKindNode, StartedAt: t0, HeartbeatAt: t0}); err != nil {
			t.Fatal(err)
		}
	}
	drainedOf := func() map[string]*time.Time {
		t.Helper()
		list, err := ns.ListNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*time.Time{}
		for _, n := range list {
			if n.Drained != (n.DrainedAt != nil) {
				t.Fatalf("node %s: drained %v with time %v", n.Name, n.Drained, n.DrainedAt)
			}
			out[n.Name] = n.DrainedAt
		}
		return out
	}
	if d := drainedOf(); d["n1"] != nil || d["n2"] != nil {
		t.Fatalf("drained before any drain: %v", d)
	}
	if err := ds.SetNodeDrained(ctx, "n1", true, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := ds.SetNodeDrained(ctx, "n1", true, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if d := drainedOf(); d["n1"] == nil || !d["n1"].Equal(t0.Add(time.Second)) || d["n2"] != nil {
		t.Fatalf("after draining n1 twice: %v", d)
	}
	// A heartbeat whose document claims nothing about drains (or claims
	// the opposite) changes nothing; nor does a restart.
	if _, err := ns.PutNode(ctx, core.NodeRecord{Name: "n1", Kind: core.NodeKindNode, StartedAt: t0, HeartbeatAt: t0.Add(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.PutNode(ctx, core.NodeRecord{Name: "n2", Kind: core.NodeKindNode, Drained: true, StartedAt: t0, HeartbeatAt: t0.Add(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if err := ns.DeleteNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if d := drainedOf(); len(d) != 1 || d["n2"] != nil {
		t.Fatalf("with n1's record deleted: %v", d)
	}
	if _, err := ns.PutNode(ctx, core.NodeRecord{Name: "n1", Kind: core.NodeKindNode, StartedAt: t0.Add(time.Minute), HeartbeatAt: t0.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if d := drainedOf(); d["n1"] == nil || d["n2"] != nil {
		t.Fatalf("after n1 restarted: %v", d)
	}
	if err := ds.SetNodeDrained(ctx, "n1", false, t0); err != nil {
		t.Fatal(err)
	}
	if err := ds.SetNodeDrained(ctx, "n1", false, t0); err != nil {
		t.Fatal(err)
	}
	if d := drainedOf(); d["n1"] != nil || d["n2"] != nil {
		t.Fatalf("after undrain: %v", d)
	}
}
