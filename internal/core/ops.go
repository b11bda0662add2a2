package core

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/logx"
)

// NewID returns prefix + 16 random hex characters.
func NewID(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // the kernel's CSPRNG never fails on Linux
	}
	return prefix + hex.EncodeToString(b[:])
}

// Progress lets an operation report how far it got.
type Progress func(pct int, msg string)

// OpFunc does an operation's work. Its result is stored with the operation.
type OpFunc func(ctx context.Context, progress Progress) (result any, err error)

// Engine runs operations: each is persisted before its work starts, its
// state changes are published as events, and Recover fails what a crash
// left unfinished so no operation stays running forever.
type Engine struct {
	store  Store
	broker *Broker
	now    func() time.Time
	log    *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]Operation // started and not yet ended, by id
	ended   map[string]*opEnd    // of each running operation
}

// opEnd is how a running operation ends: done closes once its outcome
// is stored, and op is that outcome as stored (stored false: saving it
// failed, so only the store can say).
type opEnd struct {
	done   chan struct{}
	op     Operation
	stored bool
}

// NewEngine returns an engine; operations run under ctx. Its records go to
// logf (see SetLogger).
func NewEngine(ctx context.Context, store Store, broker *Broker, now func() time.Time, logf func(string, ...any)) *Engine {
	ctx, cancel := context.WithCancel(ctx)
	return &Engine{store: store, broker: broker, now: now, log: logx.FromLogf(logf), ctx: ctx, cancel: cancel,
		running: map[string]Operation{}, ended: map[string]*opEnd{}}
}

// SetLogger sends the engine's records to l: one per ended operation
// ("operation ended", with the request id of the request that made it),
// one per operation Recover fails ("operation interrupted") and what
// Shutdown leaves. Call it before the engine runs anything.
func (e *Engine) SetLogger(l *slog.Logger) {
	if l != nil {
		e.log = l
	}
}

func opAttrs(op Operation) []slog.Attr {
	return []slog.Attr{slog.String("operation", op.ID), slog.String("kind", op.Kind), slog.String("target", op.Target),
		slog.String("project", op.ProjectID)}
}

// NewOperation returns a pending operation record (not yet stored). Its
// fingerprint is (kind, target): a request whose operation acts on a new
// object (a create), or that carries a body, sets its own.
func (e *Engine) NewOperation(projectID, kind, target string) Operation {
	t := e.now().UTC()
	return Operation{ID: NewID("op-"), ProjectID: projectID, Kind: kind, Target: target,
		State: OpPending, CreatedAt: t, UpdatedAt: t, Fingerprint: Fingerprint(kind, target)}
}

// Fingerprint is the sha256 (hex) of parts, each in its JSON form: what
// identifies a request for idempotency (its kind, its target, its decoded
// body). Retrying with the same Idempotency-Key must give the same one.
func Fingerprint(parts ...any) string {
	h := sha256.New()
	for _, p := range parts {
		b, err := json.Marshal(p)
		if err != nil {
			b = []byte(fmt.Sprintf("%#v", p))
		}
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// CheckReplay is the idempotency rule for an operation a store did not
// create because its key was taken by stored: the same request replays
// stored; another one is ErrIdempotencyReused. Operations stored before
// fingerprints existed replay as they did.
func CheckReplay(stored, op Operation) error {
	if stored.Fingerprint != "" && op.Fingerprint != "" && stored.Fingerprint != op.Fingerprint {
		return fmt.Errorf("%w: it was first used for %s %s (operation %s); use a new key for a new request",
			ErrIdempotencyReused, stored.Kind, stored.Target, stored.ID)
	}
	return nil
}

// storedOperation is an operation as stores keep it: the record clients
// see plus its fingerprint.
type storedOperation struct {
	Operation
	Fingerprint string `json:"fingerprint,omitempty"`
}

// EncodeOperation is the document a store keeps for op.
func EncodeOperation(op Operation) ([]byte, error) {
	return json.Marshal(storedOperation{Operation: op, Fingerprint: op.Fingerprint})
}

// DecodeOperation reads a document written by EncodeOperation (or by a
// json.Marshal of an Operation, before fingerprints).
func DecodeOperation(doc []byte) (Operation, error) {
	var so storedOperation
	if err := json.Unmarshal(doc, &so); err != nil {
		return Operation{}, err
	}
	so.Operation.Fingerprint = so.Fingerprint
	return so.Operation, nil
}

// Submit stores op (pending) and runs fn in the background. With an
// idempotency key already used, it returns the first operation (the same
// request) or ErrIdempotencyReused (another one), and runs nothing.
func (e *Engine) Submit(ctx context.Context, op Operation, idemKey string, fn OpFunc) (Operation, error) {
	return e.SubmitWith(ctx, op, idemKey, Step{}, fn)
}

// Step is an operation's progress and message. Given to StartWith or
// SubmitWith, it is stored with the running state in that one write, where
// a first progress call would be a second write (and event) right after
// it: the create and delete of a sandbox, the hot path, do so.
type Step struct {
	Progress int
	Message  string
}

// SubmitWith is Submit with the operation's first step.
func (e *Engine) SubmitWith(ctx context.Context, op Operation, idemKey string, first Step, fn OpFunc) (Operation, error) {
	ev, err := e.PendingEvent(op)
	if err != nil {
		return op, err
	}
	// The record and its pending event in one write (RecordEvents).
	stored, created, err := CreateOperationEvent(ctx, e.store, op, idemKey, ev)
	if errors.Is(err, errEventNotStored) {
		e.log.LogAttrs(ctx, slog.LevelWarn, "operation publish failed", append(opAttrs(op), slog.String("error", err.Error()))...)
		err = nil
	}
	if err != nil {
		return op, err
	}
	if !created {
		if err := CheckReplay(stored, op); err != nil {
			return op, err
		}
		return stored, nil
	}
	e.broker.Wake(op.ProjectID)
	e.startWith(ctx, stored, first, fn, false)
	return stored, nil
}

// PendingEvent is the operation.updated event StartWith publishes for op,
// for a caller that stores it with op's record (RecordEvents) and then
// runs op with StartStored.
func (e *Engine) PendingEvent(op Operation) (Event, error) {
	return e.broker.NewEvent(op.ProjectID, "operation.updated", sandboxTarget(op), op.ID, op)
}

// StartStored is StartWith for an operation whose pending event is
// already stored (PendingEvent).
func (e *Engine) StartStored(ctx context.Context, op Operation, first Step, fn OpFunc) {
	e.startWith(ctx, op, first, fn, false)
}

// Start runs fn for an operation that is already stored as pending. ctx is
// the request's: only its request id is kept (audit.RequestID), for the
// operation's log records and the node calls it makes; the work runs under
// the engine's own context.
func (e *Engine) Start(ctx context.Context, op Operation, fn OpFunc) {
	e.StartWith(ctx, op, Step{}, fn)
}

// StartWith is Start with the operation's first step (see Step).
func (e *Engine) StartWith(ctx context.Context, op Operation, first Step, fn OpFunc) {
	e.startWith(ctx, op, first, fn, true)
}

func (e *Engine) startWith(ctx context.Context, op Operation, first Step, fn OpFunc, publish bool) {
	if publish {
		e.publish(op)
	}
	e.mu.Lock()
	e.running[op.ID] = op
	end := &opEnd{done: make(chan struct{})}
	e.ended[op.ID] = end
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() {
			e.mu.Lock()
			delete(e.running, op.ID)
			delete(e.ended, op.ID)
			e.mu.Unlock()
			close(end.done)
		}()
		e.run(audit.RequestID(ctx), op, first, fn, end)
	}()
}

func (e *Engine) run(requestID string, op Operation, first Step, fn OpFunc, end *opEnd) {
	ctx := e.ctx
	if requestID != "" {
		ctx = audit.WithRequestID(ctx, requestID)
	}
	t0 := e.now()
	op.State = OpRunning
	if first != (Step{}) {
		op.Progress, op.Message = min(max(first.Progress, 0), 99), first.Message
	}
	e.save(op)
	var mu sync.Mutex
	progress := func(pct int, msg string) {
		mu.Lock()
		defer mu.Unlock()
		if pct < op.Progress {
			pct = op.Progress
		}
		if pct > 99 {
			pct = 99
		}
		op.Progress, op.Message = pct, msg
		e.save(op)
	}
	result, err := func() (res any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("operation panicked: %v", r)
			}
		}()
		return fn(ctx, progress)
	}()
	mu.Lock()
	defer mu.Unlock()
	switch {
	case err == nil:
		op.State, op.Progress, op.Message = OpSucceeded, 100, "done"
		if result != nil {
			if raw, mErr := json.Marshal(result); mErr == nil {
				op.Result = raw
			}
		}
	case errors.Is(err, context.Canceled):
		op.State, op.Error = OpCancelled, &OpError{Code: "cancelled", Message: err.Error()}
	default:
		op.State, op.Error = OpFailed, &OpError{Code: ErrorCode(err), Message: err.Error()}
	}
	// The engine's context may be cancelled at shutdown; record the outcome anyway.
	end.op, end.stored = e.saveCtx(context.WithoutCancel(ctx), op)
	attrs := append(opAttrs(op), slog.String("state", string(op.State)),
		slog.Float64("duration_ms", float64(e.now().Sub(t0).Microseconds())/1000))
	level := slog.LevelInfo
	if op.Error != nil {
		attrs = append(attrs, slog.String("error_code", op.Error.Code), slog.String("error", op.Error.Message))
		if op.State == OpFailed {
			level = slog.LevelWarn
		}
	}
	e.log.LogAttrs(context.WithoutCancel(ctx), level, "operation ended", attrs...)
}

func (e *Engine) save(op Operation) { e.saveCtx(e.ctx, op) }

// saveCtx stores op and its operation.updated event (one round trip on
// a store that can) and wakes the project's subscribers. It returns op as
// stored, and whether it was.
func (e *Engine) saveCtx(ctx context.Context, op Operation) (Operation, bool) {
	op.UpdatedAt = e.now().UTC()
	ev, err := e.broker.NewEvent(op.ProjectID, "operation.updated", sandboxTarget(op), op.ID, op)
	if err == nil {
		_, err = UpdateOperationEvent(ctx, e.store, op, ev)
	}
	if err != nil {
		e.log.LogAttrs(ctx, slog.LevelWarn, "operation save failed", append(opAttrs(op), slog.String("error", err.Error()))...)
		return op, false
	}
	e.broker.Wake(op.ProjectID)
	return op, true
}

func (e *Engine) publish(op Operation) { e.publishCtx(e.ctx, op) }

func (e *Engine) publishCtx(ctx context.Context, op Operation) {
	if err := e.broker.Publish(ctx, op.ProjectID, "operation.updated", sandboxTarget(op), op.ID, op); err != nil {
		e.log.LogAttrs(ctx, slog.LevelWarn, "operation publish failed", append(opAttrs(op), slog.String("error", err.Error()))...)
	}
}

func sandboxTarget(op Operation) string {
	if len(op.Kind) > 8 && op.Kind[:8] == "sandbox." {
		return op.Target
	}
	return ""
}

// Wait returns the operation once it is done or timeout passes, whichever
// comes first (long-poll).
func (e *Engine) Wait(ctx context.Context, projectID, id string, timeout time.Duration) (Operation, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		end := e.ended[id]
		running := e.running[id]
		e.mu.Unlock()
		if end != nil && timeout > 0 && (projectID == "" || running.ProjectID == projectID) {
			// This engine runs it: nothing but its end finishes it, and
			// the end comes with the outcome as stored, so the wait reads
			// the store only when it times out (with a shared store each
			// read is a query, for every waiter, on every replica).
			select {
			case <-end.done:
				if end.stored {
					return end.op, nil
				}
				continue // the outcome was not saved: ask the store
			case <-deadline.C:
				return e.store.GetOperation(ctx, projectID, id)
			case <-ctx.Done():
				return running, ctx.Err()
			}
		}
		changed := e.broker.Changed(projectID)
		op, err := e.store.GetOperation(ctx, projectID, id)
		if err != nil || op.State.Done() || timeout <= 0 {
			return op, err
		}
		select {
		case <-changed:
		case <-deadline.C:
			return e.store.GetOperation(ctx, projectID, id)
		case <-ctx.Done():
			return op, ctx.Err()
		}
	}
}

// Recover fails every operation a previous process left unfinished.
func (e *Engine) Recover(ctx context.Context) ([]Operation, error) {
	ops, err := e.store.UnfinishedOperations(ctx)
	if err != nil {
		return nil, err
	}
	for i := range ops {
		e.interrupted(ctx, ops[i], "the server stopped while this operation ran")
		ops[i].State = OpFailed
		ops[i].Error = &OpError{Code: "interrupted", Message: "the server stopped while this operation ran"}
		e.saveCtx(ctx, ops[i])
	}
	return ops, nil
}

// interrupted logs an unfinished operation that is failed for reason.
func (e *Engine) interrupted(ctx context.Context, op Operation, reason string) {
	e.log.LogAttrs(ctx, slog.LevelWarn, "operation interrupted", append(opAttrs(op), slog.String("state", string(op.State)),
		slog.Time("created_at", op.CreatedAt), slog.String("reason", reason))...)
}

// Running returns how many operations the engine runs now.
func (e *Engine) Running() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.running)
}

// Drain waits, without cancelling them, until no operation runs or ctx
// ends, and returns how many still run. A server that goes away on purpose
// (a rolling restart of the replicas) drains before Shutdown, so the
// operations it accepted end as they would have instead of cancelled.
func (e *Engine) Drain(ctx context.Context) int {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		n := e.Running()
		if n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-t.C:
		}
	}
}

// Shutdown cancels running operations and waits for them (bounded by ctx).
// It logs what it cancelled and, past ctx's deadline, what was still
// running (those are failed as interrupted at the next start).
func (e *Engine) Shutdown(ctx context.Context) {
	if n := e.Running(); n > 0 {
		e.log.LogAttrs(ctx, slog.LevelInfo, "shutdown: cancelling running operations", slog.Int("operations", n))
	}
	e.cancel()
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		e.mu.Lock()
		left := make([]string, 0, len(e.running))
		for id, op := range e.running {
			left = append(left, id+" ("+op.Kind+" "+op.Target+")")
		}
		e.mu.Unlock()
		e.log.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "shutdown: operations still running",
			slog.Int("operations", len(left)), slog.Any("ids", left))
	}
}

// ErrorCode maps an error to a stable snake_case code.
func ErrorCode(err error) string {
	switch {
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrEgressDisabled):
		return "egress_disabled"
	case errors.Is(err, ErrIdempotencyReused):
		return "idempotency_key_reused"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrInvalid):
		return "invalid_argument"
	case errors.Is(err, ErrUnauthorized):
		return "unauthorized"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrExhausted):
		return "resource_exhausted"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	default:
		return "internal"
	}
}
