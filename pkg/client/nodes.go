package client

import (
	"context"
	"net/http"
	"time"
)

// Node is one registered process of a cluster with remote nodes: a
// `space node` (kind "node") or a server replica (kind "server").
type Node struct {
	Name            string     `json:"name"`
	Kind            string     `json:"kind"`
	State           string     `json:"state"`
	StateReason     string     `json:"state_reason,omitempty"`
	DataURL         string     `json:"data_url,omitempty"`
	Driver          string     `json:"driver,omitempty"`
	CPUMillis       int64      `json:"cpu_millis,omitempty"`
	MemoryBytes     int64      `json:"memory_bytes,omitempty"`
	UsedCPUMillis   int64      `json:"used_cpu_millis,omitempty"`
	UsedMemoryBytes int64      `json:"used_memory_bytes,omitempty"`
	Sandboxes       int        `json:"sandboxes"`
	SnapshotStore   string     `json:"snapshot_store,omitempty"`
	HeartbeatAt     time.Time  `json:"heartbeat_at"`
	Drained         bool       `json:"drained,omitempty"`
	DrainedAt       *time.Time `json:"drained_at,omitempty"`
}

// DrainResult is the result of a node.drain operation
// (Operation.Result).
type DrainResult struct {
	Node  string `json:"node"`
	Moved []struct {
		Sandbox   string `json:"sandbox"`
		From      string `json:"from"`
		To        string `json:"to"`
		Processes string `json:"processes,omitempty"`
	} `json:"moved"`
	Stayed []struct {
		Sandbox string `json:"sandbox"`
		State   string `json:"state"`
		Reason  string `json:"reason"`
	} `json:"stayed"`
	Hibernated int `json:"hibernated"`
}

// ListNodes returns the cluster's registry (admin keys).
func (c *Client) ListNodes(ctx context.Context) ([]Node, error) {
	var res struct {
		Nodes []Node `json:"nodes"`
	}
	_, err := c.r.do(ctx, request{method: http.MethodGet, url: c.base + "/v1/nodes", out: &res})
	return res.Nodes, err
}

// DrainNode marks a node drained (nothing more is placed on it) and starts
// the operation that moves its sandboxes to other nodes (admin keys).
func (c *Client) DrainNode(ctx context.Context, name, idemKey string) (Operation, error) {
	var res struct {
		Operation Operation `json:"operation"`
	}
	u, err := route(c.base, "/v1/nodes/%s/drain", name)
	if err != nil {
		return Operation{}, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, header: idemHeader(idemKey), out: &res})
	return res.Operation, err
}

// UndrainNode lets the scheduler place on a drained node again (admin keys).
func (c *Client) UndrainNode(ctx context.Context, name string) (Node, error) {
	var res struct {
		Node Node `json:"node"`
	}
	u, err := route(c.base, "/v1/nodes/%s/undrain", name)
	if err != nil {
		return Node{}, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, out: &res})
	return res.Node, err
}
