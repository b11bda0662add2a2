package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/internal/store/storetest"
)

func open(t *testing.T, dsn string, opts Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), dsn, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) core.Store {
		return open(t, pgtest.FreshDSN(t), Options{})
	})
}

// The same suite with a node set: scoping must not change single-server
// semantics.
func TestConformanceWithNode(t *testing.T) {
	storetest.Run(t, func(t *testing.T) core.Store {
		return open(t, pgtest.FreshDSN(t), Options{Node: "n1"})
	})
}

func TestMigrateIdempotentAndConcurrent(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, err := Open(context.Background(), dsn, Options{})
			if err == nil {
				s.Close()
			}
			errs[i] = err
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
	}
	s := open(t, dsn, Options{})
	if v, err := s.SchemaVersion(context.Background()); err != nil || v != len(migrations()) {
		t.Fatalf("schema version %d, %v; want %d", v, err, len(migrations()))
	}
}

// Two stores on one database, as two replicas: events appended concurrently
// from both are read back by a follower in order and without gaps, and each
// store is woken by the other's events.
func TestEventsAcrossReplicas(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	a, b := open(t, dsn, Options{Node: "a"}), open(t, dsn, Options{Node: "b"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	woken := make(chan string, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.WatchEvents(ctx, func(p string) {
			select {
			case woken <- p:
			default:
			}
		})
	}()
	defer func() { cancel(); <-done }()
	// The first wake ("") says the listener is up.
	select {
	case p := <-woken:
		if p != "" {
			t.Fatalf("first wake %q, want \"\"", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("listener not up")
	}
	if _, err := a.AppendEvent(ctx, core.Event{ProjectID: "p1", Type: "x", Data: []byte(`{}`), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-woken:
		if p != "p1" {
			t.Fatalf("woken for %q", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("replica b not woken by replica a's event")
	}

	// Each write that records events (core.RecordEvents) wakes the other
	// replica for its project too.
	now := time.Now()
	recorders := []struct {
		name  string
		write func() error
	}{
		{"CreateSandboxOpEvents", func() error {
			_, _, err := a.CreateSandboxOpEvents(ctx, core.Sandbox{ID: "sbx-w", ProjectID: "p3", Template: "minimal", State: core.SandboxCreating, CreatedAt: now},
				core.Operation{ID: "op-w1", ProjectID: "p3", Kind: "sandbox.create", Target: "sbx-w", State: core.OpPending, CreatedAt: now}, "",
				[]core.Event{{ProjectID: "p3", Type: "x", Data: []byte(`{}`), CreatedAt: now}})
			return err
		}},
		{"UpdateSandboxEvent", func() error {
			_, err := a.UpdateSandboxEvent(ctx, "sbx-w", func(sb *core.Sandbox) error { sb.State = core.SandboxRunning; return nil },
				func(core.Sandbox) (core.Event, error) {
					return core.Event{ProjectID: "p3", Type: "x", Data: []byte(`{}`), CreatedAt: now}, nil
				})
			return err
		}},
		{"CreateOperationEvent", func() error {
			_, _, err := a.CreateOperationEvent(ctx, core.Operation{ID: "op-w2", ProjectID: "p3", Kind: "sandbox.pause", Target: "sbx-w", State: core.OpPending, CreatedAt: now}, "",
				core.Event{ProjectID: "p3", Type: "x", Data: []byte(`{}`), CreatedAt: now})
			return err
		}},
	}
	for _, r := range recorders {
		if err := r.write(); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		select {
		case p := <-woken:
			if p != "p3" {
				t.Fatalf("%s: woken for %q", r.name, p)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("replica b not woken by replica a's %s", r.name)
		}
	}

	// Concurrent appends from both, while a follower reads "after last":
	// replica b's through operations that record their event, so the two
	// ways of taking a sequence number interleave.
	const per = 100
	var wg sync.WaitGroup
	for _, s := range []*Store{a, b} {
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func(s *Store, w int) {
				defer wg.Done()
				for i := 0; i < per/4; i++ {
					e := core.Event{ProjectID: "p2", Type: "x", Data: []byte(`{}`), CreatedAt: time.Now()}
					var err error
					if s == b {
						_, _, err = s.CreateOperationEvent(ctx, core.Operation{ID: fmt.Sprintf("op-c%d-%d", w, i), ProjectID: "p2", Kind: "sandbox.pause", Target: "x", State: core.OpPending, CreatedAt: e.CreatedAt}, "", e)
					} else {
						_, err = s.AppendEvent(ctx, e)
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			}(s, w)
		}
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	var last int64
	seen := 0
	for {
		// Whether the writers were done before this read: only then does an
		// empty read mean the end.
		var wereDone bool
		select {
		case <-finished:
			wereDone = true
		default:
		}
		evs, err := b.EventsAfter(ctx, "p2", last, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Seq <= last {
				t.Fatalf("seq %d after %d", e.Seq, last)
			}
			last = e.Seq
			seen++
		}
		if wereDone && len(evs) == 0 {
			if seen != 2*per {
				t.Fatalf("follower saw %d events, want %d (a gap: an event committed after a later one was read)", seen, 2*per)
			}
			return
		}
	}
}

// Each replica's recovery and reaper only see its own work.
func TestNodeScoping(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.FreshDSN(t)
	a, b := open(t, dsn, Options{Node: "a"}), open(t, dsn, Options{Node: "b"})
	exp := time.Now().Add(-time.Minute)
	for _, x := range []struct {
		s    *Store
		node string
	}{{a, "a"}, {b, "b"}} {
		id := "sbx-" + x.node
		sb := core.Sandbox{ID: id, ProjectID: "p", State: core.SandboxRunning, Node: x.node, ExpiresAt: &exp}
		op := core.Operation{ID: "op-" + x.node, ProjectID: "p", Kind: "sandbox.create", Target: id, State: core.OpRunning}
		if _, _, err := x.s.CreateSandboxOp(ctx, sb, op, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range []struct {
		s    *Store
		node string
	}{{a, "a"}, {b, "b"}} {
		ops, err := x.s.UnfinishedOperations(ctx)
		if err != nil || len(ops) != 1 || ops[0].ID != "op-"+x.node {
			t.Fatalf("node %s unfinished: %v %v", x.node, ops, err)
		}
		ex, err := x.s.ExpiredSandboxes(ctx, time.Now())
		if err != nil || len(ex) != 1 || ex[0].ID != "sbx-"+x.node {
			t.Fatalf("node %s expired: %v %v", x.node, ex, err)
		}
	}
	all := open(t, dsn, Options{})
	if ops, _ := all.UnfinishedOperations(ctx); len(ops) != 2 {
		t.Fatalf("unscoped store sees %d unfinished operations, want 2", len(ops))
	}
}

// UpdateSandbox from many goroutines (and two pools) never loses an update.
func TestUpdateSandboxSerialises(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.FreshDSN(t)
	a, b := open(t, dsn, Options{}), open(t, dsn, Options{})
	sb := core.Sandbox{ID: "sbx-1", ProjectID: "p", State: core.SandboxRunning}
	if _, _, err := a.CreateSandboxOp(ctx, sb, core.Operation{ID: "op-1", ProjectID: "p", State: core.OpPending}, ""); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(s *Store, i int) {
			defer wg.Done()
			if _, err := s.UpdateSandbox(ctx, "sbx-1", func(sb *core.Sandbox) error {
				if sb.Metadata == nil {
					sb.Metadata = map[string]string{}
				}
				sb.Metadata[fmt.Sprint(i)] = "x"
				return nil
			}); err != nil {
				t.Error(err)
			}
		}([]*Store{a, b}[i%2], i)
	}
	wg.Wait()
	got, err := a.GetSandbox(ctx, "", "sbx-1")
	if err != nil || len(got.Metadata) != 20 {
		t.Fatalf("%d of 20 updates kept: %v", len(got.Metadata), err)
	}
	if l, _ := b.ListSandboxes(ctx, core.SandboxFilter{Metadata: map[string]string{"7": "x", "13": "x"}}); len(l) != 1 {
		t.Fatalf("metadata column not updated: %v", l)
	}
}

// JSONB cannot hold U+0000; metadata values with it are still stored and
// filtered exactly (as on SQLite).
func TestMetadataNUL(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.FreshDSN(t), Options{})
	for i, v := range []string{"a\x00b", `a\0b`, `a\b`} {
		id := fmt.Sprintf("sbx-%d", i)
		sb := core.Sandbox{ID: id, ProjectID: "p", State: core.SandboxRunning, Metadata: map[string]string{"k": v}}
		if _, _, err := s.CreateSandboxOp(ctx, sb, core.Operation{ID: "op-" + id, ProjectID: "p", State: core.OpPending}, ""); err != nil {
			t.Fatalf("create with %q: %v", v, err)
		}
	}
	for i, v := range []string{"a\x00b", `a\0b`, `a\b`} {
		l, err := s.ListSandboxes(ctx, core.SandboxFilter{Metadata: map[string]string{"k": v}})
		if err != nil || len(l) != 1 || l[0].ID != fmt.Sprintf("sbx-%d", i) || l[0].Metadata["k"] != v {
			t.Fatalf("filter %q: %v %v", v, l, err)
		}
	}
}

// A listener whose connection is cut reconnects and wakes everyone (it may
// have missed notifications), then delivers again.
func TestWatchEventsReconnects(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	s := open(t, dsn, Options{Logf: t.Logf})
	ctx, cancel := context.WithCancel(context.Background())
	woken := make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.WatchEvents(ctx, func(p string) { woken <- p })
	}()
	defer func() { cancel(); <-done }()
	next := func() string {
		select {
		case p := <-woken:
			return p
		case <-time.After(10 * time.Second):
			t.Fatal("no wake-up")
			return ""
		}
	}
	if p := next(); p != "" {
		t.Fatalf("first wake %q", p)
	}
	if _, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name=$1`, listenerName); err != nil {
		t.Fatal(err)
	}
	if p := next(); p != "" {
		t.Fatalf("wake after reconnect %q, want \"\"", p)
	}
	if _, err := s.AppendEvent(ctx, core.Event{ProjectID: "p9", Type: "x", Data: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	for p := next(); p != "p9"; p = next() {
	}
}
