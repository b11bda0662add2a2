package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// countingBackend is a node's committed set as trackedRuntime keeps it:
// limits per live sandbox and a generation bumped on every change.
type countingBackend struct {
	fakeBackend
	mu    sync.Mutex
	gen   uint64
	live  map[string]core.Limits
	added map[string]uint64
}

func newCountingBackend(start uint64) *countingBackend {
	return &countingBackend{gen: start, live: map[string]core.Limits{}, added: map[string]uint64{}}
}

func (b *countingBackend) StartSandbox(ctx context.Context, sb core.Sandbox, _ core.Progress) (core.Placement, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gen++
	b.live[sb.ID], b.added[sb.ID] = sb.Limits, b.gen
	return core.Placement{Driver: "fake", Instance: sb.ID}, nil
}

func (b *countingBackend) StopSandbox(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.live[id]; ok {
		b.gen++
		delete(b.live, id)
		delete(b.added, id)
	}
	return nil
}

func (b *countingBackend) Generation() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen
}

func (b *countingBackend) AddedAt(id string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.added[id]
}

// record is the node's heartbeat now.
func (b *countingBackend) record(name, url string, mem int64) core.NodeRecord {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := core.NodeRecord{Name: name, Kind: core.NodeKindNode, RPCURL: url, MemoryBytes: mem, CPUMillis: 2000,
		Templates: []string{"minimal"}, HeartbeatAt: time.Now().UTC(), Generation: b.gen, Sandboxes: len(b.live)}
	for _, l := range b.live {
		n.UsedMemoryBytes += l.MemoryBytes
		n.UsedCPUMillis += l.CPUMillis
	}
	return n
}

// The issue-31 reproduction: create → delete churn much faster than the
// heartbeats, against two nodes that hold the live set several times over.
// Placements must count until a heartbeat shows them and no longer (no
// double count), and a stopped sandbox's room is free at once; only a
// really full fleet answers ErrExhausted, saying what each node has free.
func TestPlacementChurn(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const nodeMem, sbMem = 4 << 30, 1 << 30 // four sandboxes per node
	backends := map[string]*countingBackend{}
	urls := map[string]string{}
	for i, name := range []string{"n1", "n2"} {
		b := newCountingBackend(uint64(1000 * (i + 1)))
		srv := httptest.NewServer(NewHandler(b, NewVerifier(secret, name, nil), t.Logf))
		defer srv.Close()
		backends[name], urls[name] = b, srv.URL
	}
	heartbeat := func() {
		for name, b := range backends {
			if _, err := st.PutNode(ctx, b.record(name, urls[name], nodeMem)); err != nil {
				t.Fatal(err)
			}
		}
	}
	heartbeat()
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	create := func(i int) (core.Sandbox, error) {
		sb := core.Sandbox{ID: fmt.Sprintf("sbx-%016x", i), ProjectID: "p", Template: "minimal", TemplateRef: "minimal",
			State: core.SandboxCreating, Limits: core.Limits{MemoryBytes: sbMem, CPUMillis: 500}}
		node, err := r.Place(ctx, sb)
		if err != nil {
			return sb, err
		}
		sb.Node = node
		if _, _, err := st.CreateSandboxOp(ctx, sb, core.Operation{ID: "op-" + sb.ID, ProjectID: "p", Kind: "sandbox.create", Target: sb.ID, State: core.OpSucceeded}, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := r.StartSandbox(ctx, sb, func(int, string) {}); err != nil {
			t.Fatal(err)
		}
		return sb, nil
	}
	// 400 cycles with 6 sandboxes alive at any time (room for 8), one
	// heartbeat every 50 cycles: before the fix, the placements of the
	// last two seconds counted whether deleted or not, and this failed
	// within the first ten cycles.
	var alive []core.Sandbox
	for i := 0; i < 400; i++ {
		if i%50 == 25 {
			heartbeat()
		}
		sb, err := create(i)
		if err != nil {
			t.Fatalf("cycle %d with %d alive (room for 8): %v", i, len(alive), err)
		}
		alive = append(alive, sb)
		per := map[string]int{}
		for _, sb := range alive {
			per[sb.Node]++
		}
		if d := per["n1"] - per["n2"]; d > 1 || d < -1 {
			t.Fatalf("cycle %d: live sandboxes %v, not spread by free memory", i, per)
		}
		if len(alive) > 6 {
			if err := r.StopSandbox(ctx, alive[0].ID); err != nil {
				t.Fatal(err)
			}
			alive = alive[1:]
		}
	}
	// A heartbeat that shows the starts must not count them twice: the
	// fleet takes exactly two more, then is full, and says why.
	heartbeat()
	for i := 0; i < 2; i++ {
		if _, err := create(1000 + i); err != nil {
			t.Fatalf("room for %d more: %v", 2-i, err)
		}
	}
	_, err = create(2000)
	if !errors.Is(err, core.ErrExhausted) || !strings.Contains(err.Error(), "n1 has 0.00 GiB of 4.00 GiB free") {
		t.Fatalf("a full fleet: %v", err)
	}
	// A placement never stored gives its room back.
	heartbeat()
	if err := r.StopSandbox(ctx, alive[0].ID); err != nil {
		t.Fatal(err)
	}
	sb := core.Sandbox{ID: "sbx-00000000000beef0", Template: "minimal", TemplateRef: "minimal", Limits: core.Limits{MemoryBytes: sbMem}}
	node, err := r.Place(ctx, sb)
	if err != nil {
		t.Fatalf("a stopped sandbox's room: %v", err)
	}
	r.ReleasePlacement(node, sb.ID)
	sb.ID = "sbx-00000000000beef1"
	if _, err := r.Place(ctx, sb); err != nil {
		t.Fatalf("a released placement's room: %v", err)
	}
}

// The CI failure of stop 34: a sandbox placed through one replica and
// deleted through another is freed in the second replica's view only; the
// first learns of it from the node's next heartbeat. A create through the
// first replica that finds the fleet full waits for that heartbeat instead
// of answering a false 429, and a really full fleet is still refused.
func TestPlacementWaitsForCrossReplicaDeletes(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := newCountingBackend(1000)
	srv := httptest.NewServer(NewHandler(b, NewVerifier(secret, "n1", nil), t.Logf))
	defer srv.Close()
	heartbeat := func() {
		if _, err := st.PutNode(ctx, b.record("n1", srv.URL, 2<<30)); err != nil {
			t.Error(err)
		}
	}
	heartbeat()
	replica := func(wait time.Duration) *Remote {
		r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true},
			Timeout: time.Minute, RoomWait: wait})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, other := replica(5*time.Second), replica(0)
	var ids []string
	create := func(r *Remote, i int) error {
		sb := core.Sandbox{ID: fmt.Sprintf("sbx-%016x", i), ProjectID: "p", Template: "minimal", TemplateRef: "minimal",
			State: core.SandboxCreating, Limits: core.Limits{MemoryBytes: 1 << 30}}
		node, err := r.Place(ctx, sb)
		if err != nil {
			return err
		}
		sb.Node = node
		if _, _, err := st.CreateSandboxOp(ctx, sb, core.Operation{ID: "op-" + sb.ID, ProjectID: "p", Kind: "sandbox.create", Target: sb.ID, State: core.OpSucceeded}, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := r.StartSandbox(ctx, sb, func(int, string) {}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
		return nil
	}
	for i := range 2 {
		if err := create(a, i); err != nil {
			t.Fatal(err)
		}
	}
	heartbeat() // both sandboxes in the registry: n1 is full
	if err := other.StopSandbox(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	// The node beats 300 ms later (a node does so soon after it frees
	// room); the create through a must take that room.
	go func() { time.Sleep(300 * time.Millisecond); heartbeat() }()
	t0 := time.Now()
	if err := create(a, 2); err != nil {
		t.Fatalf("create after a delete through another replica: %v", err)
	}
	if d := time.Since(t0); d < 250*time.Millisecond {
		t.Fatalf("placed after %v, before the heartbeat that shows the room", d)
	}
	// Full for real: refused after the wait, saying why.
	a.o.RoomWait = 300 * time.Millisecond
	t0 = time.Now()
	err = create(a, 3)
	if !errors.Is(err, core.ErrExhausted) || time.Since(t0) < 300*time.Millisecond {
		t.Fatalf("a full fleet: %v after %v", err, time.Since(t0))
	}
}
