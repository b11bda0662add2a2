package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/execlog"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/template"
)

// Pre-warm bounds: how long the ready check may take to pass (unless the
// server sets another), one check's run time, and the pause between checks.
const (
	prewarmReadyTimeout = 2 * time.Minute
	prewarmCheckTimeout = 30 * time.Second
	prewarmPoll         = 200 * time.Millisecond
	// Without READY the start command gets this long to settle (and must
	// not have failed) before the snapshot.
	prewarmSettle = time.Second
)

// What a create from a pre-warmed template does about the start command.
const (
	warmProcessesRestored = "restored: sandboxes continue the start command's processes from the snapshot"
	warmProcessesRerun    = "files only: sandboxes get the files the start command left; the start command is run again at create (command 1)"
)

// WarmResult is a build's pre-warm, in the operation result.
type WarmResult struct {
	Snapshot    string  `json:"snapshot"`
	Kind        string  `json:"kind"`
	Processes   string  `json:"processes"`
	Seconds     float64 `json:"seconds"`
	ReadyChecks int     `json:"ready_checks"`
	Cached      bool    `json:"cached,omitempty"` // the name already had a usable warm snapshot
}

// warmUsable reports whether tp's warm snapshot still exists and is ready.
func (t *Templates) warmUsable(ctx context.Context, tp template.Template) bool {
	if tp.Warm == nil || t.store == nil {
		return false
	}
	sn, err := t.store.GetSnapshot(ctx, "", tp.Warm.Snapshot)
	return err == nil && sn.State == core.SnapshotReady
}

// prewarm starts a sandbox of tp (just named by a build), runs its start
// command in the background, polls its ready check until it passes, then
// snapshots the sandbox through the normal snapshot path (in projectID) and
// records the snapshot on the name. The sandbox is removed in every case;
// on failure so is the snapshot.
func (t *Templates) prewarm(ctx context.Context, projectID string, tp template.Template, progress func(string)) (WarmResult, template.Template, error) {
	var res WarmResult
	if t.svc == nil || t.engine == nil || t.node == nil {
		return res, tp, fmt.Errorf("pre-warm needs the in-process node: %w", core.ErrUnavailable)
	}
	t0 := time.Now()
	readyTimeout := t.readyTimeout
	if readyTimeout <= 0 {
		readyTimeout = prewarmReadyTimeout
	}
	timeout := int64(readyTimeout/time.Second) + 600
	sb, op, err := t.svc.Create(ctx, projectID, core.CreateRequest{Template: displayName(tp.Name), TemplateRef: tp.Name, TimeoutSeconds: &timeout,
		Metadata: map[string]string{"space.template.prewarm": tp.Name}}, "")
	if err != nil {
		return res, tp, fmt.Errorf("pre-warm sandbox: %w", err)
	}
	defer func() {
		// Removed whatever happened; the snapshot (if any) outlives it.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if dop, err := t.svc.Delete(dctx, projectID, sb.ID); err == nil {
			t.engine.Wait(dctx, projectID, dop.ID, time.Minute)
		} else if !errors.Is(err, core.ErrNotFound) {
			t.logf("template %s: remove pre-warm sandbox %s: %v", tp.Name, sb.ID, err)
		}
	}()
	if err := t.waitOp(ctx, projectID, op.ID, "pre-warm sandbox"); err != nil {
		return res, tp, err
	}
	h, err := t.node.Sandbox(sb.ID)
	if err != nil {
		return res, tp, fmt.Errorf("pre-warm sandbox: %w", err)
	}
	progress("prewarm: running the start command")
	start, err := h.Exec(ctx, agent.ProcessSpec{Argv: tp.Defaults.Cmd, Tag: "start"})
	if err != nil {
		return res, tp, fmt.Errorf("%w: pre-warm: start command: %w", core.ErrInvalid, err)
	}
	failedStart := func() error {
		if ex := start.Exit(); ex != nil && (ex.Code != 0 || ex.Signal != "" || ex.Error != "") {
			return fmt.Errorf("%w: pre-warm: the start command exited (code %d%s) before the template was ready; output:\n%s",
				core.ErrInvalid, ex.Code, signalText(ex), logTail(start.Log))
		}
		return nil
	}
	if len(tp.Defaults.Ready) == 0 {
		select {
		case <-time.After(prewarmSettle):
		case <-ctx.Done():
			return res, tp, ctx.Err()
		}
		if err := failedStart(); err != nil {
			return res, tp, err
		}
	} else {
		n, err := waitReady(ctx, h, start, tp.Defaults.Ready, readyTimeout, prewarmPoll, func(n int) {
			if n%10 == 1 {
				progress(fmt.Sprintf("prewarm: waiting for the ready check (%d checks)", n))
			}
		})
		res.ReadyChecks = n
		if err != nil {
			return res, tp, fmt.Errorf("pre-warm: %w", err)
		}
	}
	progress("prewarm: ready; snapshotting")
	snap, sop, err := t.svc.CreateSnapshot(ctx, projectID, sb.ID, "")
	if err != nil {
		return res, tp, fmt.Errorf("pre-warm snapshot: %w", err)
	}
	if err := t.waitOp(ctx, projectID, sop.ID, "pre-warm snapshot"); err != nil {
		return res, tp, err
	}
	if snap, err = t.store.GetSnapshot(ctx, projectID, snap.ID); err != nil {
		return res, tp, err
	}
	w := &template.Warm{Snapshot: snap.ID, Kind: snap.Kind, Processes: warmProcessesRerun, CreatedAt: time.Now().UTC()}
	if snap.Kind == core.SnapshotKindProcess {
		w.Processes = warmProcessesRestored
	}
	named, err := t.m.SetWarm(tp.Name, tp.Digest, w)
	if err != nil {
		t.dropSnapshot(ctx, projectID, snap.ID)
		return res, tp, mapTemplateErr(err)
	}
	res = WarmResult{Snapshot: snap.ID, Kind: snap.Kind, Processes: w.Processes, Seconds: time.Since(t0).Seconds(), ReadyChecks: res.ReadyChecks}
	return res, named, nil
}

// waitOp waits for an operation this server started and turns its failure
// into an error.
func (t *Templates) waitOp(ctx context.Context, projectID, id, what string) error {
	for {
		op, err := t.engine.Wait(ctx, projectID, id, time.Minute)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		switch op.State {
		case core.OpSucceeded:
			return nil
		case core.OpFailed, core.OpCancelled:
			msg := string(op.State)
			if op.Error != nil {
				msg = op.Error.Message
			}
			return fmt.Errorf("%s: %s: %w", what, msg, core.ErrUnavailable)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// dropSnapshot deletes a pre-warm snapshot nothing will use (best effort).
func (t *Templates) dropSnapshot(ctx context.Context, projectID, id string) {
	if _, err := t.svc.DeleteSnapshot(context.WithoutCancel(ctx), projectID, id); err != nil && !errors.Is(err, core.ErrNotFound) {
		t.logf("template: drop pre-warm snapshot %s: %v", id, err)
	}
}

// runCheck runs the ready check once: passed, its output tail.
func runCheck(ctx context.Context, h *node.Sandbox, argv []string) (bool, string, error) {
	c, err := h.Exec(ctx, agent.ProcessSpec{Argv: argv, Tag: "ready", TimeoutMs: prewarmCheckTimeout.Milliseconds()})
	if err != nil {
		return false, "", err
	}
	deadline := time.Now().Add(prewarmCheckTimeout + 5*time.Second)
	for c.Exit() == nil {
		if time.Now().After(deadline) {
			return false, "", errors.New("the ready check never reported its exit")
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return false, "", ctx.Err()
		}
	}
	ex := c.Exit()
	out := logTail(c.Log)
	if ex.Code == 0 && ex.Signal == "" && ex.Error == "" {
		return true, out, nil
	}
	return false, fmt.Sprintf("exit code %d%s\n%s", ex.Code, signalText(ex), out), nil
}

func signalText(ex *agent.Exit) string {
	s := ""
	if ex.Signal != "" {
		s += ", signal " + ex.Signal
	}
	if ex.Error != "" {
		s += ", " + ex.Error
	}
	return s
}

// logTail is the last 4 KiB of a command's recorded output so far.
func logTail(l *execlog.Log) string {
	const max = 4096
	r, err := l.NewReader(0)
	if err != nil {
		return ""
	}
	var b []byte
	for r.Ready() {
		rec, err := r.Next(context.Background())
		if err != nil {
			break
		}
		if rec.Type == execlog.Stdout || rec.Type == execlog.Stderr {
			b = append(b, rec.Data...)
			if len(b) > 2*max {
				b = append(b[:0], b[len(b)-max:]...)
			}
		}
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.ToValidUTF8(string(b), "�")
}

// WarmSnapshot implements core.WarmTemplates: the template's pre-warmed
// snapshot while it is ready ("" otherwise: the create starts cold).
func (r *runtime) WarmSnapshot(ctx context.Context, name string) string {
	tp, err := r.t.m.Get(name)
	if err != nil || !r.t.warmUsable(ctx, tp) {
		return ""
	}
	return tp.Warm.Snapshot
}

// StartSandboxFromSnapshot restores sb; when the restored snapshot (the
// template's warm snapshot, a snapshot sb was forked from, or sb's own
// hibernation) holds files only, the template's start command is run
// again (in the background, as the sandbox's command 1) since its
// processes were not captured, and its ready check is waited for.
func (r *runtime) StartSandboxFromSnapshot(ctx context.Context, sb core.Sandbox, chain []string, progress core.Progress) (core.Placement, error) {
	r.t.noteStarted(sb.ID, sb.TemplateKey())
	pl, err := r.Node.StartSandboxFromSnapshot(ctx, sb, chain, progress)
	if err != nil {
		return pl, err
	}
	tp, terr := r.t.m.Get(sb.TemplateKey())
	if terr != nil || len(tp.Defaults.Cmd) == 0 || r.processesRestored(ctx, sb, tp) {
		return pl, nil
	}
	progress(90, "running the start command (the snapshot holds files only)")
	if err := r.runStart(ctx, sb, tp, progress); err != nil {
		if serr := r.Node.StopSandbox(context.WithoutCancel(ctx), sb.ID); serr != nil {
			r.t.logf("sandbox %s: stop after failed start command: %v", sb.ID, serr)
		}
		return core.Placement{}, err
	}
	return pl, nil
}

// processesRestored reports whether the snapshot sb is restored from
// captured its processes (so the start command is still running).
func (r *runtime) processesRestored(ctx context.Context, sb core.Sandbox, tp template.Template) bool {
	id := sb.Snapshot
	if sb.State == core.SandboxHibernated && sb.HibernatedSnapshot != "" {
		id = sb.HibernatedSnapshot
	}
	if tp.Warm != nil && tp.Warm.Snapshot == id {
		return tp.Warm.Kind == core.SnapshotKindProcess
	}
	if id == "" || r.t.store == nil {
		return false
	}
	sn, err := r.t.store.GetSnapshot(ctx, "", id)
	return err == nil && sn.Kind == core.SnapshotKindProcess
}
