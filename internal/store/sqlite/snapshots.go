package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/space-sandbox/space/internal/core"
)

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// CreateSnapshotOp stores a snapshot and its operation atomically.
func (s *Store) CreateSnapshotOp(ctx context.Context, snap core.Snapshot, op core.Operation, idemKey string) (core.Operation, bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return op, false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if idemKey != "" {
		existing, err := getOp(ctx, s.q(tx), op.ProjectID, "", idemKey)
		if err == nil {
			return existing, false, nil
		}
		if !errors.Is(err, core.ErrNotFound) {
			return op, false, err
		}
	}
	doc, err := json.Marshal(snap)
	if err != nil {
		return op, false, fmt.Errorf("encode snapshot: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots(id,project_id,sandbox_id,parent_id,state,created_at,doc) VALUES(?,?,?,?,?,?,?)`,
		snap.ID, snap.ProjectID, snap.SandboxID, nullString(snap.ParentID), string(snap.State), unixNano(snap.CreatedAt), string(doc)); err != nil {
		return op, false, fmt.Errorf("insert snapshot: %w", err)
	}
	if err := insertOp(ctx, s.q(tx), op, idemKey); err != nil {
		return op, false, err
	}
	if err := tx.Commit(); err != nil {
		return op, false, fmt.Errorf("commit: %w", err)
	}
	return op, true, nil
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
	err := s.db.QueryRowContext(ctx, `SELECT doc FROM snapshots WHERE id=? AND (?='' OR project_id=?)`, id, projectID, projectID).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return core.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, core.ErrNotFound)
	}
	if err != nil {
		return core.Snapshot{}, fmt.Errorf("get snapshot: %w", err)
	}
	return decodeSnapshot(doc)
}

// ListSnapshots lists snapshots oldest first, filtered and paginated.
func (s *Store) ListSnapshots(ctx context.Context, f core.SnapshotFilter) ([]core.Snapshot, error) {
	var q strings.Builder
	q.WriteString(`SELECT doc FROM snapshots WHERE 1=1`)
	var args []any
	if f.ProjectID != "" {
		q.WriteString(` AND project_id=?`)
		args = append(args, f.ProjectID)
	}
	if f.SandboxID != "" {
		q.WriteString(` AND sandbox_id=?`)
		args = append(args, f.SandboxID)
	}
	if len(f.States) > 0 {
		q.WriteString(` AND state IN (?` + strings.Repeat(",?", len(f.States)-1) + `)`)
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	if f.After != "" {
		q.WriteString(` AND (created_at, id) > (SELECT created_at, id FROM snapshots WHERE id=?)`)
		args = append(args, f.After)
	}
	q.WriteString(` ORDER BY created_at, id`)
	if f.Limit > 0 {
		q.WriteString(` LIMIT ?`)
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q.String(), args...)
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

// UpdateSnapshot applies fn to a snapshot inside a transaction.
func (s *Store) UpdateSnapshot(ctx context.Context, id string, fn func(*core.Snapshot) error) (core.Snapshot, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return core.Snapshot{}, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	var doc string
	err = tx.QueryRowContext(ctx, `SELECT doc FROM snapshots WHERE id=?`, id).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return core.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, core.ErrNotFound)
	}
	if err != nil {
		return core.Snapshot{}, fmt.Errorf("get snapshot: %w", err)
	}
	sn, err := decodeSnapshot(doc)
	if err != nil {
		return sn, err
	}
	if err := fn(&sn); err != nil {
		return sn, err
	}
	nd, err := json.Marshal(sn)
	if err != nil {
		return sn, fmt.Errorf("encode snapshot: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET parent_id=?, state=?, doc=? WHERE id=?`,
		nullString(sn.ParentID), string(sn.State), string(nd), id); err != nil {
		return sn, fmt.Errorf("update snapshot: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return sn, fmt.Errorf("commit: %w", err)
	}
	return sn, nil
}

// DeleteSnapshot removes a snapshot no live snapshot depends on.
func (s *Store) DeleteSnapshot(ctx context.Context, projectID, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM snapshots WHERE parent_id=? AND state IN ('creating','ready','retained')`, id).Scan(&n); err != nil {
		return fmt.Errorf("delete snapshot: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("snapshot %s has %d dependent snapshots: %w", id, n, core.ErrConflict)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE id=? AND (?='' OR project_id=?)`, id, projectID, projectID)
	if err != nil {
		return fmt.Errorf("delete snapshot: %w", err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("snapshot %s: %w", id, core.ErrNotFound)
	}
	return tx.Commit()
}
