// Package postgres is the Store for several `space server` replicas sharing
// one PostgreSQL database. It passes the same conformance suite as the
// embedded SQLite store (internal/store/storetest) and adds what replicas
// need: events fan out to every replica over LISTEN/NOTIFY (WatchEvents),
// and a replica's recovery and reaper only see its own work (Options.Node).
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/space-sandbox/space/internal/core"
)

// EventChannel is the NOTIFY channel every AppendEvent signals, with the
// event's project id as payload.
const EventChannel = "space_events"

// Options configure a Store.
type Options struct {
	// Node names the node (and server) this store serves. When set,
	// operations it creates are stamped with it, UnfinishedOperations lists
	// only those, and ExpiredSandboxes only sandboxes on this node, so one
	// replica's crash recovery or reaper never touches another's work. Empty:
	// no scoping (a single server, or tools).
	Node string
	// MaxConns caps the connection pool (default: pgxpool's, max(4, CPUs)).
	MaxConns int32
	// Logf reports WatchEvents' lost connections (default: silent).
	Logf func(string, ...any)
}

// Store implements core.Store on PostgreSQL.
type Store struct {
	pool *pgxpool.Pool
	node string
	logf func(string, ...any)
	// connConfig is what WatchEvents dials its own LISTEN connection with.
	connConfig *pgx.ConnConfig
}

var (
	_ core.Store        = (*Store)(nil)
	_ core.EventWatcher = (*Store)(nil)
)

// Open connects to the database named by dsn (a postgres:// URL or a
// key=value string) and brings its schema up to date.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres dsn: %w", err)
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres connect: %w", err)
	}
	s := &Store{pool: pool, node: opts.Node, logf: opts.Logf, connConfig: cfg.ConnConfig.Copy()}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the pool.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// querier is what both the pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func nullTime(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	n := t.UnixNano()
	return &n
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// GetMeta returns a meta value.
func (s *Store) GetMeta(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := s.pool.QueryRow(ctx, `SELECT val FROM meta WHERE key=$1`, key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("meta %q: %w", key, core.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get meta: %w", err)
	}
	return v, nil
}

// PutMetaIfAbsent stores val unless key exists, and returns the stored value.
func (s *Store) PutMetaIfAbsent(ctx context.Context, key string, val []byte) ([]byte, error) {
	if _, err := s.pool.Exec(ctx, `INSERT INTO meta(key,val) VALUES($1,$2) ON CONFLICT (key) DO NOTHING`, key, val); err != nil {
		return nil, fmt.Errorf("put meta: %w", err)
	}
	return s.GetMeta(ctx, key)
}

// CreateAPIKey stores a key.
func (s *Store) CreateAPIKey(ctx context.Context, k core.APIKey) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO api_keys(id,project_id,name,hash,created_at,revoked_at,admin) VALUES($1,$2,$3,$4,$5,$6,$7)`,
		k.ID, k.ProjectID, k.Name, k.Hash, k.CreatedAt.UnixNano(), nullTime(k.RevokedAt), k.Admin)
	if err != nil {
		return fmt.Errorf("create api key: %w", err)
	}
	return nil
}

func scanKey(row pgx.Row) (core.APIKey, error) {
	var k core.APIKey
	var created int64
	var revoked *int64
	if err := row.Scan(&k.ID, &k.ProjectID, &k.Name, &k.Hash, &created, &revoked, &k.Admin); err != nil {
		return k, err
	}
	k.CreatedAt = time.Unix(0, created).UTC()
	if revoked != nil {
		t := time.Unix(0, *revoked).UTC()
		k.RevokedAt = &t
	}
	return k, nil
}

// GetAPIKey returns a key by id.
func (s *Store) GetAPIKey(ctx context.Context, id string) (core.APIKey, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT id,project_id,name,hash,created_at,revoked_at,admin FROM api_keys WHERE id=$1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return k, fmt.Errorf("api key: %w", core.ErrNotFound)
	}
	if err != nil {
		return k, fmt.Errorf("get api key: %w", err)
	}
	return k, nil
}

// ListAPIKeys lists the keys of a project ("" = all projects).
func (s *Store) ListAPIKeys(ctx context.Context, projectID string) ([]core.APIKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT id,project_id,name,hash,created_at,revoked_at,admin FROM api_keys
		WHERE $1='' OR project_id=$1 ORDER BY created_at, id`, projectID)
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
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at=$1 WHERE id=$2 AND ($3='' OR project_id=$3) AND revoked_at IS NULL`,
		at.UnixNano(), id, projectID)
	if err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("api key %s: %w", id, core.ErrNotFound)
	}
	return nil
}

func sandboxExpiry(sb core.Sandbox) *int64 { return nullTime(sb.ExpiresAt) }

// metadataJSON encodes the metadata column (and filters against it).
// JSONB cannot hold U+0000, which a metadata value may contain, so values
// go through metaEscape; the column is only ever matched, never decoded
// (the record itself is in doc).
func metadataJSON(m map[string]string) ([]byte, error) {
	esc := make(map[string]string, len(m))
	for k, v := range m {
		esc[metaEscape(k)] = metaEscape(v)
	}
	return json.Marshal(esc)
}

// metaEscape is injective and leaves strings without NUL or backslash as
// they are.
func metaEscape(s string) string {
	if !strings.ContainsAny(s, "\\\x00") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "\x00", `\0`)
}

// withTx runs fn in a transaction and commits when it returns nil.
func (s *Store) withTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// createWithOp inserts op (claiming idemKey) and, when that succeeded, runs
// insert in the same transaction. When idemKey is already taken in the
// project it returns the operation holding it and false. The unique index on
// (project_id, idem_key) makes concurrent callers wait for each other, so
// exactly one of them creates.
func (s *Store) createWithOp(ctx context.Context, op core.Operation, idemKey string, insert func(tx pgx.Tx) error) (core.Operation, bool, error) {
	var existing *core.Operation
	err := s.withTx(ctx, func(tx pgx.Tx) error {
		ok, err := s.insertOp(ctx, tx, op, idemKey)
		if err != nil {
			return err
		}
		if !ok {
			prev, err := getOp(ctx, tx, op.ProjectID, "", idemKey)
			if err != nil {
				return err
			}
			existing = &prev
			return errReplay
		}
		return insert(tx)
	})
	if errors.Is(err, errReplay) {
		return *existing, false, nil
	}
	if err != nil {
		return op, false, err
	}
	return op, true, nil
}

var errReplay = errors.New("idempotent replay")

// CreateSandboxOp stores a sandbox and its create operation atomically:
// CreateSandboxOpEvents without events.
func (s *Store) CreateSandboxOp(ctx context.Context, sb core.Sandbox, op core.Operation, idemKey string) (core.Operation, bool, error) {
	return s.CreateSandboxOpEvents(ctx, sb, op, idemKey, nil)
}

func decodeSandbox(doc string) (core.Sandbox, error) {
	var sb core.Sandbox
	if err := json.Unmarshal([]byte(doc), &sb); err != nil {
		return sb, fmt.Errorf("decode sandbox: %w", err)
	}
	return sb, nil
}

// GetSandbox returns a sandbox; projectID "" matches any project.
func (s *Store) GetSandbox(ctx context.Context, projectID, id string) (core.Sandbox, error) {
	var doc string
	err := s.pool.QueryRow(ctx, `SELECT doc FROM sandboxes WHERE id=$1 AND ($2='' OR project_id=$2)`, id, projectID).Scan(&doc)
	if errors.Is(err, pgx.ErrNoRows) {
		return core.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, core.ErrNotFound)
	}
	if err != nil {
		return core.Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	return decodeSandbox(doc)
}

func collectSandboxes(rows pgx.Rows, err error) ([]core.Sandbox, error) {
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
		sb, err := decodeSandbox(doc)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// args numbers query parameters as they are added.
type args []any

func (a *args) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// ListSandboxes lists sandboxes ordered by id, filtered and paginated.
func (s *Store) ListSandboxes(ctx context.Context, f core.SandboxFilter) ([]core.Sandbox, error) {
	var a args
	var q strings.Builder
	q.WriteString(`SELECT doc FROM sandboxes WHERE id > ` + a.add(f.After))
	if f.ProjectID != "" {
		q.WriteString(` AND project_id=` + a.add(f.ProjectID))
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		q.WriteString(` AND state = ANY(` + a.add(states) + `)`)
	} else {
		q.WriteString(` AND state != 'deleted'`)
	}
	if len(f.Metadata) > 0 {
		md, err := metadataJSON(f.Metadata)
		if err != nil {
			return nil, fmt.Errorf("encode metadata filter: %w", err)
		}
		q.WriteString(` AND metadata @> ` + a.add(string(md)) + `::jsonb`)
	}
	q.WriteString(` ORDER BY id`)
	if f.Limit > 0 {
		q.WriteString(` LIMIT ` + a.add(f.Limit))
	}
	rows, err := s.pool.Query(ctx, q.String(), a...)
	return collectSandboxes(rows, err)
}

// UpdateSandbox applies fn to a sandbox inside a transaction that holds the
// row locked (SELECT … FOR UPDATE), so concurrent updates from any replica
// apply one after the other.
func (s *Store) UpdateSandbox(ctx context.Context, id string, fn func(*core.Sandbox) error) (core.Sandbox, error) {
	return s.UpdateSandboxEvent(ctx, id, fn, nil)
}

// UpdateSandboxEvent implements core.RecordEvents (ev nil: no event): the
// event ev makes of the updated record is appended in the update's
// transaction, in the pipeline of its UPDATE and COMMIT.
func (s *Store) UpdateSandboxEvent(ctx context.Context, id string, fn func(*core.Sandbox) error, ev func(core.Sandbox) (core.Event, error)) (core.Sandbox, error) {
	// The transaction of BEGIN, SELECT … FOR UPDATE, UPDATE, COMMIT in two
	// round trips instead of four: each pair goes in one pipeline. A
	// BEGIN in a pipeline keeps its transaction open past the pipeline's
	// end, so the row stays locked while fn runs, as with a pgx.Tx.
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return core.Sandbox{}, fmt.Errorf("begin: %w", err)
	}
	defer conn.Release() // a connection left inside a transaction is closed, not reused
	rollback := func() { conn.Exec(context.WithoutCancel(ctx), "ROLLBACK") }
	var doc string
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`SELECT doc FROM sandboxes WHERE id=$1 FOR UPDATE`, id).QueryRow(func(row pgx.Row) error { return row.Scan(&doc) })
	err = conn.SendBatch(ctx, b).Close()
	if errors.Is(err, pgx.ErrNoRows) {
		rollback()
		return core.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, core.ErrNotFound)
	}
	if err != nil {
		rollback()
		return core.Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	sb, err := decodeSandbox(doc)
	if err == nil {
		err = fn(&sb)
	}
	var nd, md []byte
	if err == nil {
		if nd, err = json.Marshal(sb); err != nil {
			err = fmt.Errorf("encode sandbox: %w", err)
		}
	}
	if err == nil {
		if md, err = metadataJSON(sb.Metadata); err != nil {
			err = fmt.Errorf("encode metadata: %w", err)
		}
	}
	var rows eventRows
	if err == nil && ev != nil {
		var e core.Event
		if e, err = ev(sb); err == nil {
			rows, err = encodeEvents([]core.Event{e})
		}
	}
	if err != nil {
		rollback()
		return sb, err
	}
	b = &pgx.Batch{}
	b.Queue(`UPDATE sandboxes SET state=$1, node=$2, expires_at=$3, ended_at=$4, metadata=$5, doc=$6 WHERE id=$7`,
		string(sb.State), sb.Node, sandboxExpiry(sb), sandboxEnded(sb), string(md), string(nd), id)
	if ev != nil {
		b.Queue(`WITH g AS (SELECT 1), `+appendCTE("g", 1)+` SELECT (SELECT count(*) FROM nt)`, rows.args()...)
	}
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		rollback()
		return sb, fmt.Errorf("update sandbox: %w", err)
	}
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		// COMMIT of a failed transaction answers ROLLBACK without an error.
		rollback()
		return sb, fmt.Errorf("update sandbox %s: transaction not committed (status %c)", id, st)
	}
	return sb, nil
}

// ExpiredSandboxes lists running sandboxes past their expiry (with
// Options.Node, only those on that node).
func (s *Store) ExpiredSandboxes(ctx context.Context, now time.Time) ([]core.Sandbox, error) {
	rows, err := s.pool.Query(ctx, `SELECT doc FROM sandboxes WHERE state='running' AND expires_at IS NOT NULL AND expires_at < $1
		AND ($2='' OR node=$2 OR node='') ORDER BY id`, now.UnixNano(), s.node)
	out, err := collectSandboxes(rows, err)
	if err != nil {
		return nil, fmt.Errorf("expired sandboxes: %w", err)
	}
	return out, nil
}

// insertOp inserts op; with an idempotency key already used in the project
// it inserts nothing and returns false.
func (s *Store) insertOp(ctx context.Context, q querier, op core.Operation, idemKey string) (bool, error) {
	doc, err := core.EncodeOperation(op)
	if err != nil {
		return false, fmt.Errorf("encode operation: %w", err)
	}
	tag, err := q.Exec(ctx, `INSERT INTO operations(id,project_id,state,idem_key,owner,target,done_at,doc) VALUES($1,$2,$3,$4,$5,$6,$7,$8)
		ON CONFLICT (project_id, idem_key) DO NOTHING`,
		op.ID, op.ProjectID, string(op.State), nullString(idemKey), s.node, op.Target, opDone(op), string(doc))
	if err != nil {
		return false, fmt.Errorf("insert operation: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

func decodeOp(doc string) (core.Operation, error) {
	op, err := core.DecodeOperation([]byte(doc))
	if err != nil {
		return op, fmt.Errorf("decode operation: %w", err)
	}
	return op, nil
}

func getOp(ctx context.Context, q querier, projectID, id, idemKey string) (core.Operation, error) {
	var doc string
	var err error
	if idemKey != "" {
		err = q.QueryRow(ctx, `SELECT doc FROM operations WHERE project_id=$1 AND idem_key=$2`, projectID, idemKey).Scan(&doc)
	} else {
		err = q.QueryRow(ctx, `SELECT doc FROM operations WHERE id=$1 AND ($2='' OR project_id=$2)`, id, projectID).Scan(&doc)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return core.Operation{}, fmt.Errorf("operation: %w", core.ErrNotFound)
	}
	if err != nil {
		return core.Operation{}, fmt.Errorf("get operation: %w", err)
	}
	return decodeOp(doc)
}

// CreateOperation stores an operation, honouring an idempotency key. One
// INSERT is atomic on its own: no transaction around it (three round
// trips for one). ON CONFLICT waits for a concurrent holder of the key to
// commit, so a replay reads the committed holder.
func (s *Store) CreateOperation(ctx context.Context, op core.Operation, idemKey string) (core.Operation, bool, error) {
	ok, err := s.insertOp(ctx, s.pool, op, idemKey)
	if err != nil {
		return op, false, err
	}
	if !ok {
		prev, err := getOp(ctx, s.pool, op.ProjectID, "", idemKey)
		if err != nil {
			return op, false, err
		}
		return prev, false, nil
	}
	return op, true, nil
}

// GetOperation returns an operation; projectID "" matches any project.
func (s *Store) GetOperation(ctx context.Context, projectID, id string) (core.Operation, error) {
	return getOp(ctx, s.pool, projectID, id, "")
}

// UpdateOperation overwrites an operation's record.
func (s *Store) UpdateOperation(ctx context.Context, op core.Operation) error {
	doc, err := core.EncodeOperation(op)
	if err != nil {
		return fmt.Errorf("encode operation: %w", err)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE operations SET state=$1, done_at=$2, doc=$3 WHERE id=$4`, string(op.State), opDone(op), string(doc), op.ID)
	if err != nil {
		return fmt.Errorf("update operation: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("operation %s: %w", op.ID, core.ErrNotFound)
	}
	return nil
}

// UpdateOperationEvent implements core.OperationEvents: the update and
// the append in one statement (one round trip, one commit); nothing is
// appended when op has no record.
func (s *Store) UpdateOperationEvent(ctx context.Context, op core.Operation, e core.Event) (core.Event, error) {
	opDoc, err := core.EncodeOperation(op)
	if err != nil {
		return e, fmt.Errorf("encode operation: %w", err)
	}
	evDoc, err := json.Marshal(e)
	if err != nil {
		return e, fmt.Errorf("encode event: %w", err)
	}
	var seq int64
	err = s.pool.QueryRow(ctx, `WITH u AS (UPDATE operations SET state=$4, done_at=$5, doc=$6 WHERE id=$7 RETURNING id),
		c AS (UPDATE event_seq SET seq = seq + 1 WHERE id = 1 AND EXISTS (SELECT 1 FROM u) RETURNING seq),
		i AS (INSERT INTO events(seq, project_id, created_at, doc) SELECT seq, $1, $3, $2 FROM c RETURNING seq)
		SELECT i.seq FROM i, LATERAL (SELECT pg_notify('`+EventChannel+`', $1)) n`,
		e.ProjectID, string(evDoc), eventTime(e), string(op.State), opDone(op), string(opDoc), op.ID).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return e, fmt.Errorf("operation %s: %w", op.ID, core.ErrNotFound)
	}
	if err != nil {
		return e, fmt.Errorf("update operation and append event: %w", err)
	}
	e.Seq = seq
	return e, nil
}

// UnfinishedOperations lists pending and running operations (with
// Options.Node, only those this node's server created).
func (s *Store) UnfinishedOperations(ctx context.Context) ([]core.Operation, error) {
	rows, err := s.pool.Query(ctx, `SELECT doc FROM operations WHERE state IN ('pending','running')
		AND ($1='' OR owner=$1 OR owner='') ORDER BY id`, s.node)
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
		op, err := decodeOp(doc)
		if err != nil {
			return nil, err
		}
		out = append(out, op)
	}
	return out, rows.Err()
}

// AppendEvent stores an event, assigns its sequence number and notifies
// EventChannel, all in one statement. The sequence comes from a one-row
// counter whose row lock is held until commit, so events commit in
// sequence order: a reader that sees seq N also sees every seq below N
// (a plain sequence would let N commit before N-1, and a follower reading
// "after N" would skip N-1 for good).
func (s *Store) AppendEvent(ctx context.Context, e core.Event) (core.Event, error) {
	doc, err := json.Marshal(e)
	if err != nil {
		return e, fmt.Errorf("encode event: %w", err)
	}
	var seq int64
	err = s.pool.QueryRow(ctx, `WITH c AS (UPDATE event_seq SET seq = seq + 1 WHERE id = 1 RETURNING seq),
		i AS (INSERT INTO events(seq, project_id, created_at, doc) SELECT seq, $1, $3, $2 FROM c RETURNING seq)
		SELECT i.seq FROM i, LATERAL (SELECT pg_notify('`+EventChannel+`', $1)) n`, e.ProjectID, string(doc), eventTime(e)).Scan(&seq)
	if err != nil {
		return e, fmt.Errorf("append event: %w", err)
	}
	e.Seq = seq
	return e, nil
}

// EventsAfter returns a project's events with seq > after.
func (s *Store) EventsAfter(ctx context.Context, projectID string, after int64, limit int) ([]core.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.pool.Query(ctx, `SELECT seq, doc FROM events WHERE project_id=$1 AND seq > $2 ORDER BY seq LIMIT $3`, projectID, after, limit)
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
	var seq *int64
	if err := s.pool.QueryRow(ctx, `SELECT MAX(seq) FROM events WHERE project_id=$1`, projectID).Scan(&seq); err != nil {
		return 0, fmt.Errorf("latest event: %w", err)
	}
	if seq == nil {
		return 0, nil
	}
	return *seq, nil
}
