package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space/internal/core"
)

// lockParent takes a share lock on a snapshot's parent, so a concurrent
// DeleteSnapshot of the parent (which locks it for update) either sees the
// new child or runs before it.
func lockParent(ctx context.Context, tx pgx.Tx, parent string) error {
	if parent == "" {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT 1 FROM snapshots WHERE id=$1 FOR SHARE`, parent)
	if err != nil {
		return fmt.Errorf("lock parent snapshot: %w", err)
	}
	rows.Close()
	return rows.Err()
}

// CreateSnapshotOp stores a snapshot and its operation atomically.
func (s *Store) CreateSnapshotOp(ctx context.Context, snap core.Snapshot, op core.Operation, idemKey string) (core.Operation, bool, error) {
	doc, err := json.Marshal(snap)
	if err != nil {
		return op, false, fmt.Errorf("encode snapshot: %w", err)
	}
	return s.createWithOp(ctx, op, idemKey, func(tx pgx.Tx) error {
		if err := lockParent(ctx, tx, snap.ParentID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO snapshots(id,project_id,sandbox_id,parent_id,state,created_at,doc) VALUES($1,$2,$3,$4,$5,$6,$7)`,
			snap.ID, snap.ProjectID, snap.SandboxID, nullString(snap.ParentID), string(snap.State), snap.CreatedAt.UnixNano(), string(doc)); err != nil {
			return fmt.Errorf("insert snapshot: %w", err)
		}
		return nil
	})
}

func decodeSnapshot(doc string) (core.Snapshot, error) {
	var sn core.Snapshot
	if err := json.Unmarshal([]byte(doc), &sn); err != nil {
		return sn, fmt.Errorf("decode snapshot: %w", err)
	}
	return sn, nil
}

// GetSnapshot returns a snapshot; projectID "" matches any project.
func (s *Store) GetSnapshot(ctx context.Context, projectID, id string) (core.Snapshot, error) {
	var doc string
	err := s.pool.QueryRow(ctx, `SELECT doc FROM snapshots WHERE id=$1 AND ($2='' OR project_id=$2)`, id, projectID).Scan(&doc)
	if errors.Is(err, pgx.ErrNoRows) {
		return core.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, core.ErrNotFound)
	}
	if err != nil {
		return core.Snapshot{}, fmt.Errorf("get snapshot: %w", err)
	}
	return decodeSnapshot(doc)
}

// ListSnapshots lists snapshots oldest first, filtered and paginated.
func (s *Store) ListSnapshots(ctx context.Context, f core.SnapshotFilter) ([]core.Snapshot, error) {
	var a args
	var q strings.Builder
	q.WriteString(`SELECT doc FROM snapshots WHERE true`)
	if f.ProjectID != "" {
		q.WriteString(` AND project_id=` + a.add(f.ProjectID))
	}
	if f.SandboxID != "" {
		q.WriteString(` AND sandbox_id=` + a.add(f.SandboxID))
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		q.WriteString(` AND state = ANY(` + a.add(states) + `)`)
	}
	if f.After != "" {
		q.WriteString(` AND (created_at, id) > (SELECT created_at, id FROM snapshots WHERE id=` + a.add(f.After) + `)`)
	}
	q.WriteString(` ORDER BY created_at, id`)
	if f.Limit > 0 {
		q.WriteString(` LIMIT ` + a.add(f.Limit))
	}
	rows, err := s.pool.Query(ctx, q.String(), a...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []core.Snapshot
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("scan snapshot: %w", err)
		}
		sn, err := decodeSnapshot(doc)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// UpdateSnapshot applies fn to a snapshot inside a transaction that holds
// its row locked.
func (s *Store) UpdateSnapshot(ctx context.Context, id string, fn func(*core.Snapshot) error) (core.Snapshot, error) {
	var sn core.Snapshot
	err := s.withTx(ctx, func(tx pgx.Tx) error {
		var doc string
		err := tx.QueryRow(ctx, `SELECT doc FROM snapshots WHERE id=$1 FOR UPDATE`, id).Scan(&doc)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("snapshot %s: %w", id, core.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("get snapshot: %w", err)
		}
		if sn, err = decodeSnapshot(doc); err != nil {
			return err
		}
		parent := sn.ParentID
		if err := fn(&sn); err != nil {
			return err
		}
		if sn.ParentID != parent {
			if err := lockParent(ctx, tx, sn.ParentID); err != nil {
				return err
			}
		}
		nd, err := json.Marshal(sn)
		if err != nil {
			return fmt.Errorf("encode snapshot: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE snapshots SET parent_id=$1, state=$2, doc=$3 WHERE id=$4`,
			nullString(sn.ParentID), string(sn.State), string(nd), id); err != nil {
			return fmt.Errorf("update snapshot: %w", err)
		}
		return nil
	})
	return sn, err
}

// DeleteSnapshot removes a snapshot no live snapshot depends on.
func (s *Store) DeleteSnapshot(ctx context.Context, projectID, id string) error {
	return s.withTx(ctx, func(tx pgx.Tx) error {
		// Lock the row first: a child being created waits for this
		// transaction, and one created before it is counted below.
		rows, err := tx.Query(ctx, `SELECT 1 FROM snapshots WHERE id=$1 FOR UPDATE`, id)
		if err != nil {
			return fmt.Errorf("delete snapshot: %w", err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("delete snapshot: %w", err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM snapshots WHERE parent_id=$1 AND state IN ('creating','ready','retained')`, id).Scan(&n); err != nil {
			return fmt.Errorf("delete snapshot: %w", err)
		}
		if n > 0 {
			return fmt.Errorf("snapshot %s has %d dependent snapshots: %w", id, n, core.ErrConflict)
		}
		tag, err := tx.Exec(ctx, `DELETE FROM snapshots WHERE id=$1 AND ($2='' OR project_id=$2)`, id, projectID)
		if err != nil {
			return fmt.Errorf("delete snapshot: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("snapshot %s: %w", id, core.ErrNotFound)
		}
		return nil
	})
}
