package server

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/template"
)

// createReadyPoll is the pause between a create's ready checks: short,
// since a create waits on it.
const createReadyPoll = 50 * time.Millisecond

// waitReady polls the ready check in h until it passes, the start command
// exits, timeout passes or ctx ends. It returns the number of checks run.
func waitReady(ctx context.Context, h *node.Sandbox, start *node.Command, ready []string, timeout, poll time.Duration, onCheck func(n int)) (int, error) {
	deadline := time.Now().Add(timeout)
	var last string
	for n := 1; ; n++ {
		if ex := start.Exit(); ex != nil {
			return n - 1, fmt.Errorf("%w: the start command exited (code %d%s) before the ready check passed; output:\n%s",
				core.ErrInvalid, ex.Code, signalText(ex), logTail(start.Log))
		}
		ok, out, err := runCheck(ctx, h, ready)
		if err != nil {
			return n, fmt.Errorf("ready check: %w", err)
		}
		if ok {
			return n, nil
		}
		last = out
		if time.Now().After(deadline) {
			return n, fmt.Errorf("%w: the ready check did not pass within %s (%d checks); its last output:\n%s",
				core.ErrInvalid, timeout, n, last)
		}
		if onCheck != nil {
			onCheck(n)
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			return n, ctx.Err()
		}
	}
}

// runStart runs tp's start command in the new sandbox sb (in the
// background, as its command 1) and, when the template has a ready check,
// waits for it: the sandbox is handed out ready, so a client's first
// request (the code interpreter's first runCode) does not race the
// server the start command brings up. Pre-warm sandboxes are left alone:
// the pre-warm runs the start command itself.
func (r *runtime) runStart(ctx context.Context, sb core.Sandbox, tp template.Template, progress core.Progress) error {
	if len(tp.Defaults.Cmd) == 0 || sb.Metadata["space.template.prewarm"] != "" {
		return nil
	}
	h, err := r.Node.Sandbox(sb.ID)
	if err != nil {
		return fmt.Errorf("run the template's start command: %w", err)
	}
	start, err := h.Exec(ctx, agent.ProcessSpec{Argv: tp.Defaults.Cmd, Tag: "start"})
	if err != nil {
		return fmt.Errorf("run the template's start command: %w", err)
	}
	if len(tp.Defaults.Ready) == 0 {
		return nil
	}
	progress(90, "start command running; waiting for the template's ready check")
	timeout := r.t.readyTimeout
	if timeout <= 0 {
		timeout = prewarmReadyTimeout
	}
	if _, err := waitReady(ctx, h, start, tp.Defaults.Ready, timeout, createReadyPoll, nil); err != nil {
		return fmt.Errorf("template %s: %w", displayName(tp.Name), err)
	}
	return nil
}
