package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// migrations returns the schema steps, applied in order, each once,
// recorded in space_schema. Never edit one that has shipped: append a new one.
func migrations() []string {
	return []string{
		// 1: the tables of core.Store. Keys are COLLATE "C" so that ordering and
		// "id > after" pagination are bytewise, as on SQLite, whatever the
		// database's locale. Times are Unix nanoseconds, as on SQLite.
		`
CREATE TABLE IF NOT EXISTS meta (key TEXT COLLATE "C" PRIMARY KEY, val BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
  id TEXT COLLATE "C" PRIMARY KEY, project_id TEXT COLLATE "C" NOT NULL, name TEXT NOT NULL, hash BYTEA NOT NULL,
  created_at BIGINT NOT NULL, revoked_at BIGINT);
CREATE INDEX IF NOT EXISTS api_keys_project ON api_keys(project_id, created_at);
CREATE TABLE IF NOT EXISTS sandboxes (
  id TEXT COLLATE "C" PRIMARY KEY, project_id TEXT COLLATE "C" NOT NULL, state TEXT NOT NULL,
  node TEXT NOT NULL DEFAULT '', expires_at BIGINT, metadata JSONB NOT NULL DEFAULT '{}', doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sandboxes_project ON sandboxes(project_id, id);
CREATE INDEX IF NOT EXISTS sandboxes_expiry ON sandboxes(state, expires_at);
CREATE INDEX IF NOT EXISTS sandboxes_metadata ON sandboxes USING GIN (metadata jsonb_path_ops);
CREATE TABLE IF NOT EXISTS operations (
  id TEXT COLLATE "C" PRIMARY KEY, project_id TEXT COLLATE "C" NOT NULL, state TEXT NOT NULL,
  idem_key TEXT COLLATE "C", owner TEXT NOT NULL DEFAULT '', doc TEXT NOT NULL,
  UNIQUE (project_id, idem_key));
CREATE INDEX IF NOT EXISTS operations_unfinished ON operations(owner) WHERE state IN ('pending','running');
CREATE TABLE IF NOT EXISTS event_seq (id INT PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL);
INSERT INTO event_seq(id, seq) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS events (
  seq BIGINT PRIMARY KEY, project_id TEXT COLLATE "C" NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_project ON events(project_id, seq);
CREATE TABLE IF NOT EXISTS snapshots (
  id TEXT COLLATE "C" PRIMARY KEY, project_id TEXT COLLATE "C" NOT NULL, sandbox_id TEXT COLLATE "C" NOT NULL,
  parent_id TEXT COLLATE "C", state TEXT NOT NULL, created_at BIGINT NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS snapshots_order ON snapshots(created_at, id);
CREATE INDEX IF NOT EXISTS snapshots_parent ON snapshots(parent_id);
`,
		// 2: the node registry (core.NodeStore) of scaled-out clusters.
		`
CREATE TABLE IF NOT EXISTS nodes (
  name TEXT COLLATE "C" PRIMARY KEY, kind TEXT NOT NULL, state TEXT NOT NULL, heartbeat_at BIGINT NOT NULL, doc TEXT NOT NULL);
`,
		// 3: operator (admin) keys.
		`ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS admin BOOLEAN NOT NULL DEFAULT false;`,
		// 4: retention (PruneEnded): indexed times of a sandbox's end, an
		// operation's finish and an event's store, and an operation's
		// target. What had already ended counts as ended at the upgrade.
		`
ALTER TABLE sandboxes ADD COLUMN IF NOT EXISTS ended_at BIGINT;
ALTER TABLE operations ADD COLUMN IF NOT EXISTS target TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE operations ADD COLUMN IF NOT EXISTS done_at BIGINT;
ALTER TABLE events ADD COLUMN IF NOT EXISTS created_at BIGINT;
UPDATE sandboxes SET ended_at = (extract(epoch FROM now()) * 1e9)::bigint
  WHERE ended_at IS NULL AND state IN ('deleted','failed','lost');
UPDATE operations SET target = COALESCE(doc::jsonb->>'target', ''),
  done_at = CASE WHEN state IN ('succeeded','failed','cancelled') THEN (extract(epoch FROM now()) * 1e9)::bigint END;
UPDATE events SET created_at = (extract(epoch FROM now()) * 1e9)::bigint WHERE created_at IS NULL;
CREATE INDEX IF NOT EXISTS sandboxes_ended ON sandboxes(ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS operations_done ON operations(done_at) WHERE done_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS operations_open_target ON operations(target) WHERE done_at IS NULL;
CREATE INDEX IF NOT EXISTS events_created ON events(created_at);
CREATE INDEX IF NOT EXISTS snapshots_sandbox ON snapshots(sandbox_id);
`,
		// 5: egress credentials shared by the replicas
		// (core.CredentialStore): the binding in clear, the secret sealed
		// under a per-record data key wrapped by an operator key that is
		// not in the database.
		`
CREATE TABLE IF NOT EXISTS credentials (
  id TEXT COLLATE "C" PRIMARY KEY, project_id TEXT COLLATE "C" NOT NULL, key_id TEXT NOT NULL,
  wrapped_key BYTEA NOT NULL, sealed BYTEA NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS credentials_project ON credentials(project_id, id);
`,
		// 6: drained nodes (core.NodeDrainStore), apart from the
		// heartbeat records so a restart keeps a node drained.
		`CREATE TABLE IF NOT EXISTS node_drains (name TEXT COLLATE "C" PRIMARY KEY, drained_at BIGINT NOT NULL);`,
	}
}

// migrateLock is the advisory lock key that serialises migrations of
// replicas starting at once ("space" in ASCII).
const migrateLock = 0x7370616365

// migrate brings the schema up to date. It is idempotent and safe to run
// from several servers at once: one transaction, under an advisory lock.
func (s *Store) migrate(ctx context.Context) error {
	err := s.withTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS space_schema (version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var have int
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM space_schema`).Scan(&have); err != nil {
			return err
		}
		steps := migrations()
		if have > len(steps) {
			return fmt.Errorf("database schema version %d is newer than this binary's %d", have, len(steps))
		}
		for v := have + 1; v <= len(steps); v++ {
			if _, err := tx.Exec(ctx, steps[v-1]); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO space_schema(version) VALUES($1)`, v); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate postgres: %w", err)
	}
	return nil
}

// SchemaVersion returns the applied schema version.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := s.pool.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM space_schema`).Scan(&v); err != nil {
		return 0, fmt.Errorf("schema version: %w", err)
	}
	return v, nil
}
