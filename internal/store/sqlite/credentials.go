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

var _ core.CredentialStore = (*Store)(nil)

// credentialsSchema is the sealed credential table (core.CredentialStore).
const credentialsSchema = `
CREATE TABLE IF NOT EXISTS credentials (
  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, key_id TEXT NOT NULL,
  wrapped_key BLOB NOT NULL, sealed BLOB NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS credentials_project ON credentials(project_id, id);
`

// InsertCredential implements core.CredentialStore.
func (s *Store) InsertCredential(ctx context.Context, c core.SealedCredential, maxPerProject int) error {
	doc, err := json.Marshal(c.Credential)
	if err != nil {
		return fmt.Errorf("encode credential: %w", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("insert credential: %w", err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM credentials WHERE project_id=?`, c.Credential.ProjectID).Scan(&n); err != nil {
		return fmt.Errorf("insert credential: %w", err)
	}
	if maxPerProject > 0 && n >= maxPerProject {
		return fmt.Errorf("at most %d credentials per project: %w", maxPerProject, core.ErrExhausted)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO credentials(id,project_id,key_id,wrapped_key,sealed,doc) VALUES(?,?,?,?,?,?)`,
		c.Credential.ID, c.Credential.ProjectID, c.KeyID, c.WrappedKey, c.Sealed, string(doc)); err != nil {
		if strings.Contains(err.Error(), "UNIQUE constraint") {
			return fmt.Errorf("credential %s: %w", c.Credential.ID, core.ErrConflict)
		}
		return fmt.Errorf("insert credential: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("insert credential: %w", err)
	}
	return nil
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
	c, err := scanCredential(s.db.QueryRowContext(ctx, `SELECT key_id,wrapped_key,sealed,doc FROM credentials WHERE id=? AND (?='' OR project_id=?)`,
		id, projectID, projectID))
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("credential %s: %w", id, core.ErrNotFound)
	}
	if err != nil {
		return c, fmt.Errorf("get credential: %w", err)
	}
	return c, nil
}

// ListCredentialRecords implements core.CredentialStore.
func (s *Store) ListCredentialRecords(ctx context.Context, projectID, afterID string, limit int) ([]core.SealedCredential, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT key_id,wrapped_key,sealed,doc FROM credentials WHERE (?='' OR project_id=?) AND id>? ORDER BY id LIMIT ?`,
		projectID, projectID, afterID, limit)
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
	res, err := s.db.ExecContext(ctx, `DELETE FROM credentials WHERE id=? AND project_id=?`, id, projectID)
	if err != nil {
		return fmt.Errorf("delete credential: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("credential %s: %w", id, core.ErrNotFound)
	}
	return nil
}

// RewrapCredential implements core.CredentialStore.
func (s *Store) RewrapCredential(ctx context.Context, id, fromKeyID, toKeyID string, wrapped []byte) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE credentials SET key_id=?, wrapped_key=? WHERE id=? AND key_id=?`, toKeyID, wrapped, id, fromKeyID)
	if err != nil {
		return false, fmt.Errorf("rewrap credential: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}
