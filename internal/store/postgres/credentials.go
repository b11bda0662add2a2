package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/space-sandbox/space/internal/core"
)

var _ core.CredentialStore = (*Store)(nil)

// InsertCredential implements core.CredentialStore. A transaction lock per
// project makes the count and the insert one step for all replicas.
func (s *Store) InsertCredential(ctx context.Context, c core.SealedCredential, maxPerProject int) error {
	doc, err := json.Marshal(c.Credential)
	if err != nil {
		return fmt.Errorf("encode credential: %w", err)
	}
	return s.withTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('space-credentials:' || $1))`, c.Credential.ProjectID); err != nil {
			return fmt.Errorf("insert credential: %w", err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM credentials WHERE project_id=$1`, c.Credential.ProjectID).Scan(&n); err != nil {
			return fmt.Errorf("insert credential: %w", err)
		}
		if maxPerProject > 0 && n >= maxPerProject {
			return fmt.Errorf("at most %d credentials per project: %w", maxPerProject, core.ErrExhausted)
		}
		_, err := tx.Exec(ctx, `INSERT INTO credentials(id,project_id,key_id,wrapped_key,sealed,doc) VALUES($1,$2,$3,$4,$5,$6)`,
			c.Credential.ID, c.Credential.ProjectID, c.KeyID, c.WrappedKey, c.Sealed, string(doc))
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" {
			return fmt.Errorf("credential %s: %w", c.Credential.ID, core.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("insert credential: %w", err)
		}
		return nil
	})
}

func scanCredential(sc interface{ Scan(...any) error }) (core.SealedCredential, error) {
	var c core.SealedCredential
	var doc string
	if err := sc.Scan(&c.KeyID, &c.WrappedKey, &c.Sealed, &doc); err != nil {
		return c, err
	}
	if err := json.Unmarshal([]byte(doc), &c.Credential); err != nil {
		return c, fmt.Errorf("decode credential: %w", err)
	}
	return c, nil
}

// GetCredentialRecord implements core.CredentialStore.
func (s *Store) GetCredentialRecord(ctx context.Context, projectID, id string) (core.SealedCredential, error) {
	c, err := scanCredential(s.pool.QueryRow(ctx, `SELECT key_id,wrapped_key,sealed,doc FROM credentials WHERE id=$1 AND ($2='' OR project_id=$2)`,
		id, projectID))
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("credential %s: %w", id, core.ErrNotFound)
	}
	if err != nil {
		return c, fmt.Errorf("get credential: %w", err)
	}
	return c, nil
}

// ListCredentialRecords implements core.CredentialStore.
func (s *Store) ListCredentialRecords(ctx context.Context, projectID, afterID string, limit int) ([]core.SealedCredential, error) {
	rows, err := s.pool.Query(ctx, `SELECT key_id,wrapped_key,sealed,doc FROM credentials WHERE ($1='' OR project_id=$1) AND id>$2 ORDER BY id LIMIT $3`,
		projectID, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list credentials: %w", err)
	}
	defer rows.Close()
	out := []core.SealedCredential{}
	for rows.Next() {
		c, err := scanCredential(rows)
		if err != nil {
			return nil, fmt.Errorf("list credentials: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// DeleteCredentialRecord implements core.CredentialStore.
func (s *Store) DeleteCredentialRecord(ctx context.Context, projectID, id string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM credentials WHERE id=$1 AND project_id=$2`, id, projectID)
	if err != nil {
		return fmt.Errorf("delete credential: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("credential %s: %w", id, core.ErrNotFound)
	}
	return nil
}

// RewrapCredential implements core.CredentialStore.
func (s *Store) RewrapCredential(ctx context.Context, id, fromKeyID, toKeyID string, wrapped []byte) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE credentials SET key_id=$1, wrapped_key=$2 WHERE id=$3 AND key_id=$4`, toKeyID, wrapped, id, fromKeyID)
	if err != nil {
		return false, fmt.Errorf("rewrap credential: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}
