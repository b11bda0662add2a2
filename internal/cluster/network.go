package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress/policy"
)

// Network RPC paths: a sandbox's egress policy and its decision log, on the
// node that runs it (its egress gateway).
const (
	PathNetwork    = "/node/v1/network"
	PathNetworkLog = "/node/v1/network-log"
)

// Bounds of credentials on the wire (core validation allows 32 per policy).
const (
	maxWireCredentials = 32
	maxSecretBytes     = 16 << 10
)

// Credential is an attached credential as a server sends it to the node
// that injects it: the binding and the secret. It travels only inside a
// signed RPC body (start, network) and the node keeps it in its gateway's
// memory, never on disk.
type Credential struct {
	Info   core.Credential `json:"info"`
	Secret []byte          `json:"secret"`
}

// String keeps the secret out of logs and error messages.
func (c Credential) String() string { return "credential " + c.Info.ID }

// GoString keeps the secret out of %#v.
func (c Credential) GoString() string { return c.String() }

// CredentialResolver opens a project's credentials for a node (the
// server's credential store).
type CredentialResolver func(ctx context.Context, projectID string, ids []string) ([]Credential, error)

// NetworkBackend is what a node offers for sandbox networks. A node
// without the egress gateway implements it too: it keeps its sandboxes
// blocked and refuses any other policy.
type NetworkBackend interface {
	// StartSandboxWithCredentials is Backend.StartSandbox with the secrets
	// of the credentials sb's policy attaches.
	StartSandboxWithCredentials(ctx context.Context, sb core.Sandbox, creds []Credential, progress core.Progress) (core.Placement, error)
	// SetNetworkPolicyWithCredentials applies a validated policy (and the
	// secrets of its credentials) to a running sandbox.
	SetNetworkPolicyWithCredentials(ctx context.Context, sb core.Sandbox, p core.NetworkPolicy, creds []Credential) error
	NetworkLog(ctx context.Context, sb core.Sandbox, after uint64, limit int) (core.NetworkLog, error)
}

type networkReq struct {
	Sandbox     core.Sandbox       `json:"sandbox"`
	Policy      core.NetworkPolicy `json:"policy"`
	Credentials []Credential       `json:"credentials,omitempty"`
}

type networkLogReq struct {
	Sandbox core.Sandbox `json:"sandbox"`
	After   uint64       `json:"after"`
	Limit   int          `json:"limit"`
}

type networkLogResp struct {
	Log core.NetworkLog `json:"log"`
}

// CheckCredentials checks that creds are exactly the credentials p
// attaches (fail closed: a secret the policy does not name is refused, and
// so is a policy whose secrets did not come).
func CheckCredentials(p *core.NetworkPolicy, creds []Credential) error {
	var want []string
	if p != nil {
		want = p.Credentials
	}
	if len(creds) > maxWireCredentials {
		return fmt.Errorf("more than %d credentials: %w", maxWireCredentials, core.ErrInvalid)
	}
	if len(creds) != len(want) {
		return fmt.Errorf("the policy attaches %d credentials, %d were sent: %w", len(want), len(creds), core.ErrInvalid)
	}
	for i, c := range creds {
		if !slices.Contains(want, c.Info.ID) || slices.ContainsFunc(creds[:i], func(o Credential) bool { return o.Info.ID == c.Info.ID }) {
			return fmt.Errorf("credential %.40q is not attached by the policy: %w", c.Info.ID, core.ErrInvalid)
		}
		if len(c.Secret) == 0 || len(c.Secret) > maxSecretBytes {
			return fmt.Errorf("credential %s: secret of %d bytes: %w", c.Info.ID, len(c.Secret), core.ErrInvalid)
		}
	}
	return nil
}

// networkRoutes adds the network routes; a backend without them answers
// unavailable.
func (h *Handler) networkRoutes() {
	nb, _ := h.b.(NetworkBackend)
	h.route(PathNetwork, func(ctx context.Context, body []byte) (any, error) {
		var r networkReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.Sandbox.ID) {
			return nil, fmt.Errorf("sandbox id %.40q: %w", r.Sandbox.ID, core.ErrInvalid)
		}
		if nb == nil {
			return nil, fmt.Errorf("this node keeps no sandbox networks: %w", core.ErrUnavailable)
		}
		if err := CheckCredentials(&r.Policy, r.Credentials); err != nil {
			return nil, err
		}
		return okResp{true}, nb.SetNetworkPolicyWithCredentials(ctx, r.Sandbox, r.Policy, r.Credentials)
	})
	h.route(PathNetworkLog, func(ctx context.Context, body []byte) (any, error) {
		var r networkLogReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.Sandbox.ID) {
			return nil, fmt.Errorf("sandbox id %.40q: %w", r.Sandbox.ID, core.ErrInvalid)
		}
		if r.Limit <= 0 || r.Limit > 1000 {
			r.Limit = 1000
		}
		if nb == nil {
			return networkLogResp{Log: core.NetworkLog{Decisions: []core.NetworkDecision{}}}, nil
		}
		l, err := nb.NetworkLog(ctx, r.Sandbox, r.After, r.Limit)
		return networkLogResp{Log: l}, err
	})
}

// startSandbox serves PathStart: with credentials only on a network backend.
func (h *Handler) startSandbox(ctx context.Context, r sandboxReq) (core.Placement, error) {
	nb, ok := h.b.(NetworkBackend)
	if !ok {
		if len(r.Credentials) > 0 {
			return core.Placement{}, fmt.Errorf("this node keeps no sandbox networks, credentials were sent: %w", core.ErrUnavailable)
		}
		return h.b.StartSandbox(ctx, r.Sandbox, func(int, string) {})
	}
	if err := CheckCredentials(r.Sandbox.Network, r.Credentials); err != nil {
		return core.Placement{}, err
	}
	return nb.StartSandboxWithCredentials(ctx, r.Sandbox, r.Credentials, func(int, string) {})
}

// SetNetwork applies a policy to a sandbox on the node.
func (c *Client) SetNetwork(ctx context.Context, sb core.Sandbox, p core.NetworkPolicy, creds []Credential) error {
	return c.call(ctx, PathNetwork, networkReq{Sandbox: sb, Policy: p, Credentials: creds}, &okResp{})
}

// NetworkLog reads a sandbox's decision log on the node.
func (c *Client) NetworkLog(ctx context.Context, sb core.Sandbox, after uint64, limit int) (core.NetworkLog, error) {
	var out networkLogResp
	err := c.call(ctx, PathNetworkLog, networkLogReq{Sandbox: sb, After: after, Limit: limit}, &out)
	return out.Log, err
}

var (
	_ core.NetworkRuntime  = (*Remote)(nil)
	_ core.NetworkAdmitter = (*Remote)(nil)
)

// needsEgress reports whether a policy needs a node with the egress
// gateway (anything but blocked).
func needsEgress(p *core.NetworkPolicy) bool {
	return p != nil && p.Mode != "" && p.Mode != string(policy.Blocked)
}

// NetworkEnabled implements core.NetworkRuntime: the scheduler places a
// sandbox that needs a network only on nodes that advertise egress (none
// ready: 503 at placement).
func (r *Remote) NetworkEnabled() bool { return true }

// credentials resolves the secrets p attaches for sb's project.
func (r *Remote) credentials(ctx context.Context, projectID string, p *core.NetworkPolicy) ([]Credential, error) {
	if p == nil || len(p.Credentials) == 0 {
		return nil, nil
	}
	if r.o.Credentials == nil {
		return nil, fmt.Errorf("network: credentials are not available on this server (start the replicas with --credential-keys): %w", core.ErrUnavailable)
	}
	creds, err := r.o.Credentials(ctx, projectID, p.Credentials)
	if errors.Is(err, core.ErrNotFound) {
		return nil, fmt.Errorf("network: %v: %w", err, core.ErrInvalid)
	}
	return creds, err
}

// AdmitNetwork implements core.NetworkAdmitter: a policy other than
// blocked needs the sandbox's node to run the egress gateway.
func (r *Remote) AdmitNetwork(ctx context.Context, sb core.Sandbox, p core.NetworkPolicy) error {
	if !needsEgress(&p) || sb.Node == "" {
		return nil
	}
	rec, ok, err := r.nodeRecord(ctx, sb.Node)
	if err != nil {
		return err
	}
	if ok && !rec.Egress {
		return fmt.Errorf("network mode %s: sandbox %s runs on node %s, which has no egress gateway (space node --egress): %w", p.Mode, sb.ID, sb.Node, core.ErrUnavailable)
	}
	return nil
}

// SetNetworkPolicy implements core.NetworkRuntime on the sandbox's node,
// with the secrets of the credentials the policy attaches.
func (r *Remote) SetNetworkPolicy(ctx context.Context, sb core.Sandbox, p core.NetworkPolicy) error {
	creds, err := r.credentials(ctx, sb.ProjectID, &p)
	if err != nil {
		return err
	}
	return r.onNode(ctx, sb.ID, func(c *Client) error {
		if err := r.secretsTo(c, creds); err != nil {
			return err
		}
		return c.SetNetwork(ctx, sb, p, creds)
	})
}

// NetworkLog implements core.NetworkRuntime: the node's gateway keeps the
// log (the API's SSE follow polls this same call).
func (r *Remote) NetworkLog(ctx context.Context, sb core.Sandbox, after uint64, limit int) (core.NetworkLog, error) {
	var out core.NetworkLog
	err := r.onNode(ctx, sb.ID, func(c *Client) error {
		var err error
		out, err = c.NetworkLog(ctx, sb, after, limit)
		return err
	})
	if out.Decisions == nil {
		out.Decisions = []core.NetworkDecision{}
	}
	return out, err
}
