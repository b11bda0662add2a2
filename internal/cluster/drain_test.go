package cluster

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// TestPlaceDrained: a drained node gets no placement (with every node that
// could take it drained the answer says so), and DrainTarget finds the
// node a drained node's sandbox would move to: sharing its snapshot store,
// running its driver, not drained; none without a shared store.
func TestPlaceDrained(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now().UTC()
	put := func(name, driver, store string, free int64) {
		if _, err := st.PutNode(ctx, core.NodeRecord{Name: name, Kind: core.NodeKindNode, RPCURL: "http://127.0.0.1:1", HeartbeatAt: now,
			Driver: driver, SnapshotStore: store, MemoryBytes: 8 << 30, UsedMemoryBytes: 8<<30 - free, Templates: []string{"minimal"}}); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "gvisor", "dir:/s", 7<<30) // the most room: the scheduler's pick
	put("b", "gvisor", "dir:/s", 4<<30)
	put("c", "namespace", "dir:/s", 6<<30)
	put("d", "gvisor", "", 5<<30)
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}, Timeout: 5 * time.Second, NodeCacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	sb := core.Sandbox{ID: "sbx-0000000000000001", ProjectID: "p", Template: "minimal", Limits: core.Limits{MemoryBytes: 1 << 20}}
	place := func() string {
		t.Helper()
		got, err := r.Place(ctx, sb)
		if err != nil {
			t.Fatal(err)
		}
		r.unreserve(got, sb.ID)
		return got
	}
	if got := place(); got != "a" {
		t.Fatalf("placed on %s, want a", got)
	}
	if err := st.SetNodeDrained(ctx, "a", true, now); err != nil {
		t.Fatal(err)
	}
	if got := place(); got != "c" {
		t.Fatalf("with a drained: placed on %s, want c", got)
	}
	// a's sandbox moves to b: c runs another driver, d shares no store.
	sb.Node = "a"
	if to, err := r.DrainTarget(ctx, sb); err != nil || to != "b" {
		t.Fatalf("drain target of a's sandbox: %q %v, want b", to, err)
	}
	st.SetNodeDrained(ctx, "b", true, now)
	if to, err := r.DrainTarget(ctx, sb); err == nil || !strings.Contains(err.Error(), "drained") {
		t.Fatalf("with b drained too: %q %v", to, err)
	}
	sb.Node = "d"
	if _, err := r.DrainTarget(ctx, sb); !errors.Is(err, core.ErrUnavailable) || !strings.Contains(err.Error(), "no shared snapshot store") {
		t.Fatalf("drain target without a shared store: %v", err)
	}
	st.SetNodeDrained(ctx, "c", true, now)
	st.SetNodeDrained(ctx, "d", true, now)
	if _, err := r.Place(ctx, sb); !errors.Is(err, core.ErrUnavailable) || !strings.Contains(err.Error(), "drained") {
		t.Fatalf("every node drained: %v", err)
	}
	st.SetNodeDrained(ctx, "a", false, now)
	if got := place(); got != "a" {
		t.Fatalf("after undrain: placed on %s, want a", got)
	}
}
