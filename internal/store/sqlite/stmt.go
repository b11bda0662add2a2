package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
)

// stmtCache keeps the hot statements prepared. database/sql prepares a
// query string on every ExecContext/QueryContext call, and with the pure
// Go driver SQLite's parser was a third of the store's CPU in a full
// sandbox cycle (stop 37, docs/PERFORMANCE.md). A prepared statement is
// bound to the one connection (SetMaxOpenConns(1)) and re-prepared by
// database/sql if that connection is ever replaced.
type stmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

func newStmtCache(db *sql.DB) *stmtCache {
	return &stmtCache{db: db, m: map[string]*sql.Stmt{}}
}

// lookup returns q if it is prepared, else nil.
func (c *stmtCache) lookup(q string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[q]
}

// get returns q prepared, preparing it on first use. A statement that
// fails to prepare is not cached (the caller runs it unprepared, which
// reports the same error). Never call it while holding a transaction:
// preparing on the database waits for the one connection, which the
// transaction holds.
func (c *stmtCache) get(ctx context.Context, q string) (*sql.Stmt, error) {
	if st := c.lookup(q); st != nil {
		return st, nil
	}
	st, err := c.db.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[q]; ok {
		// Another caller prepared it meanwhile: keep one.
		st.Close()
		return old, nil
	}
	c.m[q] = st
	return st, nil
}

// close closes every cached statement.
func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for q, st := range c.m {
		st.Close()
		delete(c.m, q)
	}
}

// prepared runs fixed query strings as cached statements, on the database
// or inside a transaction. Only constant queries go through it (the cache
// is keyed by the query text and never shrinks); queries built from a
// filter run unprepared.
type prepared struct {
	c  *stmtCache
	tx *sql.Tx // nil: the database
}

// stmt is q prepared, or nil: the caller runs q unprepared. Inside a
// transaction only statements prepared before (see hotQueries) are used.
func (p prepared) stmt(ctx context.Context, q string) *sql.Stmt {
	if p.tx != nil {
		if st := p.c.lookup(q); st != nil {
			return p.tx.StmtContext(ctx, st)
		}
		return nil
	}
	st, err := p.c.get(ctx, q)
	if err != nil {
		return nil
	}
	return st
}

// prepareAll prepares qs; a failure is returned (the schema is there by
// now, so a hot query that does not prepare is a bug).
func (c *stmtCache) prepareAll(ctx context.Context, qs []string) error {
	for _, q := range qs {
		if _, err := c.get(ctx, q); err != nil {
			return fmt.Errorf("prepare %q: %w", q, err)
		}
	}
	return nil
}

// ExecContext implements execer.
func (p prepared) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if st := p.stmt(ctx, q); st != nil {
		return st.ExecContext(ctx, args...)
	}
	if p.tx != nil {
		return p.tx.ExecContext(ctx, q, args...)
	}
	return p.c.db.ExecContext(ctx, q, args...)
}

// QueryRowContext implements execer.
func (p prepared) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	if st := p.stmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	if p.tx != nil {
		return p.tx.QueryRowContext(ctx, q, args...)
	}
	return p.c.db.QueryRowContext(ctx, q, args...)
}

// QueryContext runs a constant query that returns rows.
func (p prepared) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if st := p.stmt(ctx, q); st != nil {
		return st.QueryContext(ctx, args...)
	}
	if p.tx != nil {
		return p.tx.QueryContext(ctx, q, args...)
	}
	return p.c.db.QueryContext(ctx, q, args...)
}
