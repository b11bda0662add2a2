package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// dbtx is what both the database and a transaction offer.
type dbtx interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

// migrateRetention adds the indexed time columns that PruneEnded deletes
// by: when a sandbox ended (ended_at), when an operation finished
// (done_at) and what it acts on (target), when an event was stored
// (created_at). Rows of an older database that already ended count as
// ended now, at the upgrade: they are pruned one retention window later.
func migrateRetention(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	now := time.Now().UnixNano()
	for _, c := range []struct{ table, col, def, backfill string }{
		{"sandboxes", "ended_at", "INTEGER", `UPDATE sandboxes SET ended_at=?1 WHERE state IN ('deleted','failed','lost')`},
		{"operations", "target", "TEXT NOT NULL DEFAULT ''", `UPDATE operations SET target=COALESCE(json_extract(doc,'$.target'),'')`},
		{"operations", "done_at", "INTEGER", `UPDATE operations SET done_at=?1 WHERE state IN ('succeeded','failed','cancelled')`},
		{"events", "created_at", "INTEGER", `UPDATE events SET created_at=?1`},
	} {
		added, err := addColumn(ctx, tx, c.table, c.col, c.def)
		if err != nil {
			return fmt.Errorf("add %s.%s: %w", c.table, c.col, err)
		}
		if added {
			var args []any
			if strings.Contains(c.backfill, "?1") {
				args = []any{now}
			}
			if _, err := tx.ExecContext(ctx, c.backfill, args...); err != nil {
				return fmt.Errorf("backfill %s.%s: %w", c.table, c.col, err)
			}
		}
	}
	if _, err := tx.ExecContext(ctx, `
CREATE INDEX IF NOT EXISTS sandboxes_ended ON sandboxes(ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS operations_done ON operations(done_at) WHERE done_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS operations_open_target ON operations(target) WHERE done_at IS NULL;
CREATE INDEX IF NOT EXISTS events_created ON events(created_at);`); err != nil {
		return err
	}
	return tx.Commit()
}

// sandboxEnded is ended_at for a sandbox record: when it reached its
// terminal state, NULL while it lives.
func sandboxEnded(sb core.Sandbox) any {
	if !sb.State.Terminal() {
		return nil
	}
	return timeOrNow(sb.UpdatedAt)
}

// opDone is done_at for an operation record: its last update once it
// finished, NULL before.
func opDone(op core.Operation) any {
	if !op.State.Done() {
		return nil
	}
	return timeOrNow(op.UpdatedAt)
}

func eventTime(e core.Event) int64 { return timeOrNow(e.CreatedAt) }

func timeOrNow(t time.Time) int64 {
	if t.IsZero() {
		return time.Now().UnixNano()
	}
	return t.UnixNano()
}

// pruneQueries delete one batch each: (cutoff, limit) → rows. Each walks
// its time index from the oldest row (TestPrunePlans checks the plans).
var pruneQueries = []struct{ what, sql string }{
	// A snapshot names its source sandbox (forks copy its env and limits,
	// snapshot GC finds the node by it), and so does an operation still
	// running on it: such a sandbox stays.
	{"sandboxes", `DELETE FROM sandboxes WHERE id IN (
  SELECT id FROM sandboxes WHERE ended_at IS NOT NULL AND ended_at < ?
    AND NOT EXISTS (SELECT 1 FROM snapshots WHERE snapshots.sandbox_id = sandboxes.id)
    AND NOT EXISTS (SELECT 1 FROM operations WHERE operations.target = sandboxes.id AND operations.done_at IS NULL)
  ORDER BY ended_at LIMIT ?)`},
	// The operations of a sandbox that still lives stay with it (its
	// create's idempotency key among them).
	{"operations", `DELETE FROM operations WHERE id IN (
  SELECT id FROM operations WHERE done_at IS NOT NULL AND done_at < ?
    AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE sandboxes.id = operations.target AND sandboxes.ended_at IS NULL)
  ORDER BY done_at LIMIT ?)`},
	{"events", `DELETE FROM events WHERE seq IN (
  SELECT seq FROM events WHERE created_at < ? ORDER BY created_at LIMIT ?)`},
}

// PruneEnded deletes up to limit ended sandboxes, finished operations and
// events older than cutoff (see core.Store): one indexed DELETE per kind,
// each its own short transaction.
func (s *Store) PruneEnded(ctx context.Context, cutoff time.Time, limit int) (core.PruneCounts, error) {
	var c core.PruneCounts
	if limit <= 0 {
		return c, nil
	}
	for i, n := range []*int{&c.Sandboxes, &c.Operations, &c.Events} {
		q := pruneQueries[i]
		res, err := s.db.ExecContext(ctx, q.sql, cutoff.UnixNano(), limit)
		if err != nil {
			return c, fmt.Errorf("prune %s: %w", q.what, err)
		}
		rows, _ := res.RowsAffected()
		*n = int(rows)
	}
	return c, nil
}
