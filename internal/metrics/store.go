package metrics

import (
	"context"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// Store wraps st so that every call is timed (space_store_duration_seconds,
// space_store_errors_total) and every operation the engine stores in a
// final state is counted (space_operations_total,
// space_operation_duration_seconds): the engine stores each outcome exactly
// once, so the store is where operations of every kind end. The optional
// interfaces st implements (core.NodeStore, core.EventWatcher,
// core.OwnedOperations) are kept.
func (m *Metrics) Store(st core.Store) core.Store {
	b := &store{Store: st, m: m}
	ns, isNS := st.(core.NodeStore)
	ew, isEW := st.(core.EventWatcher)
	oo, isOO := st.(core.OwnedOperations)
	n := nodeStore{b, ns}
	e := eventWatcher{ew}
	o := ownedOps{b, oo}
	switch {
	case isNS && isEW && isOO:
		return &struct {
			*store
			nodeStore
			eventWatcher
			ownedOps
		}{b, n, e, o}
	case isNS && isEW:
		return &struct {
			*store
			nodeStore
			eventWatcher
		}{b, n, e}
	case isNS && isOO:
		return &struct {
			*store
			nodeStore
			ownedOps
		}{b, n, o}
	case isEW && isOO:
		return &struct {
			*store
			eventWatcher
			ownedOps
		}{b, e, o}
	case isNS:
		return &struct {
			*store
			nodeStore
		}{b, n}
	case isEW:
		return &struct {
			*store
			eventWatcher
		}{b, e}
	case isOO:
		return &struct {
			*store
			ownedOps
		}{b, o}
	}
	return b
}

// store times the methods it names; any other method of core.Store (one
// added later) is the inner store's own, untimed, through the embedding.
type store struct {
	core.Store
	m *Metrics
}

func (s *store) done(method string, t0 time.Time, err error) {
	s.m.storeSeconds.WithLabelValues(method).Observe(time.Since(t0).Seconds())
	if storeFailed(err) {
		s.m.storeErrors.WithLabelValues(method).Inc()
	}
}

func (s *store) GetMeta(ctx context.Context, key string) ([]byte, error) {
	t0 := time.Now()
	v, err := s.Store.GetMeta(ctx, key)
	s.done("GetMeta", t0, err)
	return v, err
}

func (s *store) PutMetaIfAbsent(ctx context.Context, key string, val []byte) ([]byte, error) {
	t0 := time.Now()
	v, err := s.Store.PutMetaIfAbsent(ctx, key, val)
	s.done("PutMetaIfAbsent", t0, err)
	return v, err
}

func (s *store) CreateAPIKey(ctx context.Context, k core.APIKey) error {
	t0 := time.Now()
	err := s.Store.CreateAPIKey(ctx, k)
	s.done("CreateAPIKey", t0, err)
	return err
}

func (s *store) GetAPIKey(ctx context.Context, id string) (core.APIKey, error) {
	t0 := time.Now()
	k, err := s.Store.GetAPIKey(ctx, id)
	s.done("GetAPIKey", t0, err)
	return k, err
}

func (s *store) ListAPIKeys(ctx context.Context, projectID string) ([]core.APIKey, error) {
	t0 := time.Now()
	l, err := s.Store.ListAPIKeys(ctx, projectID)
	s.done("ListAPIKeys", t0, err)
	return l, err
}

func (s *store) RevokeAPIKey(ctx context.Context, projectID, id string, at time.Time) error {
	t0 := time.Now()
	err := s.Store.RevokeAPIKey(ctx, projectID, id, at)
	s.done("RevokeAPIKey", t0, err)
	return err
}

func (s *store) CreateSandboxOp(ctx context.Context, sb core.Sandbox, op core.Operation, idemKey string) (core.Operation, bool, error) {
	t0 := time.Now()
	o, created, err := s.Store.CreateSandboxOp(ctx, sb, op, idemKey)
	s.done("CreateSandboxOp", t0, err)
	return o, created, err
}

func (s *store) GetSandbox(ctx context.Context, projectID, id string) (core.Sandbox, error) {
	t0 := time.Now()
	sb, err := s.Store.GetSandbox(ctx, projectID, id)
	s.done("GetSandbox", t0, err)
	return sb, err
}

func (s *store) ListSandboxes(ctx context.Context, f core.SandboxFilter) ([]core.Sandbox, error) {
	t0 := time.Now()
	l, err := s.Store.ListSandboxes(ctx, f)
	s.done("ListSandboxes", t0, err)
	return l, err
}

func (s *store) UpdateSandbox(ctx context.Context, id string, fn func(*core.Sandbox) error) (core.Sandbox, error) {
	t0 := time.Now()
	sb, err := s.Store.UpdateSandbox(ctx, id, fn)
	s.done("UpdateSandbox", t0, err)
	return sb, err
}

func (s *store) ExpiredSandboxes(ctx context.Context, now time.Time) ([]core.Sandbox, error) {
	t0 := time.Now()
	l, err := s.Store.ExpiredSandboxes(ctx, now)
	s.done("ExpiredSandboxes", t0, err)
	return l, err
}

func (s *store) CreateOperation(ctx context.Context, op core.Operation, idemKey string) (core.Operation, bool, error) {
	t0 := time.Now()
	o, created, err := s.Store.CreateOperation(ctx, op, idemKey)
	s.done("CreateOperation", t0, err)
	return o, created, err
}

func (s *store) GetOperation(ctx context.Context, projectID, id string) (core.Operation, error) {
	t0 := time.Now()
	o, err := s.Store.GetOperation(ctx, projectID, id)
	s.done("GetOperation", t0, err)
	return o, err
}

func (s *store) UpdateOperation(ctx context.Context, op core.Operation) error {
	t0 := time.Now()
	err := s.Store.UpdateOperation(ctx, op)
	s.done("UpdateOperation", t0, err)
	if err == nil && op.State.Done() {
		s.m.operationDone(op)
	}
	return err
}

// UpdateOperationEvent keeps the inner store's single round trip
// (core.OperationEvents) and falls back to the two timed calls.
func (s *store) UpdateOperationEvent(ctx context.Context, op core.Operation, e core.Event) (core.Event, error) {
	oe, ok := s.Store.(core.OperationEvents)
	if !ok {
		if err := s.UpdateOperation(ctx, op); err != nil {
			return e, err
		}
		return s.AppendEvent(ctx, e)
	}
	t0 := time.Now()
	ev, err := oe.UpdateOperationEvent(ctx, op, e)
	s.done("UpdateOperationEvent", t0, err)
	if err == nil && op.State.Done() {
		s.m.operationDone(op)
	}
	return ev, err
}

// storeOnly hides the optional interfaces of a store: the fallbacks of
// core's RecordEvents functions, run over it, make the timed calls.
type storeOnly struct{ core.Store }

// CreateSandboxOpEvents keeps the inner store's single transaction
// (core.RecordEvents) and falls back to the timed calls.
func (s *store) CreateSandboxOpEvents(ctx context.Context, sb core.Sandbox, op core.Operation, idemKey string, evs []core.Event) (core.Operation, bool, error) {
	re, ok := s.Store.(core.RecordEvents)
	if !ok {
		return core.CreateSandboxOpEvents(ctx, storeOnly{s}, sb, op, idemKey, evs)
	}
	t0 := time.Now()
	o, created, err := re.CreateSandboxOpEvents(ctx, sb, op, idemKey, evs)
	s.done("CreateSandboxOpEvents", t0, err)
	return o, created, err
}

// CreateOperationEvent: as CreateSandboxOpEvents.
func (s *store) CreateOperationEvent(ctx context.Context, op core.Operation, idemKey string, e core.Event) (core.Operation, bool, error) {
	re, ok := s.Store.(core.RecordEvents)
	if !ok {
		return core.CreateOperationEvent(ctx, storeOnly{s}, op, idemKey, e)
	}
	t0 := time.Now()
	o, created, err := re.CreateOperationEvent(ctx, op, idemKey, e)
	s.done("CreateOperationEvent", t0, err)
	return o, created, err
}

// UpdateSandboxEvent: as CreateSandboxOpEvents.
func (s *store) UpdateSandboxEvent(ctx context.Context, id string, fn func(*core.Sandbox) error, ev func(core.Sandbox) (core.Event, error)) (core.Sandbox, error) {
	re, ok := s.Store.(core.RecordEvents)
	if !ok {
		return core.UpdateSandboxEvent(ctx, storeOnly{s}, id, fn, ev)
	}
	t0 := time.Now()
	sb, err := re.UpdateSandboxEvent(ctx, id, fn, ev)
	s.done("UpdateSandboxEvent", t0, err)
	return sb, err
}

func (s *store) UnfinishedOperations(ctx context.Context) ([]core.Operation, error) {
	t0 := time.Now()
	l, err := s.Store.UnfinishedOperations(ctx)
	s.done("UnfinishedOperations", t0, err)
	return l, err
}

func (s *store) AppendEvent(ctx context.Context, e core.Event) (core.Event, error) {
	t0 := time.Now()
	ev, err := s.Store.AppendEvent(ctx, e)
	s.done("AppendEvent", t0, err)
	return ev, err
}

func (s *store) LatestEventSeq(ctx context.Context, projectID string) (int64, error) {
	t0 := time.Now()
	n, err := s.Store.LatestEventSeq(ctx, projectID)
	s.done("LatestEventSeq", t0, err)
	return n, err
}

func (s *store) EventsAfter(ctx context.Context, projectID string, after int64, limit int) ([]core.Event, error) {
	t0 := time.Now()
	l, err := s.Store.EventsAfter(ctx, projectID, after, limit)
	s.done("EventsAfter", t0, err)
	return l, err
}

func (s *store) CreateSnapshotOp(ctx context.Context, snap core.Snapshot, op core.Operation, idemKey string) (core.Operation, bool, error) {
	t0 := time.Now()
	o, created, err := s.Store.CreateSnapshotOp(ctx, snap, op, idemKey)
	s.done("CreateSnapshotOp", t0, err)
	return o, created, err
}

func (s *store) GetSnapshot(ctx context.Context, projectID, id string) (core.Snapshot, error) {
	t0 := time.Now()
	sn, err := s.Store.GetSnapshot(ctx, projectID, id)
	s.done("GetSnapshot", t0, err)
	return sn, err
}

func (s *store) ListSnapshots(ctx context.Context, f core.SnapshotFilter) ([]core.Snapshot, error) {
	t0 := time.Now()
	l, err := s.Store.ListSnapshots(ctx, f)
	s.done("ListSnapshots", t0, err)
	return l, err
}

func (s *store) UpdateSnapshot(ctx context.Context, id string, fn func(*core.Snapshot) error) (core.Snapshot, error) {
	t0 := time.Now()
	sn, err := s.Store.UpdateSnapshot(ctx, id, fn)
	s.done("UpdateSnapshot", t0, err)
	return sn, err
}

func (s *store) DeleteSnapshot(ctx context.Context, projectID, id string) error {
	t0 := time.Now()
	err := s.Store.DeleteSnapshot(ctx, projectID, id)
	s.done("DeleteSnapshot", t0, err)
	return err
}

func (s *store) Close() error { return s.Store.Close() }

// Unwrap returns the store this one instruments.
func (s *store) Unwrap() core.Store { return s.Store }

type nodeStore struct {
	s  *store
	ns core.NodeStore
}

func (n nodeStore) PutNode(ctx context.Context, r core.NodeRecord) (core.NodeRecord, error) {
	t0 := time.Now()
	prev, err := n.ns.PutNode(ctx, r)
	n.s.done("PutNode", t0, err)
	return prev, err
}

func (n nodeStore) ListNodes(ctx context.Context) ([]core.NodeRecord, error) {
	t0 := time.Now()
	l, err := n.ns.ListNodes(ctx)
	n.s.done("ListNodes", t0, err)
	return l, err
}

func (n nodeStore) MarkNodeLost(ctx context.Context, name string, staleBefore time.Time, reason string) (bool, error) {
	t0 := time.Now()
	ok, err := n.ns.MarkNodeLost(ctx, name, staleBefore, reason)
	n.s.done("MarkNodeLost", t0, err)
	return ok, err
}

func (n nodeStore) DeleteNode(ctx context.Context, name string) error {
	t0 := time.Now()
	err := n.ns.DeleteNode(ctx, name)
	n.s.done("DeleteNode", t0, err)
	return err
}

// eventWatcher passes WatchEvents through untimed: it runs until its
// context ends.
type eventWatcher struct{ ew core.EventWatcher }

func (e eventWatcher) WatchEvents(ctx context.Context, wake func(projectID string)) error {
	return e.ew.WatchEvents(ctx, wake)
}

type ownedOps struct {
	s  *store
	oo core.OwnedOperations
}

func (o ownedOps) UnfinishedOperationsOf(ctx context.Context, owner string) ([]core.Operation, error) {
	t0 := time.Now()
	l, err := o.oo.UnfinishedOperationsOf(ctx, owner)
	o.s.done("UnfinishedOperationsOf", t0, err)
	return l, err
}
