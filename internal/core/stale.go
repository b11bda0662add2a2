package core

import (
	"context"
	"encoding/json"
	"time"
)

// runs reports whether this engine runs operation id now.
func (e *Engine) runs(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.running[id]
	return ok
}

// SettleStaleOperations settles operations of this replica (ops: its
// unfinished ones in the store) that its engine no longer runs: their
// outcome, or the sandbox change before it, could not be stored (the
// database was down or restarting then). A create whose sandbox runs
// succeeded; the rest fail as a lost replica's do, their sandboxes
// settled first. Operations younger than grace are left alone (one is
// stored before its engine starts it).
func (s *Service) SettleStaleOperations(ctx context.Context, ops []Operation, grace time.Duration) int {
	n := 0
	for _, op := range ops {
		if op.State.Done() || s.engine.runs(op.ID) || s.opts.Now().Sub(op.CreatedAt) < grace {
			continue
		}
		// Read again: it may have ended since the list was taken.
		cur, err := s.store.GetOperation(ctx, op.ProjectID, op.ID)
		if err != nil || cur.State.Done() || s.engine.runs(op.ID) {
			continue
		}
		n++
		if op.Kind == "sandbox.create" || op.Kind == "sandbox.fork" {
			if sb, err := s.store.GetSandbox(ctx, "", op.Target); err == nil && sb.State == SandboxRunning {
				cur.State, cur.Progress, cur.Message = OpSucceeded, 100, "done (its outcome was stored late: the store was unavailable when it ended)"
				if raw, err := json.Marshal(sb); err == nil {
					cur.Result = raw
				}
				s.engine.saveCtx(ctx, cur)
				continue
			}
		}
		s.FailOrphanOperations(ctx, []Operation{cur}, "this operation's outcome could not be stored (the store was unavailable when it ended)")
	}
	return n
}
