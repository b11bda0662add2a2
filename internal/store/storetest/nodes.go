package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// testNodes checks the node registry of stores that implement
// core.NodeStore: heartbeats upsert, a stale node is marked lost exactly
// once, a fresh one never, and a heartbeat after a loss makes it ready and
// tells the node it had been lost.
func testNodes(t *testing.T, st core.Store) {
	ns, ok := st.(core.NodeStore)
	if !ok {
		t.Skip("store has no node registry")
	}
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0).UTC()
	n := core.NodeRecord{Name: "n1", Kind: core.NodeKindNode, RPCURL: "http://127.0.0.1:1", DataURL: "http://127.0.0.1:2",
		MemoryBytes: 8 << 30, CPUMillis: 4000, Sandboxes: 2, Templates: []string{"minimal"}, StartedAt: t0, HeartbeatAt: t0}
	prev, err := ns.PutNode(ctx, n)
	if err != nil || prev.State != "" {
		t.Fatalf("first PutNode: %+v, %v", prev, err)
	}
	other := core.NodeRecord{Name: "n2", Kind: core.NodeKindServer, StartedAt: t0, HeartbeatAt: t0.Add(10 * time.Second)}
	if _, err := ns.PutNode(ctx, other); err != nil {
		t.Fatal(err)
	}
	list, err := ns.ListNodes(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "n1" || list[0].State != core.NodeReady ||
		list[0].Templates[0] != "minimal" || !list[0].HeartbeatAt.Equal(t0) || list[1].Kind != core.NodeKindServer {
		t.Fatalf("ListNodes: %+v, %v", list, err)
	}
	// Not stale yet: nothing happens.
	if done, err := ns.MarkNodeLost(ctx, "n1", t0, "late"); err != nil || done {
		t.Fatalf("MarkNodeLost of a fresh node: %v %v", done, err)
	}
	if done, err := ns.MarkNodeLost(ctx, "n1", t0.Add(5*time.Second), "no heartbeat"); err != nil || !done {
		t.Fatalf("MarkNodeLost: %v %v", done, err)
	}
	if done, err := ns.MarkNodeLost(ctx, "n1", t0.Add(5*time.Second), "no heartbeat"); err != nil || done {
		t.Fatalf("second MarkNodeLost: %v %v (must act once)", done, err)
	}
	if done, err := ns.MarkNodeLost(ctx, "nope", t0.Add(time.Hour), "x"); err != nil || done {
		t.Fatalf("MarkNodeLost of an unknown node: %v %v", done, err)
	}
	list, _ = ns.ListNodes(ctx)
	if list[0].State != core.NodeLost || list[0].StateReason != "no heartbeat" || list[1].State != core.NodeReady {
		t.Fatalf("after loss: %+v", list)
	}
	n.HeartbeatAt = t0.Add(20 * time.Second)
	prev, err = ns.PutNode(ctx, n)
	if err != nil || prev.State != core.NodeLost {
		t.Fatalf("PutNode after loss: previous %+v, %v", prev, err)
	}
	list, _ = ns.ListNodes(ctx)
	if list[0].State != core.NodeReady || list[0].StateReason != "" {
		t.Fatalf("after a new heartbeat: %+v", list[0])
	}
	if err := ns.DeleteNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if list, _ = ns.ListNodes(ctx); len(list) != 1 || list[0].Name != "n2" {
		t.Fatalf("after delete: %+v", list)
	}
}
