package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// MonitorOptions configure a server replica's monitor.
type MonitorOptions struct {
	Store   core.Store // must implement core.NodeStore
	Service *core.Service
	// Name is this replica's name (its operations' owner).
	Name string
	// Timeout: a node or replica whose heartbeat is older is lost.
	Timeout time.Duration
	// Interval between this replica's heartbeats and checks (default Timeout/5).
	Interval time.Duration
	Logf     func(string, ...any)
	Now      func() time.Time
}

// Monitor heartbeats a server replica and watches every registered
// process: a node that stops heartbeating is marked lost and its
// sandboxes are reported lost; a replica that does is marked lost and its
// unfinished operations are failed (their sandboxes settled). Of several
// replicas watching, one acts on each loss (core.NodeStore.MarkNodeLost).
type Monitor struct {
	o  MonitorOptions
	ns core.NodeStore
	oo core.OwnedOperations
	at time.Time
}

// NewMonitor returns a monitor; Run starts it.
func NewMonitor(o MonitorOptions) (*Monitor, error) {
	ns, ok := o.Store.(core.NodeStore)
	if !ok {
		return nil, fmt.Errorf("remote nodes: the store keeps no node registry: %w", core.ErrInvalid)
	}
	oo, _ := o.Store.(core.OwnedOperations)
	if o.Timeout <= 0 {
		o.Timeout = 15 * time.Second
	}
	if o.Interval <= 0 {
		o.Interval = o.Timeout / 5
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Monitor{o: o, ns: ns, oo: oo, at: o.Now().UTC()}, nil
}

// Heartbeat stores this replica's record once.
func (m *Monitor) Heartbeat(ctx context.Context) error {
	prev, err := m.ns.PutNode(ctx, core.NodeRecord{Name: m.o.Name, Kind: core.NodeKindServer, StartedAt: m.at, HeartbeatAt: m.o.Now().UTC()})
	if err != nil {
		return err
	}
	if prev.State == core.NodeLost {
		m.o.Logf("cluster: this replica (%s) had been marked lost (%s); its unfinished operations were failed", m.o.Name, prev.StateReason)
	}
	return nil
}

// Check marks every process whose heartbeat is too old lost, once.
func (m *Monitor) Check(ctx context.Context) {
	nodes, err := m.ns.ListNodes(ctx)
	if err != nil {
		m.o.Logf("cluster: list nodes: %v", err)
		return
	}
	now := m.o.Now().UTC()
	for _, n := range nodes {
		if n.State != core.NodeReady || n.Name == m.o.Name || now.Sub(n.HeartbeatAt) <= m.o.Timeout {
			continue
		}
		reason := fmt.Sprintf("%s %s stopped heartbeating (last at %s, timeout %v)", n.Kind, n.Name, n.HeartbeatAt.Format(time.RFC3339Nano), m.o.Timeout)
		done, err := m.ns.MarkNodeLost(ctx, n.Name, now.Add(-m.o.Timeout), reason)
		if err != nil {
			m.o.Logf("cluster: mark %s lost: %v", n.Name, err)
			continue
		}
		if !done {
			continue // another replica got there first, or it came back
		}
		m.o.Logf("cluster: %s", reason)
		switch n.Kind {
		case core.NodeKindNode:
			c, err := m.o.Service.MarkNodeSandboxesLost(ctx, n.Name, "node lost: "+reason)
			if err != nil {
				m.o.Logf("cluster: sandboxes of %s: %v", n.Name, err)
			}
			m.o.Logf("cluster: %d sandboxes of node %s reported lost", c, n.Name)
		case core.NodeKindServer:
			if m.oo == nil {
				continue
			}
			ops, err := m.oo.UnfinishedOperationsOf(ctx, n.Name)
			if err != nil {
				m.o.Logf("cluster: operations of %s: %v", n.Name, err)
				continue
			}
			m.o.Service.FailOrphanOperations(ctx, ops, "server replica lost while this operation ran: "+reason)
			m.o.Logf("cluster: %d unfinished operations of replica %s failed", len(ops), n.Name)
		}
	}
}

// settleStale settles this replica's operations that its engine no longer
// runs but the store still shows unfinished (their end was not stored).
func (m *Monitor) settleStale(ctx context.Context) {
	if m.oo == nil {
		return
	}
	ops, err := m.oo.UnfinishedOperationsOf(ctx, m.o.Name)
	if err != nil {
		return // the store is down: the next tick tries again
	}
	if n := m.o.Service.SettleStaleOperations(ctx, ops, 2*m.o.Interval); n > 0 {
		m.o.Logf("cluster: settled %d operations of this replica whose end was not stored", n)
	}
}

// Run heartbeats and checks every interval until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	t := time.NewTicker(m.o.Interval)
	defer t.Stop()
	for {
		if err := m.Heartbeat(ctx); err != nil && ctx.Err() == nil {
			m.o.Logf("cluster: heartbeat: %v", err)
		}
		m.Check(ctx)
		m.settleStale(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
