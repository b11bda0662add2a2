// Package sqlite is the embedded default Store, on a single SQLite file in
// WAL mode (pure Go driver, no cgo).
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/core"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Store implements core.Store on SQLite.
type Store struct {
	db    *sql.DB
	stmts *stmtCache
	batch batcher // group commit of the hot writes (write)
}

var (
	_ core.Store           = (*Store)(nil)
	_ core.OperationEvents = (*Store)(nil)
	_ core.RecordEvents    = (*Store)(nil)
)

const schema = `
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, val BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, name TEXT NOT NULL, hash BLOB NOT NULL,
  created_at INTEGER NOT NULL, revoked_at INTEGER);
CREATE TABLE IF NOT EXISTS sandboxes (
  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, state TEXT NOT NULL,
  expires_at INTEGER, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sandboxes_project ON sandboxes(project_id, id);
CREATE INDEX IF NOT EXISTS sandboxes_expiry ON sandboxes(state, expires_at);
CREATE TABLE IF NOT EXISTS operations (
  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, state TEXT NOT NULL,
  idem_key TEXT, doc TEXT NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS operations_idem ON operations(project_id, idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS operations_state ON operations(state);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, project_id TEXT NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_project ON events(project_id, seq);
CREATE TABLE IF NOT EXISTS snapshots (
  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, sandbox_id TEXT NOT NULL, parent_id TEXT,
  state TEXT NOT NULL, created_at INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS snapshots_order ON snapshots(created_at, id);
CREATE INDEX IF NOT EXISTS snapshots_parent ON snapshots(parent_id);
CREATE INDEX IF NOT EXISTS snapshots_sandbox ON snapshots(sandbox_id);
CREATE TABLE IF NOT EXISTS nodes (
  name TEXT PRIMARY KEY, kind TEXT NOT NULL, state TEXT NOT NULL, heartbeat_at INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS node_drains (name TEXT PRIMARY KEY, drained_at INTEGER NOT NULL);
`

// The store's hot queries, prepared once at Open (see stmtCache).
const (
	qGetAPIKey     = `SELECT id,project_id,name,hash,created_at,revoked_at,admin FROM api_keys WHERE id=?`
	qInsertSandbox = `INSERT INTO sandboxes(id,project_id,state,expires_at,ended_at,doc) VALUES(?,?,?,?,?,?)`
	qGetSandbox    = `SELECT doc FROM sandboxes WHERE id=? AND (?='' OR project_id=?)`
	qSandboxDoc    = `SELECT doc FROM sandboxes WHERE id=?`
	qUpdateSandbox = `UPDATE sandboxes SET state=?, expires_at=?, ended_at=?, doc=? WHERE id=?`
	qInsertOp      = `INSERT INTO operations(id,project_id,state,idem_key,target,done_at,doc) VALUES(?,?,?,?,?,?,?)`
	qOpByKey       = `SELECT doc FROM operations WHERE project_id=? AND idem_key=?`
	qOpByID        = `SELECT doc FROM operations WHERE id=? AND (?='' OR project_id=?)`
	qUpdateOp      = `UPDATE operations SET state=?, done_at=?, doc=? WHERE id=?`
	qInsertEvent   = `INSERT INTO events(project_id,created_at,doc) VALUES(?,?,?)`
	qEventsAfter   = `SELECT seq, doc FROM events WHERE project_id=? AND seq > ? ORDER BY seq LIMIT ?`
	qLatestSeq     = `SELECT MAX(seq) FROM events WHERE project_id=?`
)

// hotQueries are prepared at Open, so transactions can use them.
var hotQueries = []string{qSavepoint, qRelease, qRollbackTo, qGetAPIKey, qInsertSandbox, qGetSandbox, qSandboxDoc, qUpdateSandbox, qInsertOp, qOpByKey, qOpByID, qUpdateOp, qInsertEvent, qEventsAfter, qLatestSeq}

// Open opens (creating if needed) the database file at path.
func Open(ctx context.Context, path string) (*Store, error) {
	// The file holds the session-token signing key and the credential
	// encryption key: owner only. SQLite gives its -wal and -shm files the
	// main file's mode.
	if !strings.HasPrefix(path, ":") {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open sqlite %s: %w", path, err)
		}
		f.Close()
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("open sqlite %s: %w", path, err)
			}
		}
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	// One connection serialises writers; SQLite allows one writer anyway and
	// this avoids SQLITE_BUSY storms under concurrent creates.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate sqlite %s: %w", path, err)
	}
	if _, err := addColumn(ctx, db, "api_keys", "admin", "INTEGER NOT NULL DEFAULT 0"); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate sqlite %s: %w", path, err)
	}
	if err := migrateRetention(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate sqlite %s: %w", path, err)
	}
	if _, err := db.ExecContext(ctx, credentialsSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate sqlite %s: %w", path, err)
	}
	st := &Store{db: db, stmts: newStmtCache(db)}
	if err := st.stmts.prepareAll(ctx, hotQueries); err != nil {
		st.stmts.close()
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	return st, nil
}

// q runs the hot queries prepared, on the database (tx nil) or in tx.
func (s *Store) q(tx *sql.Tx) prepared { return prepared{c: s.stmts, tx: tx} }

// addColumn adds a column to a table made by an older schema (SQLite has no
// ADD COLUMN IF NOT EXISTS) and reports whether it did.
func addColumn(ctx context.Context, db dbtx, table, col, def string) (bool, error) {
	rows, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, table)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return false, err
		}
		if name == col {
			return false, nil
		}
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	_, err = db.ExecContext(ctx, `ALTER TABLE `+table+` ADD COLUMN `+col+` `+def)
	return err == nil, err
}

// Close closes the database.
func (s *Store) Close() error {
	s.stmts.close()
	return s.db.Close()
}

func unixNano(t time.Time) int64 { return t.UnixNano() }

func nullTime(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixNano()
}

// GetMeta returns a meta value.
func (s *Store) GetMeta(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := s.db.QueryRowContext(ctx, `SELECT val FROM meta WHERE key=?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("meta %q: %w", key, core.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get meta: %w", err)
	}
	return v, nil
}

// PutMetaIfAbsent stores val unless key exists, and returns the stored value.
func (s *Store) PutMetaIfAbsent(ctx context.Context, key string, val []byte) ([]byte, error) {
	if _, err := s.db.ExecContext(ctx, `INSERT OR IGNORE INTO meta(key,val) VALUES(?,?)`, key, val); err != nil {
		return nil, fmt.Errorf("put meta: %w", err)
	}
	return s.GetMeta(ctx, key)
}

// CreateAPIKey stores a key.
func (s *Store) CreateAPIKey(ctx context.Context, k core.APIKey) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys(id,project_id,name,hash,created_at,revoked_at,admin) VALUES(?,?,?,?,?,?,?)`,
		k.ID, k.ProjectID, k.Name, k.Hash, unixNano(k.CreatedAt), nullTime(k.RevokedAt), k.Admin)
	if err != nil {
		return fmt.Errorf("create api key: %w", err)
	}
	return nil
}

func scanKey(row interface{ Scan(...any) error }) (core.APIKey, error) {
	var k core.APIKey
	var created int64
	var revoked sql.NullInt64
	if err := row.Scan(&k.ID, &k.ProjectID, &k.Name, &k.Hash, &created, &revoked, &k.Admin); err != nil {
		return k, err
	}
	k.CreatedAt = time.Unix(0, created).UTC()
	if revoked.Valid {
		t := time.Unix(0, revoked.Int64).UTC()
		k.RevokedAt = &t
	}
	return k, nil
}

// GetAPIKey returns a key by id.
func (s *Store) GetAPIKey(ctx context.Context, id string) (core.APIKey, error) {
	k, err := scanKey(s.q(nil).QueryRowContext(ctx, qGetAPIKey, id))
	if errors.Is(err, sql.ErrNoRows) {
		return k, fmt.Errorf("api key: %w", core.ErrNotFound)
	}
	if err != nil {
		return k, fmt.Errorf("get api key: %w", err)
	}
	return k, nil
}

// ListAPIKeys lists the keys of a project ("" = all projects).
func (s *Store) ListAPIKeys(ctx context.Context, projectID string) ([]core.APIKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id,project_id,name,hash,created_at,revoked_at,admin FROM api_keys WHERE ?='' OR project_id=? ORDER BY created_at`, projectID, projectID)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	var out []core.APIKey
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("scan api key: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeAPIKey marks a key revoked.
func (s *Store) RevokeAPIKey(ctx context.Context, projectID, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET revoked_at=? WHERE id=? AND (?='' OR project_id=?) AND revoked_at IS NULL`,
		unixNano(at), id, projectID, projectID)
	if err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("api key %s: %w", id, core.ErrNotFound)
	}
	return nil
}

func sandboxExpiry(sb core.Sandbox) any {
	if sb.ExpiresAt == nil {
		return nil
	}
	return sb.ExpiresAt.UnixNano()
}

// CreateSandboxOp stores a sandbox and its create operation atomically.
func (s *Store) CreateSandboxOp(ctx context.Context, sb core.Sandbox, op core.Operation, idemKey string) (core.Operation, bool, error) {
	return s.CreateSandboxOpEvents(ctx, sb, op, idemKey, nil)
}

// CreateSandboxOpEvents implements core.RecordEvents.
func (s *Store) CreateSandboxOpEvents(ctx context.Context, sb core.Sandbox, op core.Operation, idemKey string, evs []core.Event) (core.Operation, bool, error) {
	doc, err := json.Marshal(sb)
	if err != nil {
		return op, false, fmt.Errorf("encode sandbox: %w", err)
	}
	out, created := op, false
	err = s.write(ctx, func(ctx context.Context, q prepared) error {
		if existing, ok, err := replayOf(ctx, q, op.ProjectID, idemKey); err != nil || ok {
			out = existing
			return err
		}
		if _, err := q.ExecContext(ctx, qInsertSandbox,
			sb.ID, sb.ProjectID, string(sb.State), sandboxExpiry(sb), sandboxEnded(sb), string(doc)); err != nil {
			return fmt.Errorf("insert sandbox: %w", err)
		}
		if err := insertOp(ctx, q, op, idemKey); err != nil {
			return err
		}
		for _, e := range evs {
			if _, err := appendEvent(ctx, q, e); err != nil {
				return err
			}
		}
		created = true
		return nil
	})
	if err != nil {
		return op, false, err
	}
	return out, created, nil
}

// GetSandbox returns a sandbox; projectID "" matches any project.
func (s *Store) GetSandbox(ctx context.Context, projectID, id string) (core.Sandbox, error) {
	var doc string
	err := s.q(nil).QueryRowContext(ctx, qGetSandbox, id, projectID, projectID).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return core.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, core.ErrNotFound)
	}
	if err != nil {
		return core.Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	var sb core.Sandbox
	if err := json.Unmarshal([]byte(doc), &sb); err != nil {
		return sb, fmt.Errorf("decode sandbox: %w", err)
	}
	return sb, nil
}

// ListSandboxes lists sandboxes ordered by id, filtered and paginated.
func (s *Store) ListSandboxes(ctx context.Context, f core.SandboxFilter) ([]core.Sandbox, error) {
	q := strings.Builder{}
	q.WriteString(`SELECT doc FROM sandboxes WHERE id > ?`)
	args := []any{f.After}
	if f.ProjectID != "" {
		q.WriteString(` AND project_id=?`)
		args = append(args, f.ProjectID)
	}
	if len(f.States) > 0 {
		q.WriteString(` AND state IN (`)
		for i, st := range f.States {
			if i > 0 {
				q.WriteString(",")
			}
			q.WriteString("?")
			args = append(args, string(st))
		}
		q.WriteString(`)`)
	} else {
		q.WriteString(` AND state != 'deleted'`)
	}
	keys := make([]string, 0, len(f.Metadata))
	for k := range f.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.WriteString(` AND json_extract(doc, '$.metadata.' || json_quote(?)) = ?`)
		args = append(args, k, f.Metadata[k])
	}
	q.WriteString(` ORDER BY id`)
	if f.Limit > 0 {
		q.WriteString(` LIMIT ?`)
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []core.Sandbox
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("scan sandbox: %w", err)
		}
		var sb core.Sandbox
		if err := json.Unmarshal([]byte(doc), &sb); err != nil {
			return nil, fmt.Errorf("decode sandbox: %w", err)
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// UpdateSandbox applies fn to a sandbox inside a transaction.
func (s *Store) UpdateSandbox(ctx context.Context, id string, fn func(*core.Sandbox) error) (core.Sandbox, error) {
	return s.UpdateSandboxEvent(ctx, id, fn, nil)
}

// UpdateSandboxEvent implements core.RecordEvents (ev nil: no event).
func (s *Store) UpdateSandboxEvent(ctx context.Context, id string, fn func(*core.Sandbox) error, ev func(core.Sandbox) (core.Event, error)) (core.Sandbox, error) {
	var sb core.Sandbox
	err := s.write(ctx, func(ctx context.Context, q prepared) error {
		sb = core.Sandbox{}
		var doc string
		err := q.QueryRowContext(ctx, qSandboxDoc, id).Scan(&doc)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("sandbox %s: %w", id, core.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("get sandbox: %w", err)
		}
		if err := json.Unmarshal([]byte(doc), &sb); err != nil {
			return fmt.Errorf("decode sandbox: %w", err)
		}
		if err := fn(&sb); err != nil {
			return err
		}
		nd, err := json.Marshal(sb)
		if err != nil {
			return fmt.Errorf("encode sandbox: %w", err)
		}
		if _, err := q.ExecContext(ctx, qUpdateSandbox,
			string(sb.State), sandboxExpiry(sb), sandboxEnded(sb), string(nd), id); err != nil {
			return fmt.Errorf("update sandbox: %w", err)
		}
		if ev != nil {
			e, err := ev(sb)
			if err != nil {
				return err
			}
			if _, err := appendEvent(ctx, q, e); err != nil {
				return err
			}
		}
		return nil
	})
	return sb, err
}

// ExpiredSandboxes lists running sandboxes past their expiry.
func (s *Store) ExpiredSandboxes(ctx context.Context, now time.Time) ([]core.Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT doc FROM sandboxes WHERE state='running' AND expires_at IS NOT NULL AND expires_at < ?`, now.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("expired sandboxes: %w", err)
	}
	defer rows.Close()
	var out []core.Sandbox
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("scan sandbox: %w", err)
		}
		var sb core.Sandbox
		if err := json.Unmarshal([]byte(doc), &sb); err != nil {
			return nil, fmt.Errorf("decode sandbox: %w", err)
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

type execer interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

func insertOp(ctx context.Context, x execer, op core.Operation, idemKey string) error {
	doc, err := core.EncodeOperation(op)
	if err != nil {
		return fmt.Errorf("encode operation: %w", err)
	}
	var key any
	if idemKey != "" {
		key = idemKey
	}
	if _, err := x.ExecContext(ctx, qInsertOp,
		op.ID, op.ProjectID, string(op.State), key, op.Target, opDone(op), string(doc)); err != nil {
		return fmt.Errorf("insert operation: %w", err)
	}
	return nil
}

func getOp(ctx context.Context, x execer, projectID, id, idemKey string) (core.Operation, error) {
	var doc string
	var err error
	if idemKey != "" {
		err = x.QueryRowContext(ctx, qOpByKey, projectID, idemKey).Scan(&doc)
	} else {
		err = x.QueryRowContext(ctx, qOpByID, id, projectID, projectID).Scan(&doc)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return core.Operation{}, fmt.Errorf("operation: %w", core.ErrNotFound)
	}
	if err != nil {
		return core.Operation{}, fmt.Errorf("get operation: %w", err)
	}
	op, err := core.DecodeOperation([]byte(doc))
	if err != nil {
		return op, fmt.Errorf("decode operation: %w", err)
	}
	return op, nil
}

// replayOf returns the operation of the project that already holds
// idemKey, and whether there is one ("" holds none).
func replayOf(ctx context.Context, x execer, projectID, idemKey string) (core.Operation, bool, error) {
	if idemKey == "" {
		return core.Operation{}, false, nil
	}
	existing, err := getOp(ctx, x, projectID, "", idemKey)
	if errors.Is(err, core.ErrNotFound) {
		return core.Operation{}, false, nil
	}
	return existing, err == nil, err
}

// CreateOperation stores an operation, honouring an idempotency key.
func (s *Store) CreateOperation(ctx context.Context, op core.Operation, idemKey string) (core.Operation, bool, error) {
	return s.createOperation(ctx, op, idemKey, nil)
}

// CreateOperationEvent implements core.RecordEvents.
func (s *Store) CreateOperationEvent(ctx context.Context, op core.Operation, idemKey string, e core.Event) (core.Operation, bool, error) {
	return s.createOperation(ctx, op, idemKey, &e)
}

func (s *Store) createOperation(ctx context.Context, op core.Operation, idemKey string, e *core.Event) (core.Operation, bool, error) {
	out, created := op, false
	err := s.write(ctx, func(ctx context.Context, q prepared) error {
		if existing, ok, err := replayOf(ctx, q, op.ProjectID, idemKey); err != nil || ok {
			out = existing
			return err
		}
		if err := insertOp(ctx, q, op, idemKey); err != nil {
			return err
		}
		if e != nil {
			if _, err := appendEvent(ctx, q, *e); err != nil {
				return err
			}
		}
		created = true
		return nil
	})
	if err != nil {
		return op, false, err
	}
	return out, created, nil
}

// GetOperation returns an operation; projectID "" matches any project.
func (s *Store) GetOperation(ctx context.Context, projectID, id string) (core.Operation, error) {
	return getOp(ctx, s.q(nil), projectID, id, "")
}

// UpdateOperation overwrites an operation's record.
func (s *Store) UpdateOperation(ctx context.Context, op core.Operation) error {
	doc, err := core.EncodeOperation(op)
	if err != nil {
		return fmt.Errorf("encode operation: %w", err)
	}
	return s.write(ctx, func(ctx context.Context, q prepared) error {
		return updateOp(ctx, q, op, doc)
	})
}

func updateOp(ctx context.Context, x execer, op core.Operation, doc []byte) error {
	res, err := x.ExecContext(ctx, qUpdateOp, string(op.State), opDone(op), string(doc), op.ID)
	if err != nil {
		return fmt.Errorf("update operation: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("operation %s: %w", op.ID, core.ErrNotFound)
	}
	return nil
}

// UpdateOperationEvent implements core.OperationEvents: the operation's
// update and its event in one transaction (one commit where two separate
// statements made two). Nothing is appended when op has no record.
func (s *Store) UpdateOperationEvent(ctx context.Context, op core.Operation, e core.Event) (core.Event, error) {
	doc, err := core.EncodeOperation(op)
	if err != nil {
		return e, fmt.Errorf("encode operation: %w", err)
	}
	return s.writeEvent(ctx, e, func(ctx context.Context, q prepared) error {
		return updateOp(ctx, q, op, doc)
	})
}

// UnfinishedOperations lists pending and running operations.
func (s *Store) UnfinishedOperations(ctx context.Context) ([]core.Operation, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT doc FROM operations WHERE state IN ('pending','running')`)
	if err != nil {
		return nil, fmt.Errorf("unfinished operations: %w", err)
	}
	defer rows.Close()
	var out []core.Operation
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("scan operation: %w", err)
		}
		op, err := core.DecodeOperation([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("decode operation: %w", err)
		}
		out = append(out, op)
	}
	return out, rows.Err()
}

// AppendEvent stores an event and assigns its sequence number.
func (s *Store) AppendEvent(ctx context.Context, e core.Event) (core.Event, error) {
	return s.writeEvent(ctx, e, nil)
}

// writeEvent runs before (if not nil) and, if it succeeds, appends e, in
// one write; it returns e with its sequence number.
func (s *Store) writeEvent(ctx context.Context, e core.Event, before func(context.Context, prepared) error) (core.Event, error) {
	stored := e
	err := s.write(ctx, func(ctx context.Context, q prepared) error {
		if before != nil {
			if err := before(ctx, q); err != nil {
				return err
			}
		}
		var err error
		stored, err = appendEvent(ctx, q, e)
		return err
	})
	if err != nil {
		return e, err
	}
	return stored, nil
}

// appendEvent inserts e (on the database or in a transaction) and returns
// it with its sequence number.
func appendEvent(ctx context.Context, x execer, e core.Event) (core.Event, error) {
	doc, err := json.Marshal(e)
	if err != nil {
		return e, fmt.Errorf("encode event: %w", err)
	}
	res, err := x.ExecContext(ctx, qInsertEvent, e.ProjectID, eventTime(e), string(doc))
	if err != nil {
		return e, fmt.Errorf("append event: %w", err)
	}
	seq, err := res.LastInsertId()
	if err != nil {
		return e, fmt.Errorf("event seq: %w", err)
	}
	e.Seq = seq
	return e, nil
}

// EventsAfter returns a project's events with seq > after.
func (s *Store) EventsAfter(ctx context.Context, projectID string, after int64, limit int) ([]core.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.q(nil).QueryContext(ctx, qEventsAfter, projectID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	defer rows.Close()
	var out []core.Event
	for rows.Next() {
		var seq int64
		var doc string
		if err := rows.Scan(&seq, &doc); err != nil {
			return nil, fmt.Errorf("scan event: %w", err)
		}
		var e core.Event
		if err := json.Unmarshal([]byte(doc), &e); err != nil {
			return nil, fmt.Errorf("decode event: %w", err)
		}
		e.Seq = seq
		out = append(out, e)
	}
	return out, rows.Err()
}

// LatestEventSeq returns the project's highest event sequence number.
func (s *Store) LatestEventSeq(ctx context.Context, projectID string) (int64, error) {
	var seq sql.NullInt64
	if err := s.q(nil).QueryRowContext(ctx, qLatestSeq, projectID).Scan(&seq); err != nil {
		return 0, fmt.Errorf("latest event: %w", err)
	}
	return seq.Int64, nil
}
