package egress

// MetricsSnapshot returns what WriteMetrics writes, as values: the number
// of sandboxes the gateway serves, its node-wide totals and its decisions
// counted by (proto, verdict, reason). internal/metrics turns them into
// Prometheus collectors of the same names.
func (g *Gateway) MetricsSnapshot() (sandboxes int, totals Stats, decisions map[[3]string]uint64) {
	g.mu.Lock()
	sandboxes = len(g.sbx)
	g.mu.Unlock()
	m := &g.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	decisions = make(map[[3]string]uint64, len(m.decisions))
	for k, v := range m.decisions {
		decisions[k] = v
	}
	return sandboxes, m.totals, decisions
}
