package core

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// SandboxRestarting is the state of a sandbox of a lost node that is being
// started on another node from its latest checkpoint (lost → restarting →
// running; lost again if the restart fails, with the reason).
const SandboxRestarting SandboxState = "restarting"

// Checkpoint bounds: a checkpoint freezes the sandbox for its capture, so
// the interval has a floor.
const (
	MinCheckpointSeconds = 5
	MaxCheckpointSeconds = MaxTimeoutSecond
	// checkpointRebase: after this many incremental checkpoints in a row,
	// the next one captures the whole layer and the older checkpoints are
	// deleted, so a long-lived sandbox's chain stays short.
	checkpointRebase = 32
	// checkpointName names the snapshots the server takes as checkpoints.
	checkpointName = "checkpoint"
	// checkpointsPerNode bounds the automatic checkpoints one replica runs
	// at once on one node: each freezes its sandbox and (with process
	// images) runs a CRIU or runsc dump, so every sandbox of a node due at
	// the same tick would take the node's CPUs from its sandboxes and from
	// a drain. The ones left wait for a later tick, longest overdue first.
	checkpointsPerNode = 2
)

// Relocator is implemented by runtimes that can start a sandbox of a lost
// node on another node (remote nodes sharing a snapshot store).
type Relocator interface {
	// Relocate picks a ready node other than sb.Node that shares sb.Node's
	// snapshot store and reserves room there for sb.
	Relocate(ctx context.Context, sb Sandbox) (string, error)
}

// checkpointSeconds resolves a create request's checkpoint interval: the
// request's, else the project's default (ServiceOptions.CheckpointDefaults,
// "*" for every project), else none.
func (s *Service) checkpointSeconds(projectID string, req *CreateRequest) int64 {
	if req.CheckpointSeconds != nil {
		return *req.CheckpointSeconds
	}
	if v, ok := s.opts.CheckpointDefaults[projectID]; ok {
		return v
	}
	return s.opts.CheckpointDefaults["*"]
}

// validateCheckpoint checks a create request's checkpoint_seconds.
func (s *Service) validateCheckpoint(req *CreateRequest) error {
	if req.CheckpointSeconds == nil || *req.CheckpointSeconds == 0 {
		return nil
	}
	if v := *req.CheckpointSeconds; v < MinCheckpointSeconds || v > MaxCheckpointSeconds {
		return invalid("checkpoint_seconds must be 0 (none) or between %d and %d", MinCheckpointSeconds, MaxCheckpointSeconds)
	}
	if _, ok := s.runtime.(Relocator); !ok {
		return invalid("checkpoint_seconds: this server has no other node to restart a sandbox on (checkpoints need space server --remote-nodes with a shared snapshot store)")
	}
	if _, err := s.snapshotRuntime(); err != nil {
		return invalid("checkpoint_seconds: this server cannot snapshot sandboxes")
	}
	return nil
}

// CheckpointDue starts a checkpoint of the running sandboxes whose interval
// has passed since their last one (or their creation), longest overdue
// first, at most checkpointsPerNode at once per node. One replica calls it
// (the reaper's); a sandbox whose checkpoint is still running is skipped.
func (s *Service) CheckpointDue(ctx context.Context) {
	if _, ok := s.runtime.(Relocator); !ok {
		return
	}
	now := s.opts.Now()
	type due struct {
		sb   Sandbox
		last time.Time
	}
	var all []due
	for after := ""; ; {
		page, err := s.store.ListSandboxes(ctx, SandboxFilter{After: after, Limit: 500, States: []SandboxState{SandboxRunning}})
		if err != nil {
			s.opts.Logf("checkpoints: %v", err)
			return
		}
		for _, sb := range page {
			if sb.CheckpointSeconds <= 0 {
				continue
			}
			last := sb.CreatedAt
			if sb.CheckpointAt != nil {
				last = *sb.CheckpointAt
			}
			if now.Sub(last) >= time.Duration(sb.CheckpointSeconds)*time.Second {
				all = append(all, due{sb, last})
			}
		}
		if len(page) < 500 {
			break
		}
		after = page[len(page)-1].ID
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].last.Before(all[j].last) })
	for _, d := range all {
		sb := d.sb
		if !s.takeCheckpointSlot(sb.Node) {
			continue
		}
		if _, busy := s.ckptBusy.LoadOrStore(sb.ID, true); busy {
			s.releaseCheckpointSlot(sb.Node)
			continue
		}
		if err := s.checkpoint(ctx, sb); err != nil {
			s.ckptBusy.Delete(sb.ID)
			s.releaseCheckpointSlot(sb.Node)
			if !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
				s.opts.Logf("sandbox %s: checkpoint: %v", sb.ID, err)
			}
		}
	}
}

// takeCheckpointSlot reports whether node has room for one more automatic
// checkpoint of this process, and takes it.
func (s *Service) takeCheckpointSlot(node string) bool {
	s.ckptMu.Lock()
	defer s.ckptMu.Unlock()
	if s.ckptNode == nil {
		s.ckptNode = map[string]int{}
	}
	if s.ckptNode[node] >= checkpointsPerNode {
		return false
	}
	s.ckptNode[node]++
	return true
}

func (s *Service) releaseCheckpointSlot(node string) {
	s.ckptMu.Lock()
	defer s.ckptMu.Unlock()
	if s.ckptNode[node]--; s.ckptNode[node] <= 0 {
		delete(s.ckptNode, node)
	}
}

// checkpoint starts the operation that captures sb as a checkpoint: an
// automatic snapshot (deleted with the sandbox) on the incremental chain of
// its snapshots, recorded on the sandbox when it is ready.
func (s *Service) checkpoint(ctx context.Context, sb Sandbox) error {
	sr, err := s.snapshotRuntime()
	if err != nil {
		return err
	}
	now := s.opts.Now().UTC()
	snap := Snapshot{ID: NewID("snap-"), ProjectID: sb.ProjectID, SandboxID: sb.ID, Name: checkpointName, Template: sb.Template,
		TemplateRef: sb.TemplateRef, Auto: true, State: SnapshotCreating, Kind: SnapshotKindFilesystem,
		Processes: processesNotCaptured, CreatedAt: now, UpdatedAt: now}
	op := s.engine.NewOperation(sb.ProjectID, "sandbox.checkpoint", snap.ID)
	stored, _, err := s.store.CreateSnapshotOp(ctx, snap, op, "")
	if err != nil {
		return err
	}
	s.engine.Start(ctx, stored, func(ctx context.Context, progress Progress) (any, error) {
		defer s.releaseCheckpointSlot(sb.Node)
		defer s.ckptBusy.Delete(sb.ID)
		full := sb.Checkpoints > 0 && sb.Checkpoints%checkpointRebase == 0
		out, err := s.runCapture(ctx, sr, snap, full, progress)
		if err != nil {
			s.snapshotFailed(ctx, snap.ID, err)
			return nil, err
		}
		// The capture began at now: that is the state a restart comes back with.
		if _, err := s.store.UpdateSandbox(ctx, sb.ID, func(cur *Sandbox) error {
			if cur.State != SandboxRunning && cur.State != SandboxPaused || cur.Node != sb.Node {
				return fmt.Errorf("sandbox became %s on node %s during its checkpoint: %w", cur.State, cur.Node, ErrConflict)
			}
			cur.Checkpoint, cur.CheckpointAt = out.ID, &now
			cur.Checkpoints++
			return nil
		}); err != nil {
			return nil, err
		}
		if full {
			progress(90, "deleting the checkpoints before this full one")
			s.dropCheckpointsBefore(ctx, sb.ProjectID, sb.ID, out.ID)
		}
		return out, nil
	})
	return nil
}

// dropCheckpointsBefore deletes sandbox id's checkpoints other than keep,
// newest first (each is the parent of the next); one another snapshot
// builds on is kept.
func (s *Service) dropCheckpointsBefore(ctx context.Context, projectID, id, keep string) {
	snaps, err := s.store.ListSnapshots(ctx, SnapshotFilter{ProjectID: projectID, SandboxID: id})
	if err != nil {
		s.opts.Logf("sandbox %s: list its checkpoints: %v", id, err)
		return
	}
	for i := len(snaps) - 1; i >= 0; i-- {
		if sn := snaps[i]; sn.Auto && sn.Name == checkpointName && sn.ID != keep {
			if _, err := s.DeleteSnapshot(ctx, projectID, sn.ID); err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
				s.opts.Logf("sandbox %s: delete checkpoint %s: %v", id, sn.ID, err)
			}
		}
	}
}

// restartFromCheckpoint starts the operation that brings a sandbox of a
// lost node (already recorded lost with lostReason) back on another node
// from its latest checkpoint, with the same id (so the same sessions). The
// record is claimed first (lost on the old node → restarting on the new
// one, a conditional update), so of replicas racing, one restarts it.
func (s *Service) restartFromCheckpoint(ctx context.Context, sb Sandbox, lostReason string) {
	rl, ok := s.runtime.(Relocator)
	sr, err := s.snapshotRuntime()
	if !ok || err != nil {
		return
	}
	keepLost := func(ctx context.Context, why string) {
		if _, err := s.store.UpdateSandbox(ctx, sb.ID, func(cur *Sandbox) error {
			if cur.State != SandboxLost && cur.State != SandboxRestarting {
				return nil
			}
			cur.State, cur.StateReason, cur.UpdatedAt = SandboxLost, lostReason+"; not restarted from its checkpoint: "+why, s.opts.Now().UTC()
			return nil
		}); err != nil {
			s.opts.Logf("sandbox %s: record failed restart: %v", sb.ID, err)
			return
		}
		if cur, err := s.store.GetSandbox(ctx, "", sb.ID); err == nil {
			s.publishState(ctx, cur)
		}
	}
	op := s.engine.NewOperation(sb.ProjectID, "sandbox.restart", sb.ID)
	if _, err := s.engine.Submit(ctx, op, "", func(ctx context.Context, progress Progress) (any, error) {
		s.snapMu.RLock()
		defer s.snapMu.RUnlock()
		defer s.sandboxLock(sb.ID)()
		chain, err := s.chain(ctx, sb.Checkpoint)
		if err != nil {
			keepLost(ctx, err.Error())
			return nil, err
		}
		to, err := rl.Relocate(ctx, sb)
		if err != nil {
			keepLost(ctx, err.Error())
			return nil, err
		}
		from := sb.Node
		var age time.Duration
		claimed, err := s.store.UpdateSandbox(ctx, sb.ID, func(cur *Sandbox) error {
			if cur.State != SandboxLost || cur.Node != from || cur.Checkpoint != sb.Checkpoint {
				return fmt.Errorf("sandbox %s is %s on node %s: %w", sb.ID, cur.State, cur.Node, ErrConflict)
			}
			now := s.opts.Now().UTC()
			age = now.Sub(*cur.CheckpointAt)
			cur.State, cur.Node, cur.UpdatedAt = SandboxRestarting, to, now
			cur.StateReason = fmt.Sprintf("%s; restarting on node %s from checkpoint %s (state %s old)", lostReason, to, cur.Checkpoint, age.Round(time.Millisecond))
			return nil
		})
		if err != nil {
			if rel, ok := s.runtime.(PlacementReleaser); ok {
				rel.ReleasePlacement(to, sb.ID)
			}
			return nil, err
		}
		s.publishRestart(ctx, claimed, age)
		progress(20, fmt.Sprintf("restoring on node %s from checkpoint %s", to, sb.Checkpoint))
		pl, err := sr.StartSandboxFromSnapshot(ctx, claimed, chain, progress)
		if err != nil {
			keepLost(context.WithoutCancel(ctx), err.Error())
			return nil, err
		}
		updated, err := s.store.UpdateSandbox(ctx, sb.ID, func(cur *Sandbox) error {
			if cur.State != SandboxRestarting || cur.Node != to {
				return fmt.Errorf("sandbox became %s on node %s while restarting: %w", cur.State, cur.Node, ErrConflict)
			}
			now := s.opts.Now().UTC()
			cur.State, cur.Driver, cur.Instance, cur.UpdatedAt = SandboxRunning, pl.Driver, pl.Instance, now
			cur.StateReason = fmt.Sprintf("restarted on node %s from checkpoint %s (state %s old) after: %s", to, cur.Checkpoint, age.Round(time.Millisecond), lostReason)
			if cur.PausedRemainingMS != nil {
				exp := now.Add(time.Duration(*cur.PausedRemainingMS) * time.Millisecond)
				cur.ExpiresAt, cur.PausedRemainingMS = &exp, nil
			}
			return nil
		})
		if err != nil {
			if stopErr := s.runtime.StopSandbox(context.WithoutCancel(ctx), sb.ID); stopErr != nil {
				s.opts.Logf("sandbox %s: stop after failed restart: %v", sb.ID, stopErr)
			}
			return nil, err
		}
		s.opts.Logf("sandbox %s: restarted on node %s from checkpoint %s (state %v old)", sb.ID, to, sb.Checkpoint, age.Round(time.Millisecond))
		s.publishRestart(ctx, updated, age)
		return updated, nil
	}); err != nil {
		s.opts.Logf("sandbox %s: restart from checkpoint: %v", sb.ID, err)
	}
}

// publishRestart is publishState for a restart's events, which also say
// which checkpoint the sandbox comes back from and how old its state is.
func (s *Service) publishRestart(ctx context.Context, sb Sandbox, age time.Duration) {
	if err := s.broker.Publish(ctx, sb.ProjectID, "sandbox.state", sb.ID, "", map[string]any{
		"id": sb.ID, "state": sb.State, "reason": sb.StateReason, "node": sb.Node,
		"checkpoint": sb.Checkpoint, "checkpoint_age_ms": age.Milliseconds(),
	}); err != nil {
		s.opts.Logf("sandbox %s: publish: %v", sb.ID, err)
	}
}
