package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

var (
	_ core.NodeStore      = (*Store)(nil)
	_ core.NodeDrainStore = (*Store)(nil)
)

// PutNode implements core.NodeStore.
func (s *Store) PutNode(ctx context.Context, n core.NodeRecord) (core.NodeRecord, error) {
	n.State = core.NodeReady
	n.StateReason = ""
	doc, err := json.Marshal(n)
	if err != nil {
		return core.NodeRecord{}, fmt.Errorf("encode node: %w", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return core.NodeRecord{}, fmt.Errorf("put node: %w", err)
	}
	defer tx.Rollback()
	var prev core.NodeRecord
	var raw string
	switch err := tx.QueryRowContext(ctx, `SELECT doc FROM nodes WHERE name=?`, n.Name).Scan(&raw); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return core.NodeRecord{}, fmt.Errorf("put node: %w", err)
	default:
		if err := json.Unmarshal([]byte(raw), &prev); err != nil {
			return core.NodeRecord{}, fmt.Errorf("decode node: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO nodes(name,kind,state,heartbeat_at,doc) VALUES(?,?,?,?,?)
		ON CONFLICT(name) DO UPDATE SET kind=excluded.kind, state=excluded.state, heartbeat_at=excluded.heartbeat_at, doc=excluded.doc`,
		n.Name, n.Kind, n.State, n.HeartbeatAt.UnixNano(), string(doc)); err != nil {
		return core.NodeRecord{}, fmt.Errorf("put node: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return core.NodeRecord{}, fmt.Errorf("put node: %w", err)
	}
	return prev, nil
}

// ListNodes implements core.NodeStore.
func (s *Store) ListNodes(ctx context.Context) ([]core.NodeRecord, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT n.doc, d.drained_at FROM nodes n LEFT JOIN node_drains d ON d.name = n.name ORDER BY n.name`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	out := []core.NodeRecord{}
	for rows.Next() {
		var raw string
		var drained sql.NullInt64
		if err := rows.Scan(&raw, &drained); err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		n, err := core.DecodeNodeRecord(raw, drained.Int64, drained.Valid)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// MarkNodeLost implements core.NodeStore.
func (s *Store) MarkNodeLost(ctx context.Context, name string, staleBefore time.Time, reason string) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("mark node lost: %w", err)
	}
	defer tx.Rollback()
	var raw string
	err = tx.QueryRowContext(ctx, `SELECT doc FROM nodes WHERE name=? AND state=? AND heartbeat_at<?`,
		name, core.NodeReady, staleBefore.UnixNano()).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("mark node lost: %w", err)
	}
	var n core.NodeRecord
	if err := json.Unmarshal([]byte(raw), &n); err != nil {
		return false, fmt.Errorf("decode node: %w", err)
	}
	n.State, n.StateReason = core.NodeLost, reason
	doc, err := json.Marshal(n)
	if err != nil {
		return false, fmt.Errorf("encode node: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state=?, doc=? WHERE name=?`, n.State, string(doc), name); err != nil {
		return false, fmt.Errorf("mark node lost: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("mark node lost: %w", err)
	}
	return true, nil
}

// DeleteNode implements core.NodeStore.
func (s *Store) DeleteNode(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM nodes WHERE name=?`, name); err != nil {
		return fmt.Errorf("delete node: %w", err)
	}
	return nil
}

// SetNodeDrained implements core.NodeDrainStore.
func (s *Store) SetNodeDrained(ctx context.Context, name string, drained bool, at time.Time) error {
	q, args := `DELETE FROM node_drains WHERE name=?`, []any{name}
	if drained {
		q, args = `INSERT INTO node_drains(name, drained_at) VALUES(?,?) ON CONFLICT(name) DO NOTHING`, []any{name, at.UnixNano()}
	}
	if _, err := s.db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("set node %s drained=%v: %w", name, drained, err)
	}
	return nil
}
