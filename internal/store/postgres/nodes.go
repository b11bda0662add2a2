package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space/internal/core"
)

var (
	_ core.NodeStore       = (*Store)(nil)
	_ core.OwnedOperations = (*Store)(nil)
	_ core.NodeDrainStore  = (*Store)(nil)
)

// PutNode implements core.NodeStore.
func (s *Store) PutNode(ctx context.Context, n core.NodeRecord) (core.NodeRecord, error) {
	n.State = core.NodeReady
	n.StateReason = ""
	doc, err := json.Marshal(n)
	if err != nil {
		return core.NodeRecord{}, fmt.Errorf("encode node: %w", err)
	}
	var prev core.NodeRecord
	err = s.withTx(ctx, func(tx pgx.Tx) error {
		var raw string
		switch err := tx.QueryRow(ctx, `SELECT doc FROM nodes WHERE name=$1 FOR UPDATE`, n.Name).Scan(&raw); {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		default:
			if err := json.Unmarshal([]byte(raw), &prev); err != nil {
				return fmt.Errorf("decode node: %w", err)
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO nodes(name,kind,state,heartbeat_at,doc) VALUES($1,$2,$3,$4,$5)
			ON CONFLICT (name) DO UPDATE SET kind=excluded.kind, state=excluded.state, heartbeat_at=excluded.heartbeat_at, doc=excluded.doc`,
			n.Name, n.Kind, n.State, n.HeartbeatAt.UnixNano(), string(doc))
		return err
	})
	if err != nil {
		return core.NodeRecord{}, fmt.Errorf("put node: %w", err)
	}
	return prev, nil
}

// ListNodes implements core.NodeStore.
func (s *Store) ListNodes(ctx context.Context) ([]core.NodeRecord, error) {
	rows, err := s.pool.Query(ctx, `SELECT n.doc, d.drained_at FROM nodes n LEFT JOIN node_drains d ON d.name = n.name ORDER BY n.name`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	out := []core.NodeRecord{}
	for rows.Next() {
		var raw string
		var drained *int64
		if err := rows.Scan(&raw, &drained); err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		var at int64
		if drained != nil {
			at = *drained
		}
		n, err := core.DecodeNodeRecord(raw, at, drained != nil)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// MarkNodeLost implements core.NodeStore: one conditional update, so of
// several servers racing exactly one gets true.
func (s *Store) MarkNodeLost(ctx context.Context, name string, staleBefore time.Time, reason string) (bool, error) {
	var done bool
	err := s.withTx(ctx, func(tx pgx.Tx) error {
		var raw string
		err := tx.QueryRow(ctx, `SELECT doc FROM nodes WHERE name=$1 AND state=$2 AND heartbeat_at<$3 FOR UPDATE`,
			name, core.NodeReady, staleBefore.UnixNano()).Scan(&raw)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		var n core.NodeRecord
		if err := json.Unmarshal([]byte(raw), &n); err != nil {
			return fmt.Errorf("decode node: %w", err)
		}
		n.State, n.StateReason = core.NodeLost, reason
		doc, err := json.Marshal(n)
		if err != nil {
			return fmt.Errorf("encode node: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE nodes SET state=$1, doc=$2 WHERE name=$3`, n.State, string(doc), name); err != nil {
			return err
		}
		done = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("mark node lost: %w", err)
	}
	return done, nil
}

// DeleteNode implements core.NodeStore.
func (s *Store) DeleteNode(ctx context.Context, name string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM nodes WHERE name=$1`, name); err != nil {
		return fmt.Errorf("delete node: %w", err)
	}
	return nil
}

// UnfinishedOperationsOf implements core.OwnedOperations: the pending and
// running operations that the server named owner created.
func (s *Store) UnfinishedOperationsOf(ctx context.Context, owner string) ([]core.Operation, error) {
	if owner == "" {
		return nil, fmt.Errorf("unfinished operations: empty owner: %w", core.ErrInvalid)
	}
	rows, err := s.pool.Query(ctx, `SELECT doc FROM operations WHERE state IN ('pending','running') AND owner=$1 ORDER BY id`, owner)
	if err != nil {
		return nil, fmt.Errorf("unfinished operations of %s: %w", owner, err)
	}
	defer rows.Close()
	var out []core.Operation
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("scan operation: %w", err)
		}
		op, err := decodeOp(doc)
		if err != nil {
			return nil, err
		}
		out = append(out, op)
	}
	return out, rows.Err()
}

// SetNodeDrained implements core.NodeDrainStore.
func (s *Store) SetNodeDrained(ctx context.Context, name string, drained bool, at time.Time) error {
	q, args := `DELETE FROM node_drains WHERE name=$1`, []any{name}
	if drained {
		q, args = `INSERT INTO node_drains(name, drained_at) VALUES($1,$2) ON CONFLICT (name) DO NOTHING`, []any{name, at.UnixNano()}
	}
	if _, err := s.pool.Exec(ctx, q, args...); err != nil {
		return fmt.Errorf("set node %s drained=%v: %w", name, drained, err)
	}
	return nil
}
