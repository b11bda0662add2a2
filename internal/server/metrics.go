package server

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/metrics"
)

// MetricsConfig configures Prometheus metrics. Every server and node keeps
// them; they are served on the control API to admin keys (GET /metrics)
// and, with Listen, on an operator listener.
type MetricsConfig struct {
	// Listen, if set, serves GET /metrics on this address without
	// authentication (--metrics-listen): keep it on a private address.
	Listen string
	// Registry receives the metrics; nil: a new one per Start. (There is no
	// global registry: a test passes its own to read it.)
	Registry *prometheus.Registry
}

// newMetrics makes the process's metrics on cfg's registry.
func newMetrics(cfg Config) *metrics.Metrics {
	reg := cfg.Metrics.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	return metrics.New(reg)
}

// startMetrics hooks the metrics into a server's parts once they exist,
// before its listeners serve: the sandboxes gauge over the store (those of
// nodeName, or of every node with remote nodes), the in-process node, the
// egress gateway, builtin template builds, the data plane, GET /metrics on
// the control API (admin keys), and the operator listener, which stops
// with ctx.
func (s *Server) startMetrics(ctx context.Context, m *metrics.Metrics, nodeName, driverName string, keys *auth.Keys) error {
	m.WatchSandboxes(s.store, nodeName, driverName)
	if s.node != nil {
		m.WatchNode(s.node)
	}
	if s.net != nil {
		m.WatchEgress(s.net.GW)
	}
	if s.templates != nil {
		s.templates.onBuild = m.TemplateBuilt
	}
	if s.data != nil {
		s.data.Handler = m.DataPlane(s.data.Handler)
	}
	s.ctrl.Handler = m.ControlAPI(s.ctrl.Handler, keys, s.audit)
	return listenMetrics(ctx, &s.wg, s.cfg.Metrics.Listen, m, s.cfg.Logf)
}

// startMetrics hooks the metrics into a `space node`: its node, egress
// gateway, builtin template builds and data plane, and the operator
// listener (a node has no control API: that is where it is scraped).
func (p *NodeProcess) startMetrics(ctx context.Context, m *metrics.Metrics) error {
	m.WatchNode(p.node)
	if p.net != nil {
		m.WatchEgress(p.net.GW)
	}
	p.templates.onBuild = m.TemplateBuilt
	p.data.Handler = m.DataPlane(p.data.Handler)
	return listenMetrics(ctx, &p.wg, p.cfg.Metrics.Listen, m, p.cfg.Logf)
}

func listenMetrics(ctx context.Context, wg *sync.WaitGroup, addr string, m *metrics.Metrics, logf func(string, ...any)) error {
	if addr == "" {
		return nil
	}
	at, err := m.Serve(ctx, wg, addr, logf)
	if err != nil {
		return err
	}
	logf("metrics: Prometheus metrics on http://%s/metrics", at)
	return nil
}
