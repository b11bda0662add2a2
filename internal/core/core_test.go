package core_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

func newEngine(t *testing.T) (*core.Engine, *core.Broker, core.Store) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	b := core.NewBroker(st, time.Now)
	e := core.NewEngine(context.Background(), st, b, time.Now, t.Logf)
	t.Cleanup(func() { e.Shutdown(context.Background()); st.Close() })
	return e, b, st
}

func TestEngineLifecycleAndWait(t *testing.T) {
	e, b, st := newEngine(t)
	ctx := context.Background()
	release := make(chan struct{})
	op := e.NewOperation("p", "sandbox.create", "sbx-1")
	op, err := e.Submit(ctx, op, "", func(ctx context.Context, progress core.Progress) (any, error) {
		progress(40, "half way")
		<-release
		return map[string]int{"answer": 42}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A short long-poll returns the unfinished operation.
	got, err := e.Wait(ctx, "p", op.ID, 50*time.Millisecond)
	if err != nil || got.State.Done() {
		t.Fatalf("wait before done: %+v %v", got, err)
	}
	go func() { time.Sleep(50 * time.Millisecond); close(release) }()
	got, err = e.Wait(ctx, "p", op.ID, 10*time.Second)
	if err != nil || got.State != core.OpSucceeded || got.Progress != 100 || string(got.Result) != `{"answer":42}` {
		t.Fatalf("wait: %+v %v", got, err)
	}
	if _, err := e.Wait(ctx, "other", op.ID, 0); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("another project waits on the operation: %v", err)
	}
	evs, _ := b.Since(ctx, "p", 0, 100)
	states := []core.OpState{}
	for _, ev := range evs {
		if ev.OperationID == op.ID {
			var o core.Operation
			if err := jsonUnmarshal(ev.Data, &o); err == nil {
				states = append(states, o.State)
			}
		}
	}
	if len(states) < 3 || states[0] != core.OpPending || states[len(states)-1] != core.OpSucceeded {
		t.Fatalf("published states %v", states)
	}
	_ = st
}

func TestEngineFailureAndPanic(t *testing.T) {
	e, _, _ := newEngine(t)
	ctx := context.Background()
	failing, _ := e.Submit(ctx, e.NewOperation("p", "x", "t"), "", func(context.Context, core.Progress) (any, error) {
		return nil, core.ErrConflict
	})
	panicking, _ := e.Submit(ctx, e.NewOperation("p", "x", "t"), "", func(context.Context, core.Progress) (any, error) {
		panic("boom")
	})
	for _, id := range []string{failing.ID, panicking.ID} {
		got, _ := e.Wait(ctx, "p", id, 5*time.Second)
		if got.State != core.OpFailed || got.Error == nil {
			t.Fatalf("operation %s: %+v", id, got)
		}
	}
	if got, _ := e.Wait(ctx, "p", failing.ID, 0); got.Error.Code != "conflict" {
		t.Fatalf("error code %q", got.Error.Code)
	}
}

func TestEngineIdempotencyAndRecover(t *testing.T) {
	e, _, st := newEngine(t)
	ctx := context.Background()
	var mu sync.Mutex
	runs := 0
	block := make(chan struct{})
	fn := func(context.Context, core.Progress) (any, error) {
		mu.Lock()
		runs++
		mu.Unlock()
		<-block
		return nil, nil
	}
	var once sync.Once
	unblock := func() { once.Do(func() { close(block) }) }
	t.Cleanup(unblock) // runs before the engine's cleanup, so Shutdown cannot hang
	a, _ := e.Submit(ctx, e.NewOperation("p", "x", "t"), "key", fn)
	b, _ := e.Submit(ctx, e.NewOperation("p", "x", "t"), "key", fn)
	if a.ID != b.ID {
		t.Fatalf("same idempotency key gave two operations: %s %s", a.ID, b.ID)
	}
	// Wait until the work runs, so the "crash" below finds it running.
	for i := 0; ; i++ {
		got, _ := st.GetOperation(ctx, "p", a.ID)
		if got.State == core.OpRunning {
			break
		}
		if i > 500 {
			t.Fatalf("operation never ran: %+v", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A crash leaves it running; a new engine's Recover fails it.
	e2 := core.NewEngine(context.Background(), st, core.NewBroker(st, time.Now), time.Now, t.Logf)
	recovered, err := e2.Recover(ctx)
	if err != nil || len(recovered) != 1 {
		t.Fatalf("recover: %v %v", recovered, err)
	}
	got, _ := st.GetOperation(ctx, "p", a.ID)
	if got.State != core.OpFailed || got.Error.Code != "interrupted" {
		t.Fatalf("after recover: %+v", got)
	}
	unblock()
	e.Shutdown(ctx)
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Fatalf("work ran %d times", runs)
	}
}

// countingStore counts the operation reads of a real store.
type countingStore struct {
	core.Store
	gets atomic.Int64
}

func (c *countingStore) GetOperation(ctx context.Context, projectID, id string) (core.Operation, error) {
	c.gets.Add(1)
	return c.Store.GetOperation(ctx, projectID, id)
}

// A long-poll on an operation this engine runs gets its outcome from the
// engine, as stored, without reading the store (on a fleet each read is
// a PostgreSQL query); another project's wait still reads and is refused.
func TestEngineWaitOwnOperationWithoutReads(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: st}
	e := core.NewEngine(context.Background(), cs, core.NewBroker(cs, time.Now), time.Now, t.Logf)
	t.Cleanup(func() { e.Shutdown(context.Background()); st.Close() })
	ctx := context.Background()
	release := make(chan struct{})
	op, err := e.Submit(ctx, e.NewOperation("p", "sandbox.create", "sbx-1"), "", func(ctx context.Context, progress core.Progress) (any, error) {
		progress(40, "half way")
		<-release
		return map[string]int{"answer": 42}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Wait(ctx, "other", op.ID, 10*time.Second); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("another project waits on the operation: %v", err)
	}
	before := cs.gets.Load()
	go func() { time.Sleep(50 * time.Millisecond); close(release) }()
	got, err := e.Wait(ctx, "p", op.ID, 10*time.Second)
	if err != nil || got.State != core.OpSucceeded || got.Progress != 100 || string(got.Result) != `{"answer":42}` {
		t.Fatalf("wait: %+v %v", got, err)
	}
	if n := cs.gets.Load() - before; n != 0 {
		t.Fatalf("the wait read the store %d times", n)
	}
	stored, err := st.GetOperation(ctx, "p", op.ID)
	if err != nil || !stored.UpdatedAt.Equal(got.UpdatedAt) || stored.State != got.State || string(stored.Result) != string(got.Result) || stored.Message != got.Message {
		t.Fatalf("the wait's outcome %+v differs from the stored one %+v (%v)", got, stored, err)
	}
}

// TestEngineDrain: Drain waits for running operations without cancelling
// them (a replica leaving in a rolling restart), and gives up with ctx.
func TestEngineDrain(t *testing.T) {
	e, _, st := newEngine(t)
	ctx := context.Background()
	release := make(chan struct{})
	op, err := e.Submit(ctx, e.NewOperation("p", "sandbox.create", "sbx-1"), "", func(ctx context.Context, progress core.Progress) (any, error) {
		select {
		case <-release:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if n := e.Drain(short); n != 1 {
		t.Fatalf("Drain past its deadline: %d running, want 1", n)
	}
	close(release)
	if n := e.Drain(ctx); n != 0 {
		t.Fatalf("Drain: %d running, want 0", n)
	}
	got, err := st.GetOperation(ctx, "p", op.ID)
	if err != nil || got.State != core.OpSucceeded {
		t.Fatalf("the drained operation: %+v %v", got, err)
	}
}
