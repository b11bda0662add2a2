package cluster

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// TestMonitorMarksSilentNodeLost: a node whose heartbeat is older than the
// timeout is marked lost once, its live sandboxes become lost with the
// reason, and another node's sandboxes and a fresh node are left alone.
func TestMonitorMarksSilentNodeLost(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Unix(1_800_000_000, 0).UTC()
	clock := func() time.Time { return now }
	broker := core.NewBroker(st, clock)
	engine := core.NewEngine(ctx, st, broker, clock, t.Logf)
	defer engine.Shutdown(ctx)
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, clock), Link: LinkOptions{Plaintext: true}, Timeout: 5 * time.Second, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	svc := core.NewService(st, engine, broker, r, core.ServiceOptions{NodeName: "srv", AnyNode: true, Now: clock, Logf: t.Logf})
	for _, n := range []core.NodeRecord{
		{Name: "old", Kind: core.NodeKindNode, RPCURL: "http://127.0.0.1:1", HeartbeatAt: now.Add(-6 * time.Second)},
		{Name: "new", Kind: core.NodeKindNode, RPCURL: "http://127.0.0.1:2", HeartbeatAt: now.Add(-time.Second)},
	} {
		if _, err := st.PutNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(id, node string, state core.SandboxState) {
		sb := core.Sandbox{ID: id, ProjectID: "p", Template: "minimal", State: state, Node: node, CreatedAt: now, UpdatedAt: now}
		if _, _, err := st.CreateSandboxOp(ctx, sb, core.Operation{ID: "op-" + id, ProjectID: "p", Kind: "sandbox.create", Target: id, State: core.OpSucceeded}, ""); err != nil {
			t.Fatal(err)
		}
	}
	mk("sbx-0000000000000001", "old", core.SandboxRunning)
	mk("sbx-0000000000000002", "old", core.SandboxPaused)
	mk("sbx-0000000000000003", "old", core.SandboxDeleted)
	mk("sbx-0000000000000004", "new", core.SandboxRunning)
	mons := make([]*Monitor, 2)
	for i := range mons {
		if mons[i], err = NewMonitor(MonitorOptions{Store: st, Service: svc, Name: "srv", Timeout: 5 * time.Second, Now: clock, Logf: t.Logf}); err != nil {
			t.Fatal(err)
		}
	}
	mons[0].Check(ctx)
	mons[1].Check(ctx) // a second watcher finds nothing left to do
	want := map[string]core.SandboxState{"sbx-0000000000000001": core.SandboxLost, "sbx-0000000000000002": core.SandboxLost,
		"sbx-0000000000000003": core.SandboxDeleted, "sbx-0000000000000004": core.SandboxRunning}
	for id, st0 := range want {
		sb, err := st.GetSandbox(ctx, "", id)
		if err != nil || sb.State != st0 {
			t.Fatalf("%s: %s %v, want %s", id, sb.State, err, st0)
		}
		if st0 == core.SandboxLost && !strings.Contains(sb.StateReason, "node old stopped heartbeating") {
			t.Fatalf("%s reason %q", id, sb.StateReason)
		}
	}
	nodes, _ := st.ListNodes(ctx)
	for _, n := range nodes {
		if (n.Name == "old") != (n.State == core.NodeLost) {
			t.Fatalf("node %s is %s", n.Name, n.State)
		}
	}
	// The lost node's sandboxes can be deleted from here without it.
	op, err := svc.Delete(ctx, "p", "sbx-0000000000000001")
	if err != nil {
		t.Fatalf("delete of a lost sandbox: %v", err)
	}
	if op, err = engine.Wait(ctx, "p", op.ID, 10*time.Second); err != nil || op.State != core.OpSucceeded {
		t.Fatalf("delete of a lost sandbox: %+v %v", op, err)
	}
	// A lost node is never scheduled on; once it heartbeats again it is.
	sb := core.Sandbox{ID: "sbx-0000000000000009", ProjectID: "p", Template: "minimal"}
	if _, err := st.PutNode(ctx, core.NodeRecord{Name: "new", Kind: core.NodeKindNode, RPCURL: "x", HeartbeatAt: now, Templates: []string{"base"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Place(ctx, sb); err == nil {
		t.Fatal("placed on a lost node or one without the template")
	}
	if _, err := st.PutNode(ctx, core.NodeRecord{Name: "old", Kind: core.NodeKindNode, RPCURL: "x", HeartbeatAt: now, Templates: []string{"minimal"}}); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Place(ctx, sb); err != nil || got != "old" {
		t.Fatalf("after the node came back: %q %v", got, err)
	}
}
