package cluster

// Auto-pause across nodes: a node knows how long each of its sandboxes has
// been idle (no data-plane call, no command running); the replica that
// runs the auto-pause sweep asks it.

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// PathIdle reports how long a sandbox on the node has been idle.
const PathIdle = "/node/v1/idle"

type idleResp struct {
	IdleMillis int64 `json:"idle_ms"`
	Known      bool  `json:"known"`
}

func (h *Handler) idleRoutes() {
	ir, _ := h.b.(core.IdleRuntime)
	h.route(PathIdle, func(ctx context.Context, body []byte) (any, error) {
		var r idReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.ID) {
			return nil, fmt.Errorf("sandbox id %.40q: %w", r.ID, core.ErrInvalid)
		}
		if ir == nil {
			return idleResp{}, nil
		}
		d, ok := ir.IdleFor(r.ID)
		return idleResp{IdleMillis: d.Milliseconds(), Known: ok}, nil
	})
}

// Idle asks the node how long a sandbox has been idle.
func (c *Client) Idle(ctx context.Context, id string) (time.Duration, bool, error) {
	var out idleResp
	err := c.call(ctx, PathIdle, idReq{ID: id}, &out)
	return time.Duration(out.IdleMillis) * time.Millisecond, out.Known, err
}

var _ core.IdleRuntime = (*Remote)(nil)

// IdleFor implements core.IdleRuntime from the sandbox's node (false when
// it cannot be asked: nothing is paused on a guess).
func (r *Remote) IdleFor(id string) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d time.Duration
	var known bool
	err := r.onNode(ctx, id, func(c *Client) error {
		var err error
		d, known, err = c.Idle(ctx, id)
		return err
	})
	return d, err == nil && known
}
