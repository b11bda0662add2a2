package server

import (
	"context"
	"sync"

	"github.com/space-sandbox/space/internal/core"
)

// startPruner runs the store's retention (Config.Retention) until ctx
// ends: ended sandboxes, finished operations and events older than it are
// deleted in batches every Config.PruneInterval. Replicas sharing a
// PostgreSQL store may all run it (a batch skips rows another is
// deleting).
func startPruner(ctx context.Context, wg *sync.WaitGroup, st core.Store, cfg Config) {
	if cfg.Retention <= 0 {
		cfg.Logger.Info("retention off: the store keeps every ended sandbox, operation and event")
		return
	}
	p := &core.Pruner{Store: st, Retention: cfg.Retention, Interval: cfg.PruneInterval, Log: cfg.Logger}
	if p.Interval <= 0 {
		p.Interval = core.PruneInterval(cfg.Retention)
	}
	cfg.Logger.Info("retention: pruning ended sandboxes, finished operations and events",
		"retention", cfg.Retention.String(), "interval", p.Interval.String())
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.Run(ctx)
	}()
}
