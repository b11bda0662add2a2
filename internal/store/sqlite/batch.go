package sqlite

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Group commit. SQLite has one writer, and this store one connection; under
// concurrent creates most of a write's CPU was its own BEGIN and COMMIT
// (reading the WAL index, appending the dirty pages as WAL frames). write
// queues a caller's statements, and whoever finds no batch running becomes
// the leader: it runs everything queued in one transaction, each caller's
// statements inside a savepoint of its own (a caller's error rolls back
// its statements only), commits once, and only then answers each caller.
// A write is acknowledged after the commit that holds it, as before
// (operations durable before they are acknowledged, DESIGN.md).

// writeReq is one caller's statements, waiting for a batch.
type writeReq struct {
	ctx  context.Context
	fn   func(ctx context.Context, q prepared) error
	done chan error    // the outcome, once committed (or failed)
	lead chan struct{} // closed when this caller is to run the next batch
}

// batcher queues writes for the leader.
type batcher struct {
	mu      sync.Mutex
	queue   []*writeReq
	running bool // a leader runs a batch
}

// maxBatch bounds the writes of one transaction, so one commit never holds
// the connection for long.
const maxBatch = 64

const (
	qSavepoint  = `SAVEPOINT w`
	qRelease    = `RELEASE w`
	qRollbackTo = `ROLLBACK TO w`
)

// write runs fn in a transaction, possibly together with other callers'
// functions, and returns its error or the commit's. fn runs under ctx
// without its cancellation (interrupting SQLite inside a transaction
// rolls back the whole transaction, other callers' writes included); a
// ctx that ends before fn starts fails the write without running it.
func (s *Store) write(ctx context.Context, fn func(ctx context.Context, q prepared) error) error {
	r := &writeReq{ctx: ctx, fn: fn, done: make(chan error, 1), lead: make(chan struct{})}
	b := &s.batch
	b.mu.Lock()
	b.queue = append(b.queue, r)
	lead := !b.running
	if lead {
		b.running = true
	}
	b.mu.Unlock()
	if !lead {
		select {
		case err := <-r.done:
			return answer(err)
		case <-r.lead:
		}
	}
	// This caller leads: its own write is in the queue, so the batch it
	// runs answers it.
	b.mu.Lock()
	n := min(len(b.queue), maxBatch)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	b.mu.Unlock()
	s.runBatch(batch)
	b.mu.Lock()
	if len(b.queue) > 0 {
		close(b.queue[0].lead) // the next batch is its caller's to run
	} else {
		b.running = false
	}
	b.mu.Unlock()
	return answer(<-r.done)
}

// answer returns a write's outcome to its caller, and a panic of its fn
// as a panic of the caller's, where it would have been without batching.
func answer(err error) error {
	var p fnPanic
	if errors.As(err, &p) {
		panic(p.v)
	}
	return err
}

// fnPanic carries a write function's panic from the batch that ran it to
// its caller; the batch goes on with its other writes.
type fnPanic struct{ v any }

func (p fnPanic) Error() string { return fmt.Sprintf("write panicked: %v", p.v) }

// runFn runs r's function, turning a panic into an fnPanic.
func runFn(ctx context.Context, r *writeReq, q prepared) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fnPanic{v}
		}
	}()
	return r.fn(ctx, q)
}

// runBatch runs batch in one transaction and answers each caller.
func (s *Store) runBatch(batch []*writeReq) {
	errs := make([]error, len(batch))
	reply := func(commitErr error) {
		for i, r := range batch {
			if errs[i] == nil {
				errs[i] = commitErr
			}
			r.done <- errs[i]
		}
	}
	tx, err := s.db.BeginTx(context.Background(), nil)
	if err != nil {
		reply(fmt.Errorf("begin: %w", err))
		return
	}
	defer tx.Rollback()
	q := s.q(tx)
	one := len(batch) == 1 // nothing to keep apart: no savepoint
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		ctx := context.WithoutCancel(r.ctx)
		if one {
			errs[i] = runFn(ctx, r, q)
			break
		}
		if _, err := q.ExecContext(ctx, qSavepoint); err != nil {
			errs[i] = fmt.Errorf("savepoint: %w", err)
			continue
		}
		if errs[i] = runFn(ctx, r, q); errs[i] != nil {
			if _, err := q.ExecContext(ctx, qRollbackTo); err != nil {
				// The transaction is in an unknown state: fail the batch.
				reply(fmt.Errorf("rollback to savepoint: %w (after %w)", err, errs[i]))
				return
			}
		}
		if _, err := q.ExecContext(ctx, qRelease); err != nil {
			reply(fmt.Errorf("release savepoint: %w", err))
			return
		}
	}
	if one && errs[0] != nil {
		reply(nil)
		return
	}
	if err := tx.Commit(); err != nil {
		// Nothing of the batch is stored: every caller fails.
		reply(fmt.Errorf("commit: %w", err))
		return
	}
	reply(nil)
}
