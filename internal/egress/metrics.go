package egress

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// metrics are node-wide totals of every sandbox's gateway activity, kept
// across sandboxes coming and going, for Prometheus. Per-sandbox detail is
// in the decision log; labels here are bounded (proto, verdict, reason).
type metrics struct {
	mu        sync.Mutex
	totals    Stats
	decisions map[[3]string]uint64
}

func (m *metrics) add(f func(*Stats)) {
	m.mu.Lock()
	f(&m.totals)
	m.mu.Unlock()
}

func (m *metrics) decision(d Decision) {
	m.mu.Lock()
	if m.decisions == nil {
		m.decisions = map[[3]string]uint64{}
	}
	m.decisions[[3]string{d.Proto, d.Verdict, d.Reason}]++
	m.mu.Unlock()
}

// WriteMetrics writes the gateway's counters in the Prometheus text format.
func (g *Gateway) WriteMetrics(w io.Writer) error {
	g.mu.Lock()
	n := len(g.sbx)
	g.mu.Unlock()
	m := &g.metrics
	m.mu.Lock()
	t := m.totals
	keys := make([][3]string, 0, len(m.decisions))
	for k := range m.decisions {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return strings.Join(keys[i][:], "\x00") < strings.Join(keys[j][:], "\x00") })
	vals := make([]uint64, len(keys))
	for i, k := range keys {
		vals[i] = m.decisions[k]
	}
	m.mu.Unlock()
	var b strings.Builder
	gauge := func(name, help string, v uint64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v)
	}
	counter := func(name, help string, v uint64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	gauge("space_egress_sandboxes", "Sandboxes the gateway serves.", uint64(n))
	counter("space_egress_upstream_sockets_total", "Upstream connects and DNS queries made for sandboxes.", t.UpstreamSockets)
	counter("space_egress_dns_queries_total", "DNS queries from sandboxes.", t.DNSQueries)
	counter("space_egress_dns_refused_total", "DNS queries refused.", t.DNSRefused)
	counter("space_egress_connections_allowed_total", "Connections and requests allowed.", t.ConnsAllowed)
	counter("space_egress_connections_denied_total", "Connections and requests denied.", t.ConnsDenied)
	b.WriteString("# HELP space_egress_decisions_total Gateway decisions by protocol, verdict and reason.\n# TYPE space_egress_decisions_total counter\n")
	for i, k := range keys {
		fmt.Fprintf(&b, "space_egress_decisions_total{proto=%q,verdict=%q,reason=%q} %d\n", k[0], k[1], k[2], vals[i])
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// MetricsHandler serves WriteMetrics (for a private metrics listener).
func (g *Gateway) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		g.WriteMetrics(w)
	})
}
