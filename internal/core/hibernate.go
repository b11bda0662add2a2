package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// SandboxHibernated is the state of a sandbox whose writable layer was
// saved as a snapshot and whose instance was destroyed (no processes,
// cgroups or mounts left on the host). Its timeout clock is stopped, as
// while paused. Resume starts a new instance with the same id from that
// snapshot: files come back; processes continue where the driver captured
// them (a process snapshot, gVisor) and start afresh otherwise.
const SandboxHibernated SandboxState = "hibernated"

// hibernateProcesses is what a resume from hibernation does with
// processes, for a filesystem and for a process snapshot.
const (
	hibernateProcesses         = "not captured (filesystem-only hibernation): resume restores the files; processes that ran before start afresh"
	hibernateProcessesCaptured = "captured (process hibernation): resume continues every process where it was (on a node running the same driver; elsewhere only the files come back)"
)

// hibernationProcesses says what resuming from snapshot snapID does with
// processes.
func (s *Service) hibernationProcesses(ctx context.Context, projectID, snapID string) string {
	if sn, err := s.store.GetSnapshot(ctx, projectID, snapID); err == nil && sn.Kind == SnapshotKindProcess {
		return hibernateProcessesCaptured
	}
	return hibernateProcesses
}

// HibernateResult is the result of a hibernate or of a resume from
// hibernation: the sandbox, and what happened to its processes.
type HibernateResult struct {
	Sandbox
	Processes string `json:"processes"`
}

// Hibernate starts the operation that snapshots a running or paused
// sandbox's writable layer (an ordinary snapshot, listed with the others)
// and then destroys its instance. The snapshot cannot be deleted while the
// sandbox is hibernated.
func (s *Service) Hibernate(ctx context.Context, projectID, id, idemKey string) (Operation, error) {
	return s.hibernate(ctx, projectID, id, idemKey, false)
}

// hibernate is Hibernate; auto marks the snapshot as the server's own
// (timeout hibernation), deleted with the sandbox.
func (s *Service) hibernate(ctx context.Context, projectID, id, idemKey string, auto bool) (Operation, error) {
	sr, err := s.snapshotRuntime()
	if err != nil {
		return Operation{}, err
	}
	pr, err := s.pauseRuntime()
	if err != nil {
		return Operation{}, err
	}
	if len(idemKey) > 128 {
		return Operation{}, invalid("Idempotency-Key longer than 128 bytes")
	}
	sb, err := s.getLocal(ctx, projectID, id)
	if err != nil {
		return Operation{}, err
	}
	if sb.State == SandboxHibernated {
		return s.engine.Submit(ctx, s.engine.NewOperation(projectID, "sandbox.hibernate", id), idemKey,
			func(ctx context.Context, _ Progress) (any, error) {
				return HibernateResult{Sandbox: sb, Processes: s.hibernationProcesses(ctx, projectID, sb.HibernatedSnapshot)}, nil
			})
	}
	if sb.State != SandboxRunning && sb.State != SandboxPaused {
		return Operation{}, fmt.Errorf("sandbox is %s: %w", sb.State, ErrConflict)
	}
	now := s.opts.Now().UTC()
	snap := Snapshot{ID: NewID("snap-"), ProjectID: projectID, SandboxID: id, Template: sb.Template, TemplateRef: sb.TemplateRef, Auto: auto,
		State: SnapshotCreating, Kind: SnapshotKindFilesystem, Processes: hibernateProcesses,
		CreatedAt: now, UpdatedAt: now}
	// The snapshot record and the operation are stored together: a crash
	// leaves a failed operation and a failed snapshot (reconcile).
	op := s.engine.NewOperation(projectID, "sandbox.hibernate", id)
	stored, created, err := s.store.CreateSnapshotOp(ctx, snap, op, idemKey)
	if err != nil {
		return stored, err
	}
	if !created {
		if err := CheckReplay(stored, op); err != nil {
			return Operation{}, err
		}
		return stored, nil
	}
	s.engine.Start(ctx, stored, func(ctx context.Context, progress Progress) (any, error) {
		out, err := s.runHibernate(ctx, sr, pr, snap, progress)
		if err != nil {
			if _, uerr := s.store.UpdateSnapshot(context.WithoutCancel(ctx), snap.ID, func(cur *Snapshot) error {
				if cur.State == SnapshotCreating {
					cur.State, cur.StateReason, cur.UpdatedAt = SnapshotFailed, err.Error(), s.opts.Now().UTC()
				}
				return nil
			}); uerr != nil {
				s.opts.Logf("snapshot %s: mark failed: %v", snap.ID, uerr)
			}
			return nil, err
		}
		return out, nil
	})
	return stored, nil
}

func (s *Service) runHibernate(ctx context.Context, sr SnapshotRuntime, pr PauseRuntime, snap Snapshot, progress Progress) (any, error) {
	s.snapMu.RLock()
	defer s.snapMu.RUnlock()
	id := snap.SandboxID
	defer s.sandboxLock(id)()
	sb, err := s.store.GetSandbox(ctx, snap.ProjectID, id)
	if err != nil {
		return nil, err
	}
	if sb.State != SandboxRunning && sb.State != SandboxPaused {
		return nil, fmt.Errorf("sandbox is %s: %w", sb.State, ErrConflict)
	}
	// Frozen from the capture to the destroy: nothing written after the
	// capture can be lost.
	progress(5, "freezing")
	if err := pr.PauseSandbox(ctx, id); err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		if !committed && sb.State == SandboxRunning {
			if err := pr.ResumeSandbox(context.WithoutCancel(ctx), id); err != nil {
				s.opts.Logf("sandbox %s: thaw after failed hibernate: %v", id, err)
			}
		}
	}()
	parent, err := s.snapshotParent(ctx, sb, snap.ID)
	if err != nil {
		return nil, err
	}
	var chain []string
	if parent != "" {
		if chain, err = s.chain(ctx, parent); err != nil {
			return nil, err
		}
	}
	progress(10, "capturing the writable layer (and processes where the driver can)")
	digest, stats, err := sr.CaptureSnapshot(ctx, id, chain)
	if err != nil {
		return nil, err
	}
	processes := hibernateProcesses
	switch {
	case stats.ProcessDriver != "":
		processes = hibernateProcessesCaptured
	case stats.ProcessNotCaptured != "":
		processes += " (the driver's checkpoint failed: " + stats.ProcessNotCaptured + ")"
	}
	if _, err := s.store.UpdateSnapshot(ctx, snap.ID, func(cur *Snapshot) error {
		if cur.State != SnapshotCreating {
			return fmt.Errorf("snapshot became %s: %w", cur.State, ErrConflict)
		}
		cur.State, cur.Manifest, cur.Stats, cur.UpdatedAt = SnapshotReady, digest, &stats, s.opts.Now().UTC()
		cur.setKind(stats)
		cur.Processes = processes
		return nil
	}); err != nil {
		return nil, err
	}
	// The state is committed before the instance is destroyed: a crash in
	// between leaves a hibernated sandbox, and the start-up sweep removes
	// the instance (reconcile adopts only running and paused ones).
	updated, err := s.store.UpdateSandbox(ctx, id, func(cur *Sandbox) error {
		if cur.State != SandboxRunning && cur.State != SandboxPaused {
			return fmt.Errorf("sandbox became %s while hibernating: %w", cur.State, ErrConflict)
		}
		now := s.opts.Now().UTC()
		if cur.State == SandboxRunning {
			cur.PausedRemainingMS = nil
			if cur.ExpiresAt != nil {
				rem := max(cur.ExpiresAt.Sub(now).Milliseconds(), 0)
				cur.PausedRemainingMS, cur.ExpiresAt = &rem, nil
			}
		}
		cur.State, cur.UpdatedAt, cur.HibernatedSnapshot = SandboxHibernated, now, snap.ID
		return nil
	})
	if err != nil {
		return nil, err
	}
	committed = true
	progress(80, "destroying the instance")
	if err := s.runtime.StopSandbox(ctx, id); err != nil {
		s.opts.Logf("sandbox %s: destroy after hibernate (the start-up sweep retries): %v", id, err)
	}
	s.publishState(ctx, updated)
	return HibernateResult{Sandbox: updated, Processes: processes}, nil
}

// wake is Resume for a hibernated sandbox: a new instance with the same id
// starts from its hibernation snapshot; its timeout restarts with the time
// that was left. Sessions stay valid (they are bound to the id).
func (s *Service) wake(ctx context.Context, projectID, id, idemKey string) (Operation, error) {
	sr, err := s.snapshotRuntime()
	if err != nil {
		return Operation{}, err
	}
	op := s.engine.NewOperation(projectID, "sandbox.resume", id)
	return s.engine.Submit(ctx, op, idemKey, func(ctx context.Context, progress Progress) (any, error) {
		s.snapMu.RLock()
		defer s.snapMu.RUnlock()
		defer s.sandboxLock(id)()
		cur, err := s.store.GetSandbox(ctx, projectID, id)
		if err != nil {
			return nil, err
		}
		if cur.State == SandboxRunning {
			return cur, nil
		}
		if cur.State != SandboxHibernated {
			return nil, fmt.Errorf("sandbox is %s: %w", cur.State, ErrConflict)
		}
		chain, err := s.chain(ctx, cur.HibernatedSnapshot)
		if err != nil {
			return nil, err
		}
		processes := s.hibernationProcesses(ctx, projectID, cur.HibernatedSnapshot)
		progress(10, "restoring the writable layer")
		pl, err := sr.StartSandboxFromSnapshot(ctx, cur, chain, progress)
		if err != nil {
			return nil, err
		}
		updated, err := s.store.UpdateSandbox(ctx, id, func(cur *Sandbox) error {
			if cur.State != SandboxHibernated {
				return fmt.Errorf("sandbox became %s while resuming: %w", cur.State, ErrConflict)
			}
			now := s.opts.Now().UTC()
			cur.State, cur.Driver, cur.Instance, cur.UpdatedAt = SandboxRunning, pl.Driver, pl.Instance, now
			cur.HibernatedSnapshot = ""
			if cur.PausedRemainingMS != nil {
				left := time.Duration(*cur.PausedRemainingMS) * time.Millisecond
				// Hibernated by its timeout: it gets its whole timeout again,
				// or it would hibernate again at once.
				if left < time.Second && cur.TimeoutSeconds > 0 {
					left = time.Duration(cur.TimeoutSeconds) * time.Second
				}
				exp := now.Add(left)
				cur.ExpiresAt, cur.PausedRemainingMS = &exp, nil
			}
			return nil
		})
		if err != nil {
			if stopErr := s.runtime.StopSandbox(context.WithoutCancel(ctx), id); stopErr != nil {
				s.opts.Logf("sandbox %s: stop after failed resume: %v", id, stopErr)
			}
			return nil, err
		}
		s.publishState(ctx, updated)
		return HibernateResult{Sandbox: updated, Processes: processes}, nil
	})
}

// snapshotHibernates refuses deleting a snapshot a hibernated sandbox
// needs to resume.
func (s *Service) snapshotHibernates(ctx context.Context, projectID, snapID string) error {
	hib, err := s.store.ListSandboxes(ctx, SandboxFilter{ProjectID: projectID, States: []SandboxState{SandboxHibernated}})
	if err != nil {
		return err
	}
	for _, sb := range hib {
		if sb.HibernatedSnapshot == snapID {
			return fmt.Errorf("snapshot %s holds hibernated sandbox %s: %w", snapID, sb.ID, ErrConflict)
		}
	}
	return nil
}

// IdleRuntime is implemented by runtimes that track data-plane activity.
type IdleRuntime interface {
	// IdleFor reports how long sandbox id has had no data-plane call and
	// no command running; false if the runtime does not know it.
	IdleFor(id string) (time.Duration, bool)
}

// AutoPauseIdle pauses running sandboxes of this node (of every node with
// AnyNode) that asked for it (AutoPauseSeconds) and have been idle that
// long. A paused sandbox is
// resumed by an explicit resume; its timeout clock is stopped meanwhile.
func (s *Service) AutoPauseIdle(ctx context.Context) {
	ir, ok := s.runtime.(IdleRuntime)
	if !ok {
		return
	}
	if _, err := s.pauseRuntime(); err != nil {
		return
	}
	running, err := s.store.ListSandboxes(ctx, SandboxFilter{States: []SandboxState{SandboxRunning}})
	if err != nil {
		s.opts.Logf("auto-pause: %v", err)
		return
	}
	for _, sb := range running {
		if sb.AutoPauseSeconds <= 0 || !s.opts.AnyNode && sb.Node != "" && sb.Node != s.opts.NodeName {
			continue
		}
		idle, ok := ir.IdleFor(sb.ID)
		if !ok || idle < time.Duration(sb.AutoPauseSeconds)*time.Second {
			continue
		}
		s.opts.Logf("sandbox %s: idle for %v, auto-pausing", sb.ID, idle.Round(time.Second))
		if _, err := s.Pause(ctx, sb.ProjectID, sb.ID, ""); err != nil && !errors.Is(err, ErrConflict) {
			s.opts.Logf("auto-pause %s: %v", sb.ID, err)
		}
	}
}

// autoResumeWait bounds how long a data-plane call waits for an automatic
// resume (a hibernated sandbox restores its layer, possibly processes).
const autoResumeWait = 60 * time.Second

// AutoResume resumes a paused or hibernated sandbox that asked for it
// (AutoResume at create) and waits until it runs. It reports false, with no
// error, when the sandbox did not ask or is not paused or hibernated. The
// data plane calls it before answering sandbox_paused.
func (s *Service) AutoResume(ctx context.Context, projectID, id string) (bool, error) {
	sb, err := s.store.GetSandbox(ctx, projectID, id)
	if err != nil {
		return false, err
	}
	if !sb.AutoResume {
		return false, nil
	}
	// A call can race the pause or hibernation that made the node refuse
	// it: wait for the operation holding the sandbox to finish, and for a
	// timeout hibernation the reaper is about to start.
	for deadline := time.Now().Add(autoResumeWait); sb.State != SandboxPaused && sb.State != SandboxHibernated; {
		expiring := sb.State == SandboxRunning && sb.OnTimeout == OnTimeoutHibernate &&
			sb.ExpiresAt != nil && !sb.ExpiresAt.After(s.opts.Now())
		if sb.State != SandboxRunning || time.Now().After(deadline) {
			return false, nil
		}
		locked := make(chan struct{})
		go func() { s.sandboxLock(id)(); close(locked) }()
		select {
		case <-locked:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		if sb, err = s.store.GetSandbox(ctx, projectID, id); err != nil {
			return false, err
		}
		if sb.State == SandboxRunning {
			if !expiring {
				return false, nil
			}
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
	}
	// Concurrent calls for the same pause join one operation.
	key := fmt.Sprintf("auto-resume-%s-%d", id, sb.UpdatedAt.UnixNano())
	op, err := s.Resume(ctx, projectID, id, key)
	if err != nil {
		return false, err
	}
	if op, err = s.engine.Wait(ctx, projectID, op.ID, autoResumeWait); err != nil {
		return false, err
	}
	if op.State != OpSucceeded {
		if op.Error != nil {
			return false, fmt.Errorf("auto-resume of %s: %s: %w", id, op.Error.Message, ErrConflict)
		}
		return false, fmt.Errorf("auto-resume of %s did not finish: %w", id, ErrConflict)
	}
	return true, nil
}

// dropAutoSnapshots deletes the snapshots the server took of a deleted
// sandbox on its own (timeout hibernations). One that forks or other
// snapshots build on is kept, as any snapshot would be.
func (s *Service) dropAutoSnapshots(ctx context.Context, projectID, id string) {
	snaps, err := s.store.ListSnapshots(ctx, SnapshotFilter{ProjectID: projectID, SandboxID: id})
	if err != nil {
		s.opts.Logf("sandbox %s: list its snapshots: %v", id, err)
		return
	}
	// Newest first: a later automatic snapshot is the child of an earlier one.
	for i := len(snaps) - 1; i >= 0; i-- {
		if !snaps[i].Auto {
			continue
		}
		if _, err := s.DeleteSnapshot(ctx, projectID, snaps[i].ID); err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
			s.opts.Logf("sandbox %s: delete automatic snapshot %s: %v", id, snaps[i].ID, err)
		}
	}
}

// AutoResumePublic is AutoResume for a forwarded-port request that carries
// no credential: only a sandbox with public ports is woken by one (any
// other answers false, as if it did not exist). A public sandbox that is
// paused or hibernated without auto-resume is ErrConflict: its ports need
// no credential, so its state is no secret, and the forwarder answers
// sandbox_paused as it does with a credential.
func (s *Service) AutoResumePublic(ctx context.Context, id string) (bool, error) {
	sb, err := s.store.GetSandbox(ctx, "", id)
	if err != nil || !sb.PublicPorts {
		return false, nil
	}
	if !sb.AutoResume && (sb.State == SandboxPaused || sb.State == SandboxHibernated) {
		return false, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, ErrConflict)
	}
	return s.AutoResume(ctx, sb.ProjectID, id)
}
