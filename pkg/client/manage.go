package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// NetworkPolicy is a sandbox's egress policy (docs/egress.md). Mode is
// "blocked", "allowlist" or "open"; the server stores presets expanded
// into Allow rules.
type NetworkPolicy struct {
	Mode        string   `json:"mode"`
	Allow       []string `json:"allow,omitempty"`
	Presets     []string `json:"presets,omitempty"`
	Passthrough []string `json:"passthrough,omitempty"`
	Credentials []string `json:"credentials,omitempty"`
}

// NetworkDecision is one allowed or denied connection of a sandbox.
type NetworkDecision struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Proto   string    `json:"proto"`
	Name    string    `json:"name,omitempty"`
	Port    uint16    `json:"port,omitempty"`
	Dest    string    `json:"dest,omitempty"`
	Dialled string    `json:"dialled,omitempty"`
	Verdict string    `json:"verdict"`
	Rule    string    `json:"rule,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	TLS     string    `json:"tls,omitempty"`
	Via     string    `json:"via,omitempty"`
}

// NetworkLog is a page of a sandbox's decision log and its counters.
type NetworkLog struct {
	Decisions []NetworkDecision `json:"decisions"`
	Counters  map[string]uint64 `json:"counters,omitempty"`
}

// Metric is one resource-usage sample of a sandbox.
type Metric struct {
	Timestamp  time.Time `json:"timestamp"`
	CPUCount   int       `json:"cpu_count"`
	CPUUsedPct float64   `json:"cpu_used_pct"`
	MemUsed    int64     `json:"mem_used"`
	MemTotal   int64     `json:"mem_total"`
	MemCache   int64     `json:"mem_cache"`
	DiskUsed   int64     `json:"disk_used"`
	DiskTotal  int64     `json:"disk_total"`
}

// ServerInfo is GET /v1/info: the server's build and its node's driver.
type ServerInfo struct {
	Version      string `json:"version"`
	Commit       string `json:"commit,omitempty"`
	Driver       string `json:"driver"`
	DriverReason string `json:"driver_reason,omitempty"`
	Egress       bool   `json:"egress"`
}

// Info returns what the server reports about itself.
func (c *Client) Info(ctx context.Context) (ServerInfo, error) {
	var in ServerInfo
	_, err := c.r.do(ctx, request{method: http.MethodGet, url: c.base + "/v1/info", out: &in})
	return in, err
}

// SetNetwork replaces a running sandbox's egress policy.
func (c *Client) SetNetwork(ctx context.Context, id string, p NetworkPolicy) (Sandbox, error) {
	var sb Sandbox
	u, err := route(c.base, "/v1/sandboxes/%s/network", id)
	if err != nil {
		return sb, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodPut, url: u, json: p, out: &sb})
	return sb, err
}

// NetworkLog returns up to limit (1..1000; 0: 1000) decisions after the
// one numbered after.
func (c *Client) NetworkLog(ctx context.Context, id string, after uint64, limit int) (NetworkLog, error) {
	var l NetworkLog
	u, err := route(c.base, "/v1/sandboxes/%s/network/log", id)
	if err != nil {
		return l, err
	}
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatUint(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &l})
	return l, err
}

// Metrics returns a sandbox's resource-usage samples between start and
// end (zero times: the server's defaults).
func (c *Client) Metrics(ctx context.Context, id string, start, end time.Time) ([]Metric, error) {
	var res struct {
		Metrics []Metric `json:"metrics"`
	}
	u, err := route(c.base, "/v1/sandboxes/%s/metrics", id)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if !start.IsZero() {
		q.Set("start", start.UTC().Format(time.RFC3339))
	}
	if !end.IsZero() {
		q.Set("end", end.UTC().Format(time.RFC3339))
	}
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &res})
	return res.Metrics, err
}
