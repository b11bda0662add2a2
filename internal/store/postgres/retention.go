package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// sandboxEnded is ended_at for a sandbox record: when it reached its
// terminal state, NULL while it lives.
func sandboxEnded(sb core.Sandbox) *int64 {
	if !sb.State.Terminal() {
		return nil
	}
	n := timeOrNow(sb.UpdatedAt)
	return &n
}

// opDone is done_at for an operation record: its last update once it
// finished, NULL before.
func opDone(op core.Operation) *int64 {
	if !op.State.Done() {
		return nil
	}
	n := timeOrNow(op.UpdatedAt)
	return &n
}

func eventTime(e core.Event) int64 { return timeOrNow(e.CreatedAt) }

func timeOrNow(t time.Time) int64 {
	if t.IsZero() {
		return time.Now().UnixNano()
	}
	return t.UnixNano()
}

// PruneEnded deletes up to limit ended sandboxes, finished operations and
// events older than cutoff (see core.Store): one indexed DELETE per kind.
// Rows another replica is pruning at the same moment are skipped (SKIP
// LOCKED), so replicas that all prune never wait on each other.
func (s *Store) PruneEnded(ctx context.Context, cutoff time.Time, limit int) (core.PruneCounts, error) {
	var c core.PruneCounts
	if limit <= 0 {
		return c, nil
	}
	at := cutoff.UnixNano()
	for _, q := range []struct {
		n    *int
		what string
		sql  string
	}{
		// A snapshot names its source sandbox (forks copy its env and
		// limits, snapshot GC finds the node by it), and so does an
		// operation still running on it: such a sandbox stays.
		{&c.Sandboxes, "sandboxes", `DELETE FROM sandboxes WHERE id IN (
  SELECT id FROM sandboxes WHERE ended_at IS NOT NULL AND ended_at < $1
    AND NOT EXISTS (SELECT 1 FROM snapshots WHERE snapshots.sandbox_id = sandboxes.id)
    AND NOT EXISTS (SELECT 1 FROM operations WHERE operations.target = sandboxes.id AND operations.done_at IS NULL)
  ORDER BY ended_at LIMIT $2 FOR UPDATE SKIP LOCKED)`},
		// The operations of a sandbox that still lives stay with it (its
		// create's idempotency key among them).
		{&c.Operations, "operations", `DELETE FROM operations WHERE id IN (
  SELECT id FROM operations WHERE done_at IS NOT NULL AND done_at < $1
    AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE sandboxes.id = operations.target AND sandboxes.ended_at IS NULL)
  ORDER BY done_at LIMIT $2 FOR UPDATE SKIP LOCKED)`},
		{&c.Events, "events", `DELETE FROM events WHERE seq IN (
  SELECT seq FROM events WHERE created_at < $1 ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)`},
	} {
		tag, err := s.pool.Exec(ctx, q.sql, at, limit)
		if err != nil {
			return c, fmt.Errorf("prune %s: %w", q.what, err)
		}
		*q.n = int(tag.RowsAffected())
	}
	return c, nil
}
