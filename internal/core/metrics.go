package core

import (
	"context"
	"fmt"
	"time"
)

// SandboxMetric is one sample of a sandbox's resource use: what the host
// charges it for (CPU, memory) where the driver can say, else what the
// sandbox itself sees; disk is always the sandbox's own view of "/".
type SandboxMetric struct {
	Timestamp time.Time `json:"timestamp"`
	CPUCount  int       `json:"cpu_count"`
	// CPUUsedPct is the CPU used since the previous sample, in percent of
	// CPUCount CPUs (0..100).
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemUsed    int64   `json:"mem_used"`  // bytes, page cache excluded
	MemTotal   int64   `json:"mem_total"` // the memory limit, else what the sandbox sees
	MemCache   int64   `json:"mem_cache"` // page cache
	DiskUsed   int64   `json:"disk_used"`
	DiskTotal  int64   `json:"disk_total"`
}

// MaxMetrics bounds the samples one metrics call returns.
const MaxMetrics = 1000

// MetricsRuntime is implemented by runtimes that sample their sandboxes'
// resource use (the node keeps a bounded ring per sandbox).
type MetricsRuntime interface {
	// SandboxMetrics returns the samples of sandbox id taken in
	// [start, end] (zero: unbounded), oldest first, plus a fresh one when
	// the sandbox runs and end is not in the past. A sandbox the runtime
	// does not run is ErrNotFound.
	SandboxMetrics(ctx context.Context, id string, start, end time.Time) ([]SandboxMetric, error)
}

// Metrics returns a project's sandbox's resource samples in [start, end].
// A paused sandbox answers the samples taken before it was paused (no new
// ones: it uses nothing); a hibernated, creating or ended one has none.
func (s *Service) Metrics(ctx context.Context, projectID, id string, start, end time.Time) ([]SandboxMetric, error) {
	sb, err := s.getLocal(ctx, projectID, id)
	if err != nil {
		return nil, err
	}
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		return nil, invalid("end is before start")
	}
	if sb.State != SandboxRunning && sb.State != SandboxPaused {
		return []SandboxMetric{}, nil
	}
	mr, ok := s.runtime.(MetricsRuntime)
	if !ok {
		return nil, fmt.Errorf("this server's runtime keeps no sandbox metrics: %w", ErrUnavailable)
	}
	out, err := mr.SandboxMetrics(ctx, sb.ID, start, end)
	if err != nil {
		return nil, err
	}
	if len(out) > MaxMetrics {
		out = out[len(out)-MaxMetrics:]
	}
	return out, nil
}
