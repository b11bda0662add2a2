package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// PathMetrics is the node RPC that returns a sandbox's resource samples.
const PathMetrics = "/node/v1/metrics"

type metricsReq struct {
	ID    string    `json:"id"`
	Start time.Time `json:"start,omitzero"`
	End   time.Time `json:"end,omitzero"`
}

type metricsResp struct {
	Metrics []core.SandboxMetric `json:"metrics"`
}

// metricsRoutes adds PathMetrics; a backend without metrics answers
// unavailable.
func (h *Handler) metricsRoutes() {
	mb, _ := h.b.(core.MetricsRuntime)
	h.route(PathMetrics, func(ctx context.Context, body []byte) (any, error) {
		var r metricsReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.ID) {
			return nil, fmt.Errorf("sandbox id %.40q: %w", r.ID, core.ErrInvalid)
		}
		if mb == nil {
			return nil, fmt.Errorf("this node keeps no sandbox metrics: %w", core.ErrUnavailable)
		}
		list, err := mb.SandboxMetrics(ctx, r.ID, r.Start, r.End)
		if len(list) > core.MaxMetrics {
			list = list[len(list)-core.MaxMetrics:]
		}
		return metricsResp{Metrics: list}, err
	})
}

// SandboxMetrics asks the node for a sandbox's samples.
func (c *Client) SandboxMetrics(ctx context.Context, id string, start, end time.Time) ([]core.SandboxMetric, error) {
	var out metricsResp
	if err := c.call(ctx, PathMetrics, metricsReq{ID: id, Start: start, End: end}, &out); err != nil {
		return nil, err
	}
	if len(out.Metrics) > core.MaxMetrics {
		return nil, fmt.Errorf("node answered %d samples: %w", len(out.Metrics), core.ErrUnavailable)
	}
	return out.Metrics, nil
}

// SandboxMetrics implements core.MetricsRuntime on the sandbox's node.
func (r *Remote) SandboxMetrics(ctx context.Context, id string, start, end time.Time) ([]core.SandboxMetric, error) {
	var out []core.SandboxMetric
	err := r.onNode(ctx, id, func(c *Client) error {
		var err error
		out, err = c.SandboxMetrics(ctx, id, start, end)
		return err
	})
	return out, err
}

var _ core.MetricsRuntime = (*Remote)(nil)
