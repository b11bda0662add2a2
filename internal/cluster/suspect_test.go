package cluster

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// A create whose node refuses the connection (dead, not yet marked lost)
// moves to another node; placement then passes the dead node by until it
// heartbeats again. Relocate (a lost node's checkpointed sandbox) picks
// another node sharing the store, and refuses a node without one.
func TestUnreachableNode(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// A loopback port nothing listens on: connections are refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	const shared = "dir:/srv/snaps"
	put := func(name, store string, used int64, at time.Time) {
		if _, err := st.PutNode(ctx, core.NodeRecord{Name: name, Kind: core.NodeKindNode, RPCURL: dead,
			MemoryBytes: 8 << 30, UsedMemoryBytes: used, Templates: []string{"minimal"}, SnapshotStore: store,
			HeartbeatAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	put("x", shared, 0, now) // the most room
	put("y", shared, 2<<30, now)
	put("z", "", 4<<30, now)
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}, Timeout: time.Minute, NodeCacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	sb := core.Sandbox{ID: core.NewID("sbx-"), ProjectID: "p", Template: "minimal", State: core.SandboxCreating,
		Limits: core.Limits{MemoryBytes: 32 << 20}, CreatedAt: now, UpdatedAt: now}
	if sb.Node, err = r.Place(ctx, sb); err != nil || sb.Node != "x" {
		t.Fatalf("place: %q %v, want x", sb.Node, err)
	}
	if _, _, err := st.CreateSandboxOp(ctx, sb, core.Operation{ID: core.NewID("op-"), ProjectID: "p", Kind: "sandbox.create",
		Target: sb.ID, State: core.OpRunning}, ""); err != nil {
		t.Fatal(err)
	}
	// y refuses too, so the start fails, but after moving the record.
	if _, err := r.StartSandbox(ctx, sb, func(int, string) {}); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("start with every node refusing: %v, want unavailable", err)
	}
	if rec, err := st.GetSandbox(ctx, "p", sb.ID); err != nil || rec.Node != "y" {
		t.Fatalf("record after x refused: node %q %v, want y", rec.Node, err)
	}
	for _, want := range []string{"z"} { // x and y both refused since their heartbeats
		if got, err := r.Place(ctx, core.Sandbox{ID: core.NewID("sbx-"), ProjectID: "p", Template: "minimal"}); err != nil || got != want {
			t.Fatalf("place with x and y suspect: %q %v, want %s", got, err, want)
		}
	}
	put("x", shared, 0, time.Now().UTC().Add(time.Second)) // x heartbeats again
	if got, err := r.Place(ctx, core.Sandbox{ID: core.NewID("sbx-"), ProjectID: "p", Template: "minimal"}); err != nil || got != "x" {
		t.Fatalf("place after x heartbeat again: %q %v, want x", got, err)
	}
	put("y", shared, 2<<30, time.Now().UTC().Add(time.Second))
	if got, err := r.Relocate(ctx, core.Sandbox{ID: core.NewID("sbx-"), ProjectID: "p", Template: "minimal", Node: "x"}); err != nil || got != "y" {
		t.Fatalf("relocate from x: %q %v, want y (shares the store; z does not)", got, err)
	}
	if got, err := r.Relocate(ctx, core.Sandbox{ID: core.NewID("sbx-"), ProjectID: "p", Template: "minimal", Node: "z"}); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("relocate from z (no shared store): %q %v, want unavailable", got, err)
	}
}
