package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver"
)

// Resource sampling: every metricInterval the node samples each running
// sandbox (driver cgroup figures where the driver has them, the agent's
// view otherwise; disk always from the agent) into a ring of metricKeep
// samples, so that a metrics call can answer a time range and a CPU
// percentage (which needs two samples). A call adds a fresh sample.
const (
	metricInterval = 5 * time.Second
	metricKeep     = 180 // 15 minutes
	metricTimeout  = 2 * time.Second
	metricWorkers  = 8
	// metricMinGap: a fresh sample closer than this to the last one would
	// make a noisy percentage; the last one is answered instead.
	metricMinGap = time.Second
)

// metricRing is one sandbox's samples and the raw counters of the newest.
type metricRing struct {
	mu      sync.Mutex // held while sampling: one sample at a time
	samples []core.SandboxMetric
	last    rawSample
}

// rawSample holds the cumulative counters a percentage is computed from.
type rawSample struct {
	at  time.Time
	ok  bool
	cgr bool   // cpu from the cgroup (else the agent's /proc/stat)
	cpu uint64 // cgroup usage, or /proc/stat busy
	tot uint64 // /proc/stat total (agent only)
}

// metricsState is the node's rings, by sandbox id.
type metricsState struct {
	mu    sync.Mutex
	rings map[string]*metricRing
}

// startSampler runs the periodic sampler until the node closes.
func (n *Node) startSampler() {
	n.metrics = &metricsState{rings: map[string]*metricRing{}}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		t := time.NewTicker(metricInterval)
		defer t.Stop()
		for {
			select {
			case <-n.ctx.Done():
				return
			case <-t.C:
				n.sampleAll(n.ctx)
			}
		}
	}()
}

// ring returns sandbox id's ring, creating it.
func (m *metricsState) ring(id string) *metricRing {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.rings[id]
	if r == nil {
		r = &metricRing{}
		m.rings[id] = r
	}
	return r
}

// sampleAll samples every running, unpaused sandbox (metricWorkers at a
// time) and drops the rings of sandboxes the node no longer runs.
func (n *Node) sampleAll(ctx context.Context) {
	n.mu.Lock()
	hs := make([]*Sandbox, 0, len(n.sandboxes))
	for _, h := range n.sandboxes {
		if !h.paused.Load() {
			hs = append(hs, h)
		}
	}
	live := make(map[string]bool, len(n.sandboxes))
	for id := range n.sandboxes {
		live[id] = true
	}
	n.mu.Unlock()
	n.metrics.mu.Lock()
	for id := range n.metrics.rings {
		if !live[id] {
			delete(n.metrics.rings, id)
		}
	}
	n.metrics.mu.Unlock()
	work := make(chan *Sandbox)
	var wg sync.WaitGroup
	for range min(metricWorkers, len(hs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for h := range work {
				r := n.metrics.ring(h.ID)
				r.mu.Lock()
				if _, err := r.sample(ctx, h, time.Now()); err != nil && ctx.Err() == nil && !h.gone.Load() {
					n.o.Logf("sandbox %s: metrics sample: %v", h.ID, err)
				}
				r.mu.Unlock()
			}
		}()
	}
	for _, h := range hs {
		select {
		case work <- h:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
}

// sample takes one sample of h and appends it to the ring (r.mu held).
func (r *metricRing) sample(ctx context.Context, h *Sandbox, now time.Time) (core.SandboxMetric, error) {
	ctx, cancel := context.WithTimeout(ctx, metricTimeout)
	defer cancel()
	var ds driver.Stats
	statser, hasStats := driver.As[driver.Statser](h.inst)
	if hasStats {
		var err error
		if ds, err = statser.Stats(ctx); err != nil {
			hasStats = false
		}
	}
	am, aerr := h.Agent.Metrics(ctx)
	if aerr != nil && !hasStats {
		return core.SandboxMetric{}, fmt.Errorf("agent: %w", aerr)
	}
	m := core.SandboxMetric{Timestamp: now.UTC(), CPUCount: max(am.CPUCount, 1),
		MemUsed: am.MemUsed, MemTotal: am.MemTotal, MemCache: am.MemCache, DiskUsed: am.DiskUsed, DiskTotal: am.DiskTotal}
	cpus := float64(m.CPUCount)
	raw := rawSample{at: now, ok: true, cpu: am.CPUBusyNs, tot: am.CPUTotalNs}
	if hasStats {
		m.MemUsed, m.MemCache = ds.MemUsedBytes, ds.MemCacheBytes
		if ds.MemLimitBytes > 0 {
			m.MemTotal = ds.MemLimitBytes
		}
		if ds.CPULimitMillis > 0 {
			cpus = float64(ds.CPULimitMillis) / 1000
			m.CPUCount = int((ds.CPULimitMillis + 999) / 1000)
		}
		if !ds.CPUUnknown {
			raw.cgr, raw.cpu, raw.tot = true, ds.CPUUsageNs, 0
		}
	}
	if raw.cgr || aerr == nil {
		m.CPUUsedPct = cpuPct(r.last, raw, cpus)
		r.last = raw
	}
	if len(r.samples) >= metricKeep {
		r.samples = append(r.samples[:0], r.samples[len(r.samples)-metricKeep+1:]...)
	}
	r.samples = append(r.samples, m)
	return m, nil
}

// cpuPct is the CPU used between two samples in percent of cpus CPUs.
func cpuPct(prev, cur rawSample, cpus float64) float64 {
	if !prev.ok || prev.cgr != cur.cgr || cur.cpu < prev.cpu {
		return 0
	}
	var pct float64
	if cur.cgr {
		wall := cur.at.Sub(prev.at)
		if wall <= 0 || cpus <= 0 {
			return 0
		}
		pct = float64(cur.cpu-prev.cpu) / (float64(wall.Nanoseconds()) * cpus) * 100
	} else {
		if cur.tot <= prev.tot {
			return 0
		}
		pct = float64(cur.cpu-prev.cpu) / float64(cur.tot-prev.tot) * 100
	}
	return min(max(pct, 0), 100)
}

// SandboxMetrics implements core.MetricsRuntime: the stored samples in
// [start, end] (zero: unbounded) plus, for a running sandbox, a fresh one.
func (n *Node) SandboxMetrics(ctx context.Context, id string, start, end time.Time) ([]core.SandboxMetric, error) {
	n.mu.Lock()
	h := n.sandboxes[id]
	n.mu.Unlock()
	if h == nil {
		return nil, fmt.Errorf("sandbox %s is not running here: %w", id, core.ErrNotFound)
	}
	r := n.metrics.ring(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if !h.paused.Load() && (end.IsZero() || !end.Before(now.Add(-time.Second))) && now.Sub(r.last.at) >= metricMinGap {
		if _, err := r.sample(ctx, h, now); err != nil {
			if errors.Is(err, context.Canceled) {
				return nil, err
			}
			n.o.Logf("sandbox %s: metrics sample: %v", id, err)
		}
	}
	out := []core.SandboxMetric{}
	for _, m := range r.samples {
		// The SDK's range is in whole seconds: end is inclusive.
		if !start.IsZero() && m.Timestamp.Before(start.Truncate(time.Second)) {
			continue
		}
		if !end.IsZero() && !m.Timestamp.Before(end.Truncate(time.Second).Add(time.Second)) {
			continue
		}
		out = append(out, m)
	}
	return out, nil
}

var _ core.MetricsRuntime = (*Node)(nil)
