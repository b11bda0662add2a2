package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Broker persists lifecycle events and wakes up subscribers. Events are
// stored first, so a subscriber that reconnects with its last seq misses
// nothing; the in-memory part only says "something new is there".
type Broker struct {
	store Store
	now   func() time.Time

	mu      sync.Mutex
	waiters map[string]chan struct{} // project -> closed on the next event
}

// NewBroker returns a broker over store.
func NewBroker(store Store, now func() time.Time) *Broker {
	return &Broker{store: store, now: now, waiters: map[string]chan struct{}{}}
}

// Publish stores an event and wakes the project's subscribers.
func (b *Broker) Publish(ctx context.Context, projectID, typ, sandboxID, opID string, data any) error {
	ev, err := b.NewEvent(projectID, typ, sandboxID, opID, data)
	if err != nil {
		return err
	}
	if _, err = b.store.AppendEvent(ctx, ev); err != nil {
		return err
	}
	b.Wake(projectID)
	return nil
}

// NewEvent is the event Publish would store, for a caller that stores it
// itself (UpdateOperationEvent) and then calls Wake.
func (b *Broker) NewEvent(projectID, typ, sandboxID, opID string, data any) (Event, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return Event{}, fmt.Errorf("encode event: %w", err)
	}
	return Event{ProjectID: projectID, Type: typ, SandboxID: sandboxID, OperationID: opID,
		Data: raw, CreatedAt: b.now().UTC()}, nil
}

// OperationEvents is implemented by stores that save an operation and
// append its event in one round trip (PostgreSQL: one statement). Every
// step of every operation does both, and with a shared store each round
// trip costs the replica and the database more than the work itself.
type OperationEvents interface {
	// UpdateOperationEvent saves op (ErrNotFound when it has no record,
	// and then appends nothing) and appends e.
	UpdateOperationEvent(ctx context.Context, op Operation, e Event) (Event, error)
}

// UpdateOperationEvent saves op and appends e: in one call when st
// implements OperationEvents, else UpdateOperation then AppendEvent.
func UpdateOperationEvent(ctx context.Context, st Store, op Operation, e Event) (Event, error) {
	if oe, ok := st.(OperationEvents); ok {
		return oe.UpdateOperationEvent(ctx, op, e)
	}
	if err := st.UpdateOperation(ctx, op); err != nil {
		return e, err
	}
	return st.AppendEvent(ctx, e)
}

// RecordEvents is implemented by stores that write a sandbox or operation
// record and the events it causes in one transaction: one commit where a
// write and a Publish made two. A sandbox's create and delete cause three
// such pairs each (stop 37, docs/PERFORMANCE.md). Events are appended in
// the order given and only when the record is written.
type RecordEvents interface {
	// CreateSandboxOpEvents is CreateSandboxOp that, when it creates, also
	// appends evs.
	CreateSandboxOpEvents(ctx context.Context, s Sandbox, op Operation, idemKey string, evs []Event) (Operation, bool, error)
	// CreateOperationEvent is CreateOperation that, when it creates, also
	// appends e.
	CreateOperationEvent(ctx context.Context, op Operation, idemKey string, e Event) (Operation, bool, error)
	// UpdateSandboxEvent is UpdateSandbox that also appends the event ev
	// makes of the updated record.
	UpdateSandboxEvent(ctx context.Context, id string, fn func(*Sandbox) error, ev func(Sandbox) (Event, error)) (Sandbox, error)
}

// CreateSandboxOpEvents stores sb and op and, when it creates them, appends
// evs: in one transaction when st implements RecordEvents.
func CreateSandboxOpEvents(ctx context.Context, st Store, sb Sandbox, op Operation, idemKey string, evs []Event) (Operation, bool, error) {
	if re, ok := st.(RecordEvents); ok {
		return re.CreateSandboxOpEvents(ctx, sb, op, idemKey, evs)
	}
	stored, created, err := st.CreateSandboxOp(ctx, sb, op, idemKey)
	if err != nil || !created {
		return stored, created, err
	}
	return stored, true, appendEvents(ctx, st, evs)
}

// CreateOperationEvent stores op and, when it creates it, appends e: in one
// transaction when st implements RecordEvents.
func CreateOperationEvent(ctx context.Context, st Store, op Operation, idemKey string, e Event) (Operation, bool, error) {
	if re, ok := st.(RecordEvents); ok {
		return re.CreateOperationEvent(ctx, op, idemKey, e)
	}
	stored, created, err := st.CreateOperation(ctx, op, idemKey)
	if err != nil || !created {
		return stored, created, err
	}
	return stored, true, appendEvents(ctx, st, []Event{e})
}

// UpdateSandboxEvent applies fn to a sandbox and appends the event ev makes
// of the result: in one transaction when st implements RecordEvents.
func UpdateSandboxEvent(ctx context.Context, st Store, id string, fn func(*Sandbox) error, ev func(Sandbox) (Event, error)) (Sandbox, error) {
	if re, ok := st.(RecordEvents); ok {
		return re.UpdateSandboxEvent(ctx, id, fn, ev)
	}
	sb, err := st.UpdateSandbox(ctx, id, fn)
	if err != nil {
		return sb, err
	}
	e, err := ev(sb)
	if err != nil {
		return sb, err
	}
	return sb, appendEvents(ctx, st, []Event{e})
}

// errEventNotStored wraps the error of an event that the fallback of the
// functions above failed to append after it wrote the record: the record
// stands (as after a failed Publish), and the caller logs the event's
// error and goes on.
var errEventNotStored = errors.New("record stored, its event not")

// appendEvents is the fallback of the functions above.
func appendEvents(ctx context.Context, st Store, evs []Event) error {
	for _, e := range evs {
		if _, err := st.AppendEvent(ctx, e); err != nil {
			return fmt.Errorf("%w: %w", errEventNotStored, err)
		}
	}
	return nil
}

// EventWatcher is implemented by stores that several servers share (the
// PostgreSQL store, over LISTEN/NOTIFY): WatchEvents calls wake with the
// project of every event appended by any server, and with "" (all
// projects) when it may have missed some, until ctx ends. The SQLite store
// has a single server and does not implement it.
type EventWatcher interface {
	WatchEvents(ctx context.Context, wake func(projectID string)) error
}

// Wake wakes the subscribers of a project, or of every project when
// projectID is "", without storing anything: an event written by another
// server is already in the store.
func (b *Broker) Wake(projectID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if projectID == "" {
		for p, ch := range b.waiters {
			close(ch)
			delete(b.waiters, p)
		}
		return
	}
	if ch, ok := b.waiters[projectID]; ok {
		close(ch)
		delete(b.waiters, projectID)
	}
}

// Changed returns a channel closed at the next event of the project. Take it
// before reading the store, so no event can fall between read and wait.
func (b *Broker) Changed(projectID string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, ok := b.waiters[projectID]
	if !ok {
		ch = make(chan struct{})
		b.waiters[projectID] = ch
	}
	return ch
}

// Since returns the project's events after seq.
func (b *Broker) Since(ctx context.Context, projectID string, after int64, limit int) ([]Event, error) {
	return b.store.EventsAfter(ctx, projectID, after, limit)
}

// Latest returns the project's newest event sequence number.
func (b *Broker) Latest(ctx context.Context, projectID string) (int64, error) {
	return b.store.LatestEventSeq(ctx, projectID)
}
