package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/node"
)

// liveStates are the sandbox states space_sandboxes reports. Terminal
// states (deleted, failed, lost) are left out: their records stay in the
// store, so counting them would grow without bound; operations by result
// count how sandboxes end.
var liveStates = []core.SandboxState{core.SandboxCreating, core.SandboxRunning, core.SandboxPaused,
	core.SandboxHibernated, core.SandboxDeleting, core.SandboxRestarting}

// WatchSandboxes reports space_sandboxes{state,driver}: the live sandboxes
// in st, read at each scrape (pages of 500). With nodeName set only the
// sandboxes of that node (this server's own); "" counts every node's (a
// server with remote nodes: every replica then reports the same numbers).
// driver names the series reported as 0 when there is no sandbox.
func (m *Metrics) WatchSandboxes(st core.Store, nodeName, driver string) {
	m.reg.MustRegister(&sandboxCollector{st: st, node: nodeName, driver: driver,
		desc: prometheus.NewDesc("space_sandboxes", "Live sandboxes in the store, by state and driver (\"\" while not yet placed).", []string{"state", "driver"}, nil)})
}

type sandboxCollector struct {
	st           core.Store
	node, driver string
	desc         *prometheus.Desc
}

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts := map[[2]string]int{}
	for _, s := range liveStates {
		counts[[2]string{string(s), c.driver}] = 0
	}
	after := ""
	for {
		page, err := c.st.ListSandboxes(ctx, core.SandboxFilter{States: liveStates, After: after, Limit: 500})
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.desc, fmt.Errorf("list sandboxes: %w", err))
			return
		}
		for _, sb := range page {
			if c.node != "" && sb.Node != "" && sb.Node != c.node {
				continue
			}
			counts[[2]string{string(sb.State), sb.Driver}]++
		}
		if len(page) < 500 {
			break
		}
		after = page[len(page)-1].ID
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

// WatchNode reports what a node runs: space_node_sandboxes{driver,state}
// (its instances, running or paused) and space_warm_pool_ready{template}.
func (m *Metrics) WatchNode(n *node.Node) {
	m.reg.MustRegister(&nodeCollector{n: n,
		sandboxes: prometheus.NewDesc("space_node_sandboxes", "Sandbox instances this node runs, by driver and state (running, paused).", []string{"driver", "state"}, nil),
		warm:      prometheus.NewDesc("space_warm_pool_ready", "Warm instances waiting, by template.", []string{"template"}, nil)})
}

type nodeCollector struct {
	n               *node.Node
	sandboxes, warm *prometheus.Desc
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.sandboxes; ch <- c.warm }

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	cnt := c.n.Counts()
	d := c.n.DriverName()
	ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(cnt.Running), d, "running")
	ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(cnt.Paused), d, "paused")
	for t, k := range cnt.Warm {
		ch <- prometheus.MustNewConstMetric(c.warm, prometheus.GaugeValue, float64(k), t)
	}
}

// WatchEgress bridges the egress gateway's own counters (what
// --egress-metrics serves, internal/egress/metrics.go) into the registry
// under the same names, read at each scrape.
func (m *Metrics) WatchEgress(gw *egress.Gateway) {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	m.reg.MustRegister(&egressCollector{gw: gw,
		sandboxes:  d("space_egress_sandboxes", "Sandboxes the gateway serves."),
		upstream:   d("space_egress_upstream_sockets_total", "Upstream connects and DNS queries made for sandboxes."),
		dnsQueries: d("space_egress_dns_queries_total", "DNS queries from sandboxes."),
		dnsRefused: d("space_egress_dns_refused_total", "DNS queries refused."),
		allowed:    d("space_egress_connections_allowed_total", "Connections and requests allowed."),
		denied:     d("space_egress_connections_denied_total", "Connections and requests denied."),
		decisions:  d("space_egress_decisions_total", "Gateway decisions by protocol, verdict and reason.", "proto", "verdict", "reason"),
	})
}

type egressCollector struct {
	gw                                                                      *egress.Gateway
	sandboxes, upstream, dnsQueries, dnsRefused, allowed, denied, decisions *prometheus.Desc
}

func (c *egressCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.sandboxes, c.upstream, c.dnsQueries, c.dnsRefused, c.allowed, c.denied, c.decisions} {
		ch <- d
	}
}

func (c *egressCollector) Collect(ch chan<- prometheus.Metric) {
	n, t, dec := c.gw.MetricsSnapshot()
	ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(n))
	for _, v := range []struct {
		d *prometheus.Desc
		n uint64
	}{{c.upstream, t.UpstreamSockets}, {c.dnsQueries, t.DNSQueries}, {c.dnsRefused, t.DNSRefused},
		{c.allowed, t.ConnsAllowed}, {c.denied, t.ConnsDenied}} {
		ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n))
	}
	for k, v := range dec {
		ch <- prometheus.MustNewConstMetric(c.decisions, prometheus.CounterValue, float64(v), k[0], k[1], k[2])
	}
}
