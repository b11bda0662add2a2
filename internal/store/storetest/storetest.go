// Package storetest is the conformance suite every core.Store must pass.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// Run runs the suite; newStore returns a fresh, empty store.
func Run(t *testing.T, newStore func(t *testing.T) core.Store) {
	t.Run("Meta", func(t *testing.T) { testMeta(t, newStore(t)) })
	t.Run("APIKeys", func(t *testing.T) { testKeys(t, newStore(t)) })
	t.Run("SandboxOps", func(t *testing.T) { testSandboxOps(t, newStore(t)) })
	t.Run("UpdateSandboxSerializes", func(t *testing.T) { testUpdateSandboxSerializes(t, newStore(t)) })
	t.Run("Idempotency", func(t *testing.T) { testIdempotency(t, newStore(t)) })
	t.Run("IdempotencyFingerprint", func(t *testing.T) { testFingerprint(t, newStore(t)) })
	t.Run("ListFilters", func(t *testing.T) { testList(t, newStore(t)) })
	t.Run("Events", func(t *testing.T) { testEvents(t, newStore(t)) })
	t.Run("OperationEvents", func(t *testing.T) { testOperationEvents(t, newStore(t)) })
	t.Run("RecordEvents", func(t *testing.T) { testRecordEvents(t, newStore(t)) })
	t.Run("Snapshots", func(t *testing.T) { testSnapshots(t, newStore(t)) })
	t.Run("Nodes", func(t *testing.T) { testNodes(t, newStore(t)) })
	t.Run("NodeDrains", func(t *testing.T) { testNodeDrains(t, newStore(t)) })
	t.Run("Credentials", func(t *testing.T) { testCredentials(t, newStore(t)) })
	t.Run("Retention", func(t *testing.T) { testRetention(t, newStore(t)) })
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func testMeta(t *testing.T, s core.Store) {
	ctx := context.Background()
	if _, err := s.GetMeta(ctx, "k"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("GetMeta missing: %v", err)
	}
	v, err := s.PutMetaIfAbsent(ctx, "k", []byte("one"))
	if err != nil || string(v) != "one" {
		t.Fatalf("first put: %q %v", v, err)
	}
	v, err = s.PutMetaIfAbsent(ctx, "k", []byte("two"))
	if err != nil || string(v) != "one" {
		t.Fatalf("second put must keep the first value: %q %v", v, err)
	}
}

func testKeys(t *testing.T, s core.Store) {
	ctx := context.Background()
	k := core.APIKey{ID: "k1", ProjectID: "p1", Name: "n", Hash: []byte{1, 2, 3}, CreatedAt: t0}
	if err := s.CreateAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetAPIKey(ctx, "k1")
	if err != nil || got.ProjectID != "p1" || string(got.Hash) != string(k.Hash) || !got.CreatedAt.Equal(t0) {
		t.Fatalf("GetAPIKey = %+v, %v", got, err)
	}
	if err := s.RevokeAPIKey(ctx, "p2", "k1", t0); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("revoke from another project: %v", err)
	}
	if err := s.RevokeAPIKey(ctx, "p1", "k1", t0); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetAPIKey(ctx, "k1")
	if got.RevokedAt == nil {
		t.Fatal("key not revoked")
	}
	list, err := s.ListAPIKeys(ctx, "p1")
	if err != nil || len(list) != 1 || list[0].Admin {
		t.Fatalf("list: %v %v", list, err)
	}
	// An operator key keeps its admin flag.
	if err := s.CreateAPIKey(ctx, core.APIKey{ID: "k2", ProjectID: "ops", Hash: []byte{4}, CreatedAt: t0, Admin: true}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetAPIKey(ctx, "k2"); err != nil || !got.Admin {
		t.Fatalf("admin key = %+v, %v", got, err)
	}
	if list, err := s.ListAPIKeys(ctx, "ops"); err != nil || len(list) != 1 || !list[0].Admin {
		t.Fatalf("list admin: %+v %v", list, err)
	}
}

func sandbox(id, project string) core.Sandbox {
	return core.Sandbox{ID: id, ProjectID: project, Template: "minimal", State: core.SandboxCreating, CreatedAt: t0, UpdatedAt: t0}
}

func op(id, project, target string) core.Operation {
	return core.Operation{ID: id, ProjectID: project, Kind: "sandbox.create", Target: target, State: core.OpPending, CreatedAt: t0, UpdatedAt: t0}
}

func testSandboxOps(t *testing.T, s core.Store) {
	ctx := context.Background()
	if _, created, err := s.CreateSandboxOp(ctx, sandbox("sbx-1", "p1"), op("op-1", "p1", "sbx-1"), ""); err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	if _, err := s.GetSandbox(ctx, "p2", "sbx-1"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("another project must not see the sandbox: %v", err)
	}
	exp := t0.Add(time.Minute)
	sb, err := s.UpdateSandbox(ctx, "sbx-1", func(sb *core.Sandbox) error {
		sb.State, sb.ExpiresAt = core.SandboxRunning, &exp
		return nil
	})
	if err != nil || sb.State != core.SandboxRunning {
		t.Fatalf("update: %+v %v", sb, err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateSandbox(ctx, "sbx-1", func(sb *core.Sandbox) error { sb.State = core.SandboxFailed; return boom }); !errors.Is(err, boom) {
		t.Fatalf("update fn error not returned: %v", err)
	}
	if got, _ := s.GetSandbox(ctx, "", "sbx-1"); got.State != core.SandboxRunning {
		t.Fatalf("a failed update must not be stored: %s", got.State)
	}
	if ex, err := s.ExpiredSandboxes(ctx, t0); err != nil || len(ex) != 0 {
		t.Fatalf("expired before expiry: %v %v", ex, err)
	}
	if ex, err := s.ExpiredSandboxes(ctx, exp.Add(time.Second)); err != nil || len(ex) != 1 {
		t.Fatalf("expired after expiry: %v %v", ex, err)
	}
	o, err := s.GetOperation(ctx, "p1", "op-1")
	if err != nil || o.Target != "sbx-1" {
		t.Fatalf("get op: %+v %v", o, err)
	}
	if _, err := s.GetOperation(ctx, "p2", "op-1"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("another project must not see the operation: %v", err)
	}
	un, err := s.UnfinishedOperations(ctx)
	if err != nil || len(un) != 1 {
		t.Fatalf("unfinished: %v %v", un, err)
	}
	o.State = core.OpSucceeded
	if err := s.UpdateOperation(ctx, o); err != nil {
		t.Fatal(err)
	}
	if un, _ := s.UnfinishedOperations(ctx); len(un) != 0 {
		t.Fatalf("finished op still unfinished: %v", un)
	}
}

// testUpdateSandboxSerializes: concurrent read-modify-writes of one
// sandbox lose nothing (each holds the row while its fn runs), and a
// missing sandbox or a failing fn leaves the store usable.
func testUpdateSandboxSerializes(t *testing.T, s core.Store) {
	ctx := context.Background()
	if _, _, err := s.CreateSandboxOp(ctx, sandbox("sbx-n", "p1"), op("op-n", "p1", "sbx-n"), ""); err != nil {
		t.Fatal(err)
	}
	const workers, each = 6, 5
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				_, err := s.UpdateSandbox(ctx, "sbx-n", func(sb *core.Sandbox) error {
					n := 0
					fmt.Sscan(sb.Metadata["n"], &n)
					time.Sleep(time.Millisecond) // widen the window a lost update needs
					sb.Metadata = map[string]string{"n": fmt.Sprint(n + 1)}
					return nil
				})
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("update: %v", err)
		}
	}
	if got, _ := s.GetSandbox(ctx, "", "sbx-n"); got.Metadata["n"] != fmt.Sprint(workers*each) {
		t.Fatalf("after %d concurrent increments: n=%q", workers*each, got.Metadata["n"])
	}
	for i := 0; i < 3; i++ { // more than once: the connection must come back clean
		if _, err := s.UpdateSandbox(ctx, "sbx-none", func(*core.Sandbox) error { return nil }); !errors.Is(err, core.ErrNotFound) {
			t.Fatalf("missing sandbox: %v", err)
		}
		if _, err := s.UpdateSandbox(ctx, "sbx-n", func(*core.Sandbox) error { return core.ErrConflict }); !errors.Is(err, core.ErrConflict) {
			t.Fatalf("failing fn: %v", err)
		}
	}
	if got, err := s.UpdateSandbox(ctx, "sbx-n", func(sb *core.Sandbox) error { sb.State = core.SandboxRunning; return nil }); err != nil || got.State != core.SandboxRunning {
		t.Fatalf("update after failures: %+v %v", got, err)
	}
}

func testIdempotency(t *testing.T, s core.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	created := make([]bool, 8)
	for i := range created {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("sbx-%d", i)
			_, c, err := s.CreateSandboxOp(ctx, sandbox(id, "p1"), op(fmt.Sprintf("op-%d", i), "p1", id), "key-1")
			if err != nil {
				t.Errorf("create %d: %v", i, err)
			}
			created[i] = c
		}(i)
	}
	wg.Wait()
	n := 0
	for _, c := range created {
		if c {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d creates with one idempotency key succeeded, want 1", n)
	}
	list, _ := s.ListSandboxes(ctx, core.SandboxFilter{ProjectID: "p1"})
	if len(list) != 1 {
		t.Fatalf("%d sandboxes stored, want 1", len(list))
	}
	// The same key in another project is independent.
	if _, c, err := s.CreateSandboxOp(ctx, sandbox("sbx-x", "p2"), op("op-x", "p2", "sbx-x"), "key-1"); err != nil || !c {
		t.Fatalf("other project: %v %v", c, err)
	}
}

func testList(t *testing.T, s core.Store) {
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		sb := sandbox(fmt.Sprintf("sbx-%d", i), "p1")
		sb.Metadata = map[string]string{"team": []string{"a", "b"}[i%2]}
		if i == 4 {
			sb.State = core.SandboxDeleted
		}
		if _, _, err := s.CreateSandboxOp(ctx, sb, op(fmt.Sprintf("op-%d", i), "p1", sb.ID), ""); err != nil {
			t.Fatal(err)
		}
	}
	all, _ := s.ListSandboxes(ctx, core.SandboxFilter{ProjectID: "p1"})
	if len(all) != 4 {
		t.Fatalf("default list hides deleted: got %d", len(all))
	}
	a, _ := s.ListSandboxes(ctx, core.SandboxFilter{ProjectID: "p1", Metadata: map[string]string{"team": "a"}})
	if len(a) != 2 {
		t.Fatalf("metadata filter: got %d", len(a))
	}
	page1, _ := s.ListSandboxes(ctx, core.SandboxFilter{ProjectID: "p1", Limit: 2})
	page2, _ := s.ListSandboxes(ctx, core.SandboxFilter{ProjectID: "p1", Limit: 2, After: page1[1].ID})
	if len(page1) != 2 || len(page2) != 2 || page2[0].ID <= page1[1].ID {
		t.Fatalf("pagination: %v / %v", page1, page2)
	}
	del, _ := s.ListSandboxes(ctx, core.SandboxFilter{ProjectID: "p1", States: []core.SandboxState{core.SandboxDeleted}})
	if len(del) != 1 {
		t.Fatalf("state filter: got %d", len(del))
	}
	other, _ := s.ListSandboxes(ctx, core.SandboxFilter{ProjectID: "p2"})
	if len(other) != 0 {
		t.Fatalf("another project sees %d sandboxes", len(other))
	}
}

func testEvents(t *testing.T, s core.Store) {
	ctx := context.Background()
	var last int64
	for i := 0; i < 3; i++ {
		e, err := s.AppendEvent(ctx, core.Event{ProjectID: "p1", Type: "x", Data: []byte(`{}`), CreatedAt: t0})
		if err != nil || e.Seq <= last {
			t.Fatalf("append: seq %d after %d: %v", e.Seq, last, err)
		}
		last = e.Seq
	}
	s.AppendEvent(ctx, core.Event{ProjectID: "p2", Type: "x", Data: []byte(`{}`), CreatedAt: t0})
	if seq, err := s.LatestEventSeq(ctx, "p1"); err != nil || seq != last {
		t.Fatalf("latest p1 = %d, %v; want %d", seq, err, last)
	}
	if seq, err := s.LatestEventSeq(ctx, "nobody"); err != nil || seq != 0 {
		t.Fatalf("latest of a project without events = %d, %v", seq, err)
	}
	evs, err := s.EventsAfter(ctx, "p1", 0, 10)
	if err != nil || len(evs) != 3 {
		t.Fatalf("events: %d %v", len(evs), err)
	}
	evs, _ = s.EventsAfter(ctx, "p1", evs[0].Seq, 10)
	if len(evs) != 2 {
		t.Fatalf("events after first: %d", len(evs))
	}
}

// testOperationEvents: an operation's step and its event are saved
// together (one statement where the store implements
// core.OperationEvents), and nothing is appended for a missing operation.
func testOperationEvents(t *testing.T, s core.Store) {
	ctx := context.Background()
	o := op("op-oe", "p1", "sbx-oe")
	if _, _, err := s.CreateOperation(ctx, o, ""); err != nil {
		t.Fatalf("create operation: %v", err)
	}
	before, _ := s.LatestEventSeq(ctx, "p1")
	o.State, o.Progress, o.Message, o.UpdatedAt = core.OpSucceeded, 100, "done", t0.Add(time.Second)
	ev, err := core.UpdateOperationEvent(ctx, s, o, core.Event{ProjectID: "p1", Type: "operation.updated", OperationID: o.ID, Data: []byte(`{"state":"succeeded"}`), CreatedAt: t0})
	if err != nil || ev.Seq <= before {
		t.Fatalf("update with event: seq %d after %d: %v", ev.Seq, before, err)
	}
	got, err := s.GetOperation(ctx, "p1", o.ID)
	if err != nil || got.State != core.OpSucceeded || got.Message != "done" {
		t.Fatalf("operation after the update: %+v %v", got, err)
	}
	evs, err := s.EventsAfter(ctx, "p1", before, 10)
	if err != nil || len(evs) != 1 || evs[0].Seq != ev.Seq || evs[0].OperationID != o.ID || string(evs[0].Data) != `{"state":"succeeded"}` {
		t.Fatalf("events after the update: %+v %v", evs, err)
	}
	missing := op("op-none", "p1", "sbx-oe")
	if _, err := core.UpdateOperationEvent(ctx, s, missing, core.Event{ProjectID: "p1", Type: "operation.updated", Data: []byte(`{}`), CreatedAt: t0}); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("missing operation: %v, want not found", err)
	}
	if seq, _ := s.LatestEventSeq(ctx, "p1"); seq != ev.Seq {
		t.Fatalf("a missing operation's update appended an event: latest %d, want %d", seq, ev.Seq)
	}
}

// testRecordEvents: a record and its events are written together (one
// transaction where the store implements core.RecordEvents), in the
// order given, and nothing is appended when the record is not written
// (an idempotent replay, an update whose fn fails, a missing sandbox).
func testRecordEvents(t *testing.T, s core.Store) {
	ctx := context.Background()
	ev := func(typ, data string) core.Event {
		return core.Event{ProjectID: "p1", Type: typ, Data: []byte(data), CreatedAt: t0}
	}
	latest := func() int64 {
		t.Helper()
		seq, err := s.LatestEventSeq(ctx, "p1")
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	types := func(after int64) []string {
		t.Helper()
		evs, err := s.EventsAfter(ctx, "p1", after, 10)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range evs {
			out = append(out, e.Type+" "+string(e.Data))
		}
		return out
	}
	before := latest()
	o := op("op-re", "p1", "sbx-re")
	if _, created, err := core.CreateSandboxOpEvents(ctx, s, sandbox("sbx-re", "p1"), o, "key-re",
		[]core.Event{ev("sandbox.state", `{"state":"creating"}`), ev("operation.updated", `{"state":"pending"}`)}); err != nil || !created {
		t.Fatalf("create sandbox with events: %v %v", created, err)
	}
	if got, want := types(before), []string{`sandbox.state {"state":"creating"}`, `operation.updated {"state":"pending"}`}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events of the create: %q, want %q", got, want)
	}
	if _, err := s.GetSandbox(ctx, "p1", "sbx-re"); err != nil {
		t.Fatalf("sandbox after the create: %v", err)
	}
	before = latest()
	if _, created, err := core.CreateSandboxOpEvents(ctx, s, sandbox("sbx-re2", "p1"), op("op-re2", "p1", "sbx-re2"), "key-re",
		[]core.Event{ev("sandbox.state", `{}`)}); err != nil || created {
		t.Fatalf("replayed create: created %v, %v", created, err)
	}
	if latest() != before {
		t.Fatal("a replayed create appended events")
	}

	upd, err := core.UpdateSandboxEvent(ctx, s, "sbx-re", func(sb *core.Sandbox) error {
		sb.State = core.SandboxRunning
		return nil
	}, func(sb core.Sandbox) (core.Event, error) {
		return ev("sandbox.state", `{"state":"`+string(sb.State)+`"}`), nil
	})
	if err != nil || upd.State != core.SandboxRunning {
		t.Fatalf("update with event: %+v %v", upd, err)
	}
	if got := types(before); len(got) != 1 || got[0] != `sandbox.state {"state":"running"}` {
		t.Fatalf("events of the update: %q", got)
	}
	before = latest()
	refuse := errors.New("refused")
	if _, err := core.UpdateSandboxEvent(ctx, s, "sbx-re", func(sb *core.Sandbox) error {
		sb.State = core.SandboxFailed
		return refuse
	}, func(core.Sandbox) (core.Event, error) { return ev("sandbox.state", `{}`), nil }); !errors.Is(err, refuse) {
		t.Fatalf("update whose fn fails: %v", err)
	}
	if _, err := core.UpdateSandboxEvent(ctx, s, "sbx-none", func(*core.Sandbox) error { return nil },
		func(core.Sandbox) (core.Event, error) { return ev("sandbox.state", `{}`), nil }); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("update of a missing sandbox: %v, want not found", err)
	}
	if got, _ := s.GetSandbox(ctx, "p1", "sbx-re"); got.State != core.SandboxRunning || latest() != before {
		t.Fatalf("failed updates changed the record (%s) or appended events (%d after %d)", got.State, latest(), before)
	}

	o3 := op("op-re3", "p1", "sbx-re")
	if _, created, err := core.CreateOperationEvent(ctx, s, o3, "key-re3", ev("operation.updated", `{"state":"pending"}`)); err != nil || !created {
		t.Fatalf("create operation with event: %v %v", created, err)
	}
	if got := types(before); len(got) != 1 || got[0] != `operation.updated {"state":"pending"}` {
		t.Fatalf("events of the operation's create: %q", got)
	}
	before = latest()
	if _, created, err := core.CreateOperationEvent(ctx, s, op("op-re4", "p1", "sbx-re"), "key-re3", ev("operation.updated", `{}`)); err != nil || created {
		t.Fatalf("replayed operation: created %v, %v", created, err)
	}
	if latest() != before {
		t.Fatal("a replayed operation appended an event")
	}
}

func testSnapshots(t *testing.T, s core.Store) {
	ctx := context.Background()
	snap := func(id, project, sandbox, parent string, at time.Duration) core.Snapshot {
		return core.Snapshot{ID: id, ProjectID: project, SandboxID: sandbox, ParentID: parent, Template: "minimal",
			State: core.SnapshotCreating, Kind: core.SnapshotKindFilesystem, CreatedAt: t0.Add(at), UpdatedAt: t0.Add(at)}
	}
	if _, c, err := s.CreateSnapshotOp(ctx, snap("snap-1", "p1", "sbx-1", "", 0), op("op-s1", "p1", "snap-1"), "k"); err != nil || !c {
		t.Fatalf("create: %v %v", c, err)
	}
	// The same idempotency key returns the first operation and stores nothing.
	if o, c, err := s.CreateSnapshotOp(ctx, snap("snap-x", "p1", "sbx-1", "", 0), op("op-sx", "p1", "snap-x"), "k"); err != nil || c || o.ID != "op-s1" {
		t.Fatalf("idempotent create: %v %v %v", o.ID, c, err)
	}
	if _, err := s.GetSnapshot(ctx, "", "snap-x"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("replayed create stored a snapshot: %v", err)
	}
	if _, err := s.GetSnapshot(ctx, "p2", "snap-1"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("another project must not see the snapshot: %v", err)
	}
	got, err := s.UpdateSnapshot(ctx, "snap-1", func(sn *core.Snapshot) error {
		sn.State, sn.Manifest = core.SnapshotReady, "m1"
		return nil
	})
	if err != nil || got.State != core.SnapshotReady {
		t.Fatalf("update: %+v %v", got, err)
	}
	// Children: snap-2 (ready), snap-3 (creating) of sbx-1; snap-4 in p2.
	for i, sn := range []core.Snapshot{snap("snap-2", "p1", "sbx-1", "snap-1", 2), snap("snap-3", "p1", "sbx-1", "", 3), snap("snap-4", "p2", "sbx-9", "", 1)} {
		if _, _, err := s.CreateSnapshotOp(ctx, sn, op(fmt.Sprintf("op-c%d", i), sn.ProjectID, sn.ID), ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.UpdateSnapshot(ctx, "snap-3", func(sn *core.Snapshot) error { sn.ParentID = "snap-2"; return nil }); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListSnapshots(ctx, core.SnapshotFilter{ProjectID: "p1"})
	if err != nil || len(list) != 3 || list[0].ID != "snap-1" || list[2].ID != "snap-3" {
		t.Fatalf("list oldest first: %v %v", list, err)
	}
	page, _ := s.ListSnapshots(ctx, core.SnapshotFilter{ProjectID: "p1", After: "snap-1", Limit: 1})
	if len(page) != 1 || page[0].ID != "snap-2" {
		t.Fatalf("page after snap-1: %v", page)
	}
	ready, _ := s.ListSnapshots(ctx, core.SnapshotFilter{SandboxID: "sbx-1", States: []core.SnapshotState{core.SnapshotReady}})
	if len(ready) != 1 || ready[0].ID != "snap-1" {
		t.Fatalf("state filter: %v", ready)
	}
	if all, _ := s.ListSnapshots(ctx, core.SnapshotFilter{}); len(all) != 4 {
		t.Fatalf("all projects: %d", len(all))
	}
	// A snapshot with a live child cannot go; a failed child does not count.
	if err := s.DeleteSnapshot(ctx, "p1", "snap-1"); !errors.Is(err, core.ErrConflict) {
		t.Fatalf("delete with a child: %v", err)
	}
	if err := s.DeleteSnapshot(ctx, "p1", "snap-2"); !errors.Is(err, core.ErrConflict) {
		t.Fatalf("delete with a creating child: %v", err)
	}
	s.UpdateSnapshot(ctx, "snap-3", func(sn *core.Snapshot) error { sn.State = core.SnapshotFailed; return nil })
	// A retained child (deleted by its owner, its data kept for its own
	// children) still needs its parent.
	s.UpdateSnapshot(ctx, "snap-2", func(sn *core.Snapshot) error { sn.State = core.SnapshotRetained; return nil })
	if err := s.DeleteSnapshot(ctx, "p1", "snap-1"); !errors.Is(err, core.ErrConflict) {
		t.Fatalf("delete with a retained child: %v", err)
	}
	if err := s.DeleteSnapshot(ctx, "p2", "snap-2"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("delete from another project: %v", err)
	}
	for _, id := range []string{"snap-2", "snap-1"} {
		if err := s.DeleteSnapshot(ctx, "p1", id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	if _, err := s.GetSnapshot(ctx, "", "snap-1"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("deleted snapshot still there: %v", err)
	}
	if err := s.DeleteSnapshot(ctx, "p1", "snap-1"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}
