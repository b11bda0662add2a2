package server

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/snapshot"
)

// openSnapshotStore opens the shared snapshot store named by spec (""
// = none: snapshots stay in the node's data dir). S3 credentials come from
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment.
func openSnapshotStore(ctx context.Context, spec string, logf func(string, ...any)) (snapshot.Backend, error) {
	if spec == "" {
		return nil, nil
	}
	b, err := snapshot.OpenBackend(ctx, spec, nil)
	if err != nil {
		return nil, fmt.Errorf("--snapshot-store: %w", err)
	}
	logf("snapshot store: %s (shared; %s is this node's cache)", b, "<data-dir>/snapshots")
	return b, nil
}

// collectSharedSnapshots removes from the shared snapshot store what no
// ready snapshot of the cluster names, among objects older than
// snapshot.SharedGCMinAge (younger ones may belong to captures in flight
// on other nodes). Errors are logged: nothing is deleted on a doubt.
func collectSharedSnapshots(ctx context.Context, st core.Store, collect func(context.Context, []string, time.Duration) (snapshot.SharedGCResult, error), logf func(string, ...any)) {
	ready, err := st.ListSnapshots(ctx, core.SnapshotFilter{States: core.SnapshotStatesKept()})
	if err != nil {
		logf("shared snapshot gc: %v", err)
		return
	}
	keep := make([]string, 0, len(ready))
	for _, sn := range ready {
		if sn.Manifest != "" {
			keep = append(keep, sn.Manifest)
		}
	}
	res, err := collect(ctx, keep, snapshot.SharedGCMinAge)
	if err != nil {
		logf("shared snapshot gc: %v", err)
		return
	}
	logf("shared snapshot gc: %+v", res)
}
