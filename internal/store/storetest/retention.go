package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// testRetention: PruneEnded removes ended sandboxes, finished operations
// and events older than the cutoff, in batches of at most limit per kind,
// and nothing a live object still needs: live sandboxes, unfinished
// operations, operations of live sandboxes, sandboxes a snapshot or an
// unfinished operation names, snapshots, newer records.
func testRetention(t *testing.T, s core.Store) {
	ctx := context.Background()
	cutoff := t0.Add(2 * time.Hour)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	// mk stores a sandbox with its create operation, finished at +1m, and
	// moves the sandbox to state at updated.
	mk := func(id string, state core.SandboxState, updated time.Time) {
		t.Helper()
		o := op("op-"+id, "p1", id)
		if _, _, err := s.CreateSandboxOp(ctx, sandbox(id, "p1"), o, "key-"+id); err != nil {
			t.Fatal(err)
		}
		o.State, o.UpdatedAt = core.OpSucceeded, at(time.Minute)
		if err := s.UpdateOperation(ctx, o); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateSandbox(ctx, id, func(sb *core.Sandbox) error {
			sb.State, sb.UpdatedAt = state, updated
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	var gone []string // sandbox ids
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("sbx-del%d", i)
		mk(id, core.SandboxDeleted, at(time.Hour))
		if i > 0 {
			gone = append(gone, id)
		}
	}
	mk("sbx-failed", core.SandboxFailed, at(time.Hour))
	mk("sbx-lost", core.SandboxLost, at(time.Hour))
	gone = append(gone, "sbx-failed", "sbx-lost")
	mk("sbx-recent", core.SandboxDeleted, at(3*time.Hour)) // ended after the cutoff
	mk("sbx-live", core.SandboxRunning, at(time.Hour))     // its old create operation stays
	mk("sbx-paused", core.SandboxPaused, at(time.Hour))
	mk("sbx-snapped", core.SandboxDeleted, at(time.Hour)) // a snapshot names it
	// sbx-del0 stays too: an operation on it is still running.
	kept := []string{"sbx-del0", "sbx-recent", "sbx-live", "sbx-paused", "sbx-snapped"}
	snap := core.Snapshot{ID: "snap-r", ProjectID: "p1", SandboxID: "sbx-snapped", Template: "minimal", State: core.SnapshotReady,
		Kind: core.SnapshotKindFilesystem, CreatedAt: t0, UpdatedAt: t0}
	snapOp := op("op-snap", "p1", "snap-r")
	snapOp.Kind, snapOp.State = "snapshot.create", core.OpSucceeded
	if _, _, err := s.CreateSnapshotOp(ctx, snap, snapOp, ""); err != nil {
		t.Fatal(err)
	}
	// A finished template build (target: a name, no sandbox) goes; an
	// operation still running stays however old.
	build := op("op-build", "p1", "tpl")
	build.Kind, build.State, build.UpdatedAt = "template.build", core.OpSucceeded, at(time.Minute)
	running := op("op-running", "p1", "sbx-del0")
	running.Kind, running.State = "sandbox.delete", core.OpRunning
	for _, o := range []core.Operation{build, running} {
		if _, _, err := s.CreateOperation(ctx, o, ""); err != nil {
			t.Fatal(err)
		}
	}
	var lastSeq int64
	for i, d := range []time.Duration{time.Minute, time.Minute, time.Hour, 3 * time.Hour} {
		e, err := s.AppendEvent(ctx, core.Event{ProjectID: "p1", Type: "sandbox.state", Data: []byte(fmt.Sprintf(`{"n":%d}`, i)), CreatedAt: at(d)})
		if err != nil {
			t.Fatal(err)
		}
		lastSeq = e.Seq
	}

	// Batches of 2: at most 2 of each kind per call, until none is left.
	var total core.PruneCounts
	for i := 0; ; i++ {
		c, err := s.PruneEnded(ctx, cutoff, 2)
		if err != nil {
			t.Fatal(err)
		}
		if c.Sandboxes > 2 || c.Operations > 2 || c.Events > 2 {
			t.Fatalf("batch %d removed more than its limit: %+v", i, c)
		}
		total = total.Add(c)
		if c.Total() == 0 {
			break
		}
		if i > 20 {
			t.Fatalf("pruning does not converge: %+v", total)
		}
	}
	// 6 ended sandboxes; the finished operations of every sandbox that
	// ended (11 - 4), the build and the snapshot's; 3 events.
	if want := (core.PruneCounts{Sandboxes: 6, Operations: 11, Events: 3}); total != want {
		t.Fatalf("pruned %+v, want %+v", total, want)
	}
	for _, id := range gone {
		if _, err := s.GetSandbox(ctx, "", id); !errors.Is(err, core.ErrNotFound) {
			t.Errorf("ended sandbox %s not pruned: %v", id, err)
		}
		if _, err := s.GetOperation(ctx, "", "op-"+id); !errors.Is(err, core.ErrNotFound) {
			t.Errorf("operation of ended sandbox %s not pruned: %v", id, err)
		}
	}
	for _, id := range kept {
		if _, err := s.GetSandbox(ctx, "", id); err != nil {
			t.Errorf("sandbox %s pruned: %v", id, err)
		}
	}
	for _, id := range []string{"op-sbx-live", "op-sbx-paused", "op-running"} {
		if _, err := s.GetOperation(ctx, "", id); err != nil {
			t.Errorf("operation %s pruned: %v", id, err)
		}
	}
	for _, id := range []string{"op-build", "op-snap", "op-sbx-recent", "op-sbx-snapped", "op-sbx-del0"} {
		if _, err := s.GetOperation(ctx, "", id); !errors.Is(err, core.ErrNotFound) {
			t.Errorf("old finished operation %s not pruned: %v", id, err)
		}
	}
	if _, err := s.GetSnapshot(ctx, "", "snap-r"); err != nil {
		t.Errorf("snapshots are never pruned: %v", err)
	}
	if list, err := s.ListSandboxes(ctx, core.SandboxFilter{States: []core.SandboxState{core.SandboxDeleted, core.SandboxFailed, core.SandboxLost}}); err != nil || len(list) != 3 {
		t.Errorf("ended sandboxes left: %v %v (want sbx-del0, sbx-recent, sbx-snapped)", list, err)
	}
	evs, err := s.EventsAfter(ctx, "p1", 0, 0)
	if err != nil || len(evs) != 1 || evs[0].Seq != lastSeq {
		t.Fatalf("events left: %+v %v (want only seq %d)", evs, err, lastSeq)
	}
	// Sequence numbers never go back, and a pruned operation's
	// idempotency key is free again.
	if e, err := s.AppendEvent(ctx, core.Event{ProjectID: "p1", Type: "x", Data: []byte(`{}`), CreatedAt: at(4 * time.Hour)}); err != nil || e.Seq <= lastSeq {
		t.Fatalf("event after prune: seq %d (last %d) %v", e.Seq, lastSeq, err)
	}
	if _, created, err := s.CreateOperation(ctx, op("op-again", "p1", "sbx-del1"), "key-sbx-del1"); err != nil || !created {
		t.Fatalf("pruned operation's idempotency key: created %v %v", created, err)
	}
	// Once the snapshot goes, its source sandbox can go too; once the
	// running operation ends, it and its sandbox go; the live sandbox
	// ends and its old operation goes with it.
	if err := s.DeleteSnapshot(ctx, "p1", "snap-r"); err != nil {
		t.Fatal(err)
	}
	running.State, running.UpdatedAt = core.OpSucceeded, at(time.Hour)
	if err := s.UpdateOperation(ctx, running); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateSandbox(ctx, "sbx-live", func(sb *core.Sandbox) error {
		sb.State, sb.UpdatedAt = core.SandboxDeleted, at(time.Hour)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c, err := s.PruneEnded(ctx, cutoff, 100)
	if want := (core.PruneCounts{Sandboxes: 3, Operations: 2}); err != nil || c != want {
		t.Fatalf("second prune: %+v %v, want %+v (sbx-snapped, sbx-del0, sbx-live, op-running, op-sbx-live)", c, err, want)
	}
	if c, err := s.PruneEnded(ctx, cutoff, 100); err != nil || c.Total() != 0 {
		t.Fatalf("third prune: %+v %v", c, err)
	}
}

// CheckMigratedRetention checks a store just upgraded from a schema
// before retention, which held a deleted sandbox sbx-old with its finished
// operation op-old, a running sandbox sbx-run with a running operation
// op-run, and one event: what had ended counts as ended at the upgrade, so
// it is pruned one retention window later, not at once, and the live
// records stay.
func CheckMigratedRetention(t *testing.T, s core.Store) {
	t.Helper()
	ctx := context.Background()
	if c, err := s.PruneEnded(ctx, time.Now().Add(-time.Hour), 100); err != nil || c.Total() != 0 {
		t.Fatalf("prune before the window passed: %+v %v", c, err)
	}
	c, err := s.PruneEnded(ctx, time.Now().Add(time.Hour), 100)
	if want := (core.PruneCounts{Sandboxes: 1, Operations: 1, Events: 1}); err != nil || c != want {
		t.Fatalf("prune after the window: %+v %v, want %+v", c, err, want)
	}
	if _, err := s.GetSandbox(ctx, "", "sbx-run"); err != nil {
		t.Fatalf("live sandbox pruned: %v", err)
	}
	if _, err := s.GetOperation(ctx, "", "op-run"); err != nil {
		t.Fatalf("running operation pruned: %v", err)
	}
}
