package sqlite

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// openTest opens a store in a fresh file, closed at the test's end.
func openTest(t *testing.T) *Store {
	t.Helper()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestGroupCommit: concurrent writes share transactions, and each caller
// gets its own outcome: a failing write (its fn's error, a missing record,
// a duplicate id) leaves nothing behind, while the writes batched with it
// are all stored, each with its event, and none is lost or applied twice.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	sb := core.Sandbox{ID: "sbx-gc", ProjectID: "p1", Template: "minimal", State: core.SandboxCreating, CreatedAt: t0, UpdatedAt: t0}
	op := core.Operation{ID: "op-gc", ProjectID: "p1", Kind: "sandbox.create", Target: sb.ID, State: core.OpPending, CreatedAt: t0, UpdatedAt: t0}
	if _, _, err := s.CreateSandboxOp(ctx, sb, op, ""); err != nil {
		t.Fatal(err)
	}
	before, err := s.LatestEventSeq(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	const n = 48
	refuse := errors.New("refused")
	ev := func(kind string) func(core.Sandbox) (core.Event, error) {
		return func(core.Sandbox) (core.Event, error) {
			return core.Event{ProjectID: "p1", Type: kind, Data: []byte(`{}`), CreatedAt: t0}, nil
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i % 4 {
			case 0, 1: // counts one up
				_, errs[i] = s.UpdateSandboxEvent(ctx, sb.ID, func(cur *core.Sandbox) error {
					c, _ := strconv.Atoi(cur.Metadata["count"])
					if cur.Metadata == nil {
						cur.Metadata = map[string]string{}
					}
					cur.Metadata["count"] = strconv.Itoa(c + 1)
					return nil
				}, ev("counted"))
			case 2: // changes the record, then fails
				_, errs[i] = s.UpdateSandboxEvent(ctx, sb.ID, func(cur *core.Sandbox) error {
					cur.Metadata = map[string]string{"count": "-1000"}
					return refuse
				}, ev("refused"))
			case 3: // inserts, then fails on a duplicate id
				dup := sb
				dup.ID = fmt.Sprintf("sbx-new-%d", i)
				dupOp := op // the id of an operation that exists
				dupOp.Target = dup.ID
				_, _, errs[i] = s.CreateSandboxOpEvents(ctx, dup, dupOp, "", []core.Event{{ProjectID: "p1", Type: "duplicate", Data: []byte(`{}`), CreatedAt: t0}})
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		switch i % 4 {
		case 0, 1:
			if err != nil {
				t.Errorf("write %d: %v", i, err)
			}
		case 2:
			if !errors.Is(err, refuse) {
				t.Errorf("write %d: %v, want its own error", i, err)
			}
		case 3:
			if err == nil {
				t.Errorf("write %d: a duplicate operation id was stored", i)
			}
		}
	}
	got, err := s.GetSandbox(ctx, "p1", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(n / 2); got.Metadata["count"] != want {
		t.Errorf("count %q, want %s", got.Metadata["count"], want)
	}
	evs, err := s.EventsAfter(ctx, "p1", before, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != n/2 {
		t.Errorf("%d events, want %d", len(evs), n/2)
	}
	for _, e := range evs {
		if e.Type != "counted" {
			t.Errorf("event %q of a failed write was stored", e.Type)
		}
	}
	for i := 3; i < n; i += 4 {
		if _, err := s.GetSandbox(ctx, "p1", fmt.Sprintf("sbx-new-%d", i)); !errors.Is(err, core.ErrNotFound) {
			t.Errorf("sandbox of failed write %d: %v, want not found", i, err)
		}
	}
}

// A write whose context ended before its batch ran fails with that error
// and stores nothing.
func TestGroupCommitCancelled(t *testing.T) {
	s := openTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.AppendEvent(ctx, core.Event{ProjectID: "p1", Type: "x", Data: []byte(`{}`)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("append under a cancelled context: %v", err)
	}
	if seq, err := s.LatestEventSeq(context.Background(), "p1"); err != nil || seq != 0 {
		t.Fatalf("latest seq %d, %v; want 0", seq, err)
	}
}

// A write function that panics panics in its caller, as without batching,
// and leaves the store working: the next writes are stored.
func TestGroupCommitPanic(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	sb := core.Sandbox{ID: "sbx-p", ProjectID: "p1", Template: "minimal", State: core.SandboxCreating}
	op := core.Operation{ID: "op-p", ProjectID: "p1", Kind: "sandbox.create", Target: sb.ID, State: core.OpPending}
	if _, _, err := s.CreateSandboxOp(ctx, sb, op, ""); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want the function's panic", v)
			}
		}()
		s.UpdateSandbox(ctx, sb.ID, func(*core.Sandbox) error { panic("boom") })
	}()
	done := make(chan error, 1)
	go func() {
		_, err := s.UpdateSandbox(ctx, sb.ID, func(cur *core.Sandbox) error {
			cur.State = core.SandboxRunning
			return nil
		})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write after a panicking one did not return")
	}
	if got, err := s.GetSandbox(ctx, "p1", sb.ID); err != nil || got.State != core.SandboxRunning {
		t.Fatalf("sandbox after the writes: %s, %v", got.State, err)
	}
}
