package core

import (
	"context"
	"time"
)

// Store persists SPACE's records. SQLite is the embedded default; a
// PostgreSQL implementation must pass the same test suite.
type Store interface {
	// Meta holds small server-wide values (e.g. the session-token key).
	GetMeta(ctx context.Context, key string) ([]byte, error) // ErrNotFound
	PutMetaIfAbsent(ctx context.Context, key string, val []byte) ([]byte, error)

	CreateAPIKey(ctx context.Context, k APIKey) error
	GetAPIKey(ctx context.Context, id string) (APIKey, error)
	ListAPIKeys(ctx context.Context, projectID string) ([]APIKey, error)
	RevokeAPIKey(ctx context.Context, projectID, id string, at time.Time) error

	// CreateSandboxOp stores a new sandbox and the operation that creates it
	// in one transaction. When idemKey matches an earlier operation of the
	// project, nothing is stored and that operation is returned with false.
	CreateSandboxOp(ctx context.Context, s Sandbox, op Operation, idemKey string) (Operation, bool, error)
	GetSandbox(ctx context.Context, projectID, id string) (Sandbox, error) // projectID "" = any
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, error)
	// UpdateSandbox applies fn to the current record inside one transaction.
	UpdateSandbox(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error)
	// ExpiredSandboxes lists running sandboxes whose ExpiresAt is before now.
	ExpiredSandboxes(ctx context.Context, now time.Time) ([]Sandbox, error)

	// CreateOperation stores op. When idemKey is not empty and an operation
	// with the same (project, key) exists, it returns that one and false.
	CreateOperation(ctx context.Context, op Operation, idemKey string) (Operation, bool, error)
	GetOperation(ctx context.Context, projectID, id string) (Operation, error)
	UpdateOperation(ctx context.Context, op Operation) error
	// UnfinishedOperations lists operations in pending or running state.
	UnfinishedOperations(ctx context.Context) ([]Operation, error)

	// AppendEvent stores e and returns it with its sequence number set.
	AppendEvent(ctx context.Context, e Event) (Event, error)
	// LatestEventSeq returns the highest event sequence number of a project (0 if none).
	LatestEventSeq(ctx context.Context, projectID string) (int64, error)
	// EventsAfter returns up to limit events of a project with Seq > after.
	EventsAfter(ctx context.Context, projectID string, after int64, limit int) ([]Event, error)

	// CreateSnapshotOp stores a new snapshot record and the operation that
	// captures it in one transaction, like CreateSandboxOp.
	CreateSnapshotOp(ctx context.Context, snap Snapshot, op Operation, idemKey string) (Operation, bool, error)
	GetSnapshot(ctx context.Context, projectID, id string) (Snapshot, error) // projectID "" = any
	// ListSnapshots lists snapshots oldest first.
	ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error)
	// UpdateSnapshot applies fn to the current record inside one transaction.
	UpdateSnapshot(ctx context.Context, id string, fn func(*Snapshot) error) (Snapshot, error)
	// DeleteSnapshot removes a snapshot record; ErrConflict while another
	// snapshot (creating or ready) names it as its parent.
	DeleteSnapshot(ctx context.Context, projectID, id string) error

	// PruneEnded deletes, in one short batch of at most limit rows per
	// kind, records that ended before cutoff: sandboxes in a terminal state
	// (deleted, failed, lost) since then that no snapshot names, finished
	// operations (by their last update) whose target is not a live
	// sandbox, and events. Unfinished operations, live sandboxes and
	// snapshots are never pruned. It uses indexed time columns, never a
	// scan of every row (see Pruner).
	PruneEnded(ctx context.Context, cutoff time.Time, limit int) (PruneCounts, error)

	Close() error
}
