package client

import (
	"context"
	"fmt"
	"net/http"

	"github.com/space-sandbox/space/internal/agent"
)

// maxMetricBytes bounds a byte figure the agent reports (1 EiB): beyond it
// the answer is nonsense, not a big sandbox.
const maxMetricBytes = 1 << 60

// Metrics returns what the sandbox sees of its CPU, memory and disk. The
// figures are the untrusted sandbox's word: the node prefers its own
// (cgroup) figures where the driver has them, and clamps these.
func (c *Client) Metrics(ctx context.Context) (agent.Metrics, error) {
	var m agent.Metrics
	if err := c.doJSON(ctx, http.MethodGet, "/v1/metrics", nil, nil, &m, http.StatusOK); err != nil {
		return m, err
	}
	if m.CPUCount < 0 || m.CPUCount > 4096 {
		return agent.Metrics{}, fmt.Errorf("agent: metrics: cpu count %d", m.CPUCount)
	}
	for _, v := range []int64{m.MemTotal, m.MemUsed, m.MemCache, m.DiskTotal, m.DiskUsed} {
		if v < 0 || v > maxMetricBytes {
			return agent.Metrics{}, fmt.Errorf("agent: metrics: figure %d out of range", v)
		}
	}
	return m, nil
}
