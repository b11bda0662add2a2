package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/space-sandbox/space/internal/core"
)

var _ core.RecordEvents = (*Store)(nil)

// eventRows is a batch of events as the three arrays appendCTE unnests.
type eventRows struct {
	projects []string
	docs     []string
	times    []int64
}

func encodeEvents(evs []core.Event) (eventRows, error) {
	var r eventRows
	for _, e := range evs {
		doc, err := json.Marshal(e)
		if err != nil {
			return r, fmt.Errorf("encode event: %w", err)
		}
		r.projects = append(r.projects, e.ProjectID)
		r.docs = append(r.docs, string(doc))
		r.times = append(r.times, eventTime(e))
	}
	return r, nil
}

// appendCTE is the part of a WITH that appends the events passed as
// parameters $p (their count), $p+1..$p+3 (project ids, docs, times) when
// the CTE named gate returned a row: as AppendEvent, the one-row counter's
// lock orders the commits, and each project with an event is notified.
// The statement's final SELECT must read from "nt" for the notifications
// to run.
func appendCTE(gate string, p int) string {
	n, pr, doc, ts := "$"+strconv.Itoa(p), "$"+strconv.Itoa(p+1), "$"+strconv.Itoa(p+2), "$"+strconv.Itoa(p+3)
	return `c AS (UPDATE event_seq SET seq = seq + ` + n + `::bigint WHERE id = 1 AND ` + n + `::bigint > 0 AND EXISTS (SELECT 1 FROM ` + gate + `) RETURNING seq),
		ev AS (INSERT INTO events(seq, project_id, created_at, doc)
			SELECT c.seq - ` + n + `::bigint + t.n, t.project_id, t.created_at, t.doc FROM c,
			unnest(` + pr + `::text[], ` + doc + `::text[], ` + ts + `::bigint[]) WITH ORDINALITY AS t(project_id, doc, created_at, n)
			RETURNING project_id),
		nt AS (SELECT pg_notify('` + EventChannel + `', d.p) FROM (SELECT DISTINCT project_id AS p FROM ev) d)`
}

func (r eventRows) args() []any {
	return []any{int64(len(r.docs)), r.projects, r.docs, r.times}
}

// created is the answer of a create that claimed idemKey (inserted) or
// found it taken: then the operation holding it.
func (s *Store) created(ctx context.Context, op core.Operation, idemKey string, inserted bool) (core.Operation, bool, error) {
	if inserted {
		return op, true, nil
	}
	prev, err := getOp(ctx, s.pool, op.ProjectID, "", idemKey)
	if err != nil {
		return op, false, err
	}
	return prev, false, nil
}

// CreateSandboxOpEvents implements core.RecordEvents: the sandbox, its
// create operation and evs in one statement (one round trip, one commit;
// atomic without a transaction around it).
func (s *Store) CreateSandboxOpEvents(ctx context.Context, sb core.Sandbox, op core.Operation, idemKey string, evs []core.Event) (core.Operation, bool, error) {
	doc, err := json.Marshal(sb)
	if err != nil {
		return op, false, fmt.Errorf("encode sandbox: %w", err)
	}
	md, err := metadataJSON(sb.Metadata)
	if err != nil {
		return op, false, fmt.Errorf("encode metadata: %w", err)
	}
	opDoc, err := core.EncodeOperation(op)
	if err != nil {
		return op, false, fmt.Errorf("encode operation: %w", err)
	}
	rows, err := encodeEvents(evs)
	if err != nil {
		return op, false, err
	}
	// The sandbox is inserted only when the operation claimed idemKey,
	// the events only when the sandbox was inserted.
	var inserted bool
	var notified int64
	args := append([]any{sb.ID, sb.ProjectID, string(sb.State), sb.Node, sandboxExpiry(sb), sandboxEnded(sb), string(md), string(doc),
		op.ID, string(op.State), nullString(idemKey), s.node, op.Target, opDone(op), string(opDoc)}, rows.args()...)
	err = s.pool.QueryRow(ctx, `WITH o AS (INSERT INTO operations(id,project_id,state,idem_key,owner,target,done_at,doc) VALUES($9,$2,$10,$11,$12,$13,$14,$15)
			ON CONFLICT (project_id, idem_key) DO NOTHING RETURNING id),
		x AS (INSERT INTO sandboxes(id,project_id,state,node,expires_at,ended_at,metadata,doc) SELECT $1,$2,$3,$4,$5,$6,$7,$8 WHERE EXISTS (SELECT 1 FROM o) RETURNING id),
		`+appendCTE("x", 16)+`
		SELECT EXISTS (SELECT 1 FROM x), (SELECT count(*) FROM nt)`, args...).Scan(&inserted, &notified)
	if err != nil {
		return op, false, fmt.Errorf("insert sandbox and operation: %w", err)
	}
	return s.created(ctx, op, idemKey, inserted)
}

// CreateOperationEvent implements core.RecordEvents: the operation's
// insert and, when it claimed idemKey, e's append in one statement.
func (s *Store) CreateOperationEvent(ctx context.Context, op core.Operation, idemKey string, e core.Event) (core.Operation, bool, error) {
	opDoc, err := core.EncodeOperation(op)
	if err != nil {
		return op, false, fmt.Errorf("encode operation: %w", err)
	}
	rows, err := encodeEvents([]core.Event{e})
	if err != nil {
		return op, false, err
	}
	var inserted bool
	var notified int64
	args := append([]any{op.ID, op.ProjectID, string(op.State), nullString(idemKey), s.node, op.Target, opDone(op), string(opDoc)}, rows.args()...)
	err = s.pool.QueryRow(ctx, `WITH o AS (INSERT INTO operations(id,project_id,state,idem_key,owner,target,done_at,doc) VALUES($1,$2,$3,$4,$5,$6,$7,$8)
			ON CONFLICT (project_id, idem_key) DO NOTHING RETURNING id),
		`+appendCTE("o", 9)+`
		SELECT EXISTS (SELECT 1 FROM o), (SELECT count(*) FROM nt)`, args...).Scan(&inserted, &notified)
	if err != nil {
		return op, false, fmt.Errorf("insert operation and event: %w", err)
	}
	return s.created(ctx, op, idemKey, inserted)
}
