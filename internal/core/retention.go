package core

import (
	"context"
	"log/slog"
	"time"
)

// PruneCounts is how many records a prune removed, by kind.
type PruneCounts struct {
	Sandboxes  int `json:"sandboxes"`
	Operations int `json:"operations"`
	Events     int `json:"events"`
}

// Add sums two counts.
func (c PruneCounts) Add(o PruneCounts) PruneCounts {
	return PruneCounts{Sandboxes: c.Sandboxes + o.Sandboxes, Operations: c.Operations + o.Operations, Events: c.Events + o.Events}
}

// Total is the number of records removed.
func (c PruneCounts) Total() int { return c.Sandboxes + c.Operations + c.Events }

// DefaultPruneBatch is how many rows of each kind one PruneEnded call
// deletes: small enough that the store's other writers (SQLite has one
// connection) wait milliseconds, not seconds.
const DefaultPruneBatch = 500

// Pruner deletes ended sandboxes, finished operations and events older
// than Retention from the store, every Interval (retention).
type Pruner struct {
	Store     Store
	Retention time.Duration // records older than this go; <= 0: keep everything
	Interval  time.Duration // between runs (default PruneInterval(Retention))
	Batch     int           // rows per kind per store call (default DefaultPruneBatch)
	Now       func() time.Time
	Log       *slog.Logger
}

// PruneInterval is the default time between prunes for a retention: a
// tenth of it, at least a second and at most ten minutes.
func PruneInterval(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Second), 10*time.Minute)
}

// Once prunes everything older than the retention window, batch after
// batch until a batch comes back short, and returns what went.
func (p *Pruner) Once(ctx context.Context) (PruneCounts, error) {
	var total PruneCounts
	if p.Retention <= 0 {
		return total, nil
	}
	now, batch := p.Now, p.Batch
	if now == nil {
		now = time.Now
	}
	if batch <= 0 {
		batch = DefaultPruneBatch
	}
	cutoff := now().Add(-p.Retention)
	for ctx.Err() == nil {
		c, err := p.Store.PruneEnded(ctx, cutoff, batch)
		total = total.Add(c)
		if err != nil {
			return total, err
		}
		if c.Sandboxes < batch && c.Operations < batch && c.Events < batch {
			break
		}
	}
	return total, ctx.Err()
}

// Run prunes every Interval until ctx ends, logging each prune that
// removed something ("store pruned") and each failure.
func (p *Pruner) Run(ctx context.Context) {
	if p.Retention <= 0 {
		return
	}
	log := p.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	every := p.Interval
	if every <= 0 {
		every = PruneInterval(p.Retention)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		t0 := time.Now()
		c, err := p.Once(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Warn("store prune failed", "error", err.Error(), "retention", p.Retention.String())
		case c.Total() > 0:
			log.Info("store pruned", "sandboxes", c.Sandboxes, "operations", c.Operations, "events", c.Events,
				"retention", p.Retention.String(), "duration_ms", float64(time.Since(t0).Microseconds())/1000)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
