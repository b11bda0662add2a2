package storetest

import (
	"context"
	"testing"

	"github.com/space-sandbox/space/internal/core"
)

// testFingerprint: a store keeps each operation's request fingerprint
// (core.Operation.Fingerprint) through every write and read, and hands it
// back with the operation an idempotency key already names, so the core can
// tell a retry (same fingerprint: replay) from a reused key (another one).
func testFingerprint(t *testing.T, s core.Store) {
	ctx := context.Background()
	withFP := func(o core.Operation, fp string) core.Operation { o.Fingerprint = fp; return o }
	creates := []struct {
		name   string
		create func(o core.Operation, n string) (core.Operation, bool, error)
	}{
		{"CreateOperation", func(o core.Operation, _ string) (core.Operation, bool, error) {
			return s.CreateOperation(ctx, o, "key-op")
		}},
		{"CreateSandboxOp", func(o core.Operation, n string) (core.Operation, bool, error) {
			return s.CreateSandboxOp(ctx, sandbox("sbx-fp"+n, "p1"), o, "key-sbx")
		}},
		{"CreateSnapshotOp", func(o core.Operation, n string) (core.Operation, bool, error) {
			return s.CreateSnapshotOp(ctx, core.Snapshot{ID: "snap-fp" + n, ProjectID: "p1", SandboxID: "sbx-1", Template: "minimal",
				State: core.SnapshotCreating, Kind: core.SnapshotKindFilesystem, CreatedAt: t0, UpdatedAt: t0}, o, "key-snap")
		}},
	}
	for _, c := range creates {
		first := withFP(op("op-fp1-"+c.name, "p1", "t"), "fp-first")
		if got, created, err := c.create(first, "1"); err != nil || !created || got.Fingerprint != "fp-first" {
			t.Fatalf("%s: first create = %+v %v %v", c.name, got, created, err)
		}
		// The key is taken: nothing is stored, and the first operation comes
		// back with its own fingerprint, whatever the new one says.
		got, created, err := c.create(withFP(op("op-fp2-"+c.name, "p1", "t"), "fp-other"), "2")
		if err != nil || created || got.ID != first.ID || got.Fingerprint != "fp-first" {
			t.Fatalf("%s: replay = %+v %v %v; want %s with fingerprint fp-first", c.name, got, created, err, first.ID)
		}
		if got, err := s.GetOperation(ctx, "p1", first.ID); err != nil || got.Fingerprint != "fp-first" {
			t.Fatalf("%s: get = %+v %v", c.name, got, err)
		}
	}
	// Updates (the engine's progress and outcome) and recovery keep it.
	o := withFP(op("op-fp-upd", "p1", "t"), "fp-upd")
	if _, _, err := s.CreateOperation(ctx, o, ""); err != nil {
		t.Fatal(err)
	}
	o.State, o.Progress = core.OpRunning, 50
	if err := s.UpdateOperation(ctx, o); err != nil {
		t.Fatal(err)
	}
	un, err := s.UnfinishedOperations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, u := range un {
		if u.ID == o.ID {
			found = u.Fingerprint == "fp-upd" && u.Progress == 50
		}
	}
	if !found {
		t.Fatalf("unfinished operations lost the fingerprint or the update: %+v", un)
	}
	o.State = core.OpSucceeded
	if err := s.UpdateOperation(ctx, o); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetOperation(ctx, "p1", o.ID); err != nil || got.Fingerprint != "fp-upd" || got.State != core.OpSucceeded {
		t.Fatalf("after update: %+v %v", got, err)
	}
}
