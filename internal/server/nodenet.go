package server

import (
	"context"
	"fmt"

	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress"
)

// The network side of a `space node`: with --egress its runtime is the
// server's egressRuntime (the same policy, CA and resolver wiring), except
// that the secrets of attached credentials come from the server in each
// signed start or network call instead of from a credential store here.

var _ cluster.NetworkBackend = (*trackedRuntime)(nil)

// wireCredentials turns credentials received over the node RPC into the
// gateway's form and their bindings (for the placeholder variables).
func wireCredentials(creds []cluster.Credential) ([]egress.Credential, []core.Credential) {
	if len(creds) == 0 {
		return nil, nil
	}
	out := make([]egress.Credential, 0, len(creds))
	infos := make([]core.Credential, 0, len(creds))
	for _, c := range creds {
		i := c.Info
		out = append(out, egress.Credential{ID: i.ID, Host: i.Host, Port: i.Port, Header: i.Header, Prefix: i.Prefix,
			Methods: i.Methods, PathPrefix: i.PathPrefix, Placeholder: i.Placeholder, Secret: c.Secret})
		infos = append(infos, i)
	}
	return out, infos
}

// StartSandboxWithCredentials implements cluster.NetworkBackend.
func (t *trackedRuntime) StartSandboxWithCredentials(ctx context.Context, sb core.Sandbox, creds []cluster.Credential, progress core.Progress) (core.Placement, error) {
	if err := cluster.CheckCredentials(sb.Network, creds); err != nil {
		return core.Placement{}, err
	}
	if t.eg == nil && len(creds) > 0 {
		return core.Placement{}, fmt.Errorf("network: this node has no egress gateway (space node --egress): %w", core.ErrUnavailable)
	}
	if err := t.reserve(sb); err != nil {
		return core.Placement{}, err
	}
	var pl core.Placement
	var err error
	if t.eg != nil {
		ec, infos := wireCredentials(creds)
		t.net.mu.Lock()
		t.net.set(sb.ID, sb.Network)
		t.net.mu.Unlock()
		pl, err = t.eg.startWith(ctx, sb, ec, infos, progress)
	} else {
		pl, err = t.runtime.StartSandbox(ctx, sb, progress)
	}
	if err != nil {
		t.release(sb.ID)
	}
	return pl, err
}

// SetNetworkPolicyWithCredentials implements cluster.NetworkBackend.
func (t *trackedRuntime) SetNetworkPolicyWithCredentials(ctx context.Context, sb core.Sandbox, p core.NetworkPolicy, creds []cluster.Credential) error {
	if err := cluster.CheckCredentials(&p, creds); err != nil {
		return err
	}
	if t.eg == nil {
		if len(creds) > 0 {
			return fmt.Errorf("network: this node has no egress gateway (space node --egress): %w", core.ErrUnavailable)
		}
		return t.runtime.SetNetworkPolicy(ctx, sb, p) // blocked only
	}
	ec, _ := wireCredentials(creds)
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if err := t.eg.setWith(sb, p, ec); err != nil {
		return err
	}
	t.net.set(sb.ID, &p)
	return nil
}

// reattachNetwork gives a sandbox the node re-adopted at start its policy
// and a new CA. The secrets of its credentials are not kept on the node:
// until a server sets its policy again, the gateway substitutes none
// (placeholders go out as they are; TLS and the policy still apply).
func (t *trackedRuntime) reattachNetwork(ctx context.Context, sb core.Sandbox) {
	if t.eg == nil {
		return
	}
	if err := t.eg.reattach(ctx, sb, nil); err != nil {
		t.eg.logf("sandbox %s: egress after restart: %v", sb.ID, err)
	}
	t.net.mu.Lock()
	t.net.set(sb.ID, sb.Network)
	t.net.mu.Unlock()
	if sb.Network != nil && len(sb.Network.Credentials) > 0 {
		t.eg.logf("sandbox %s: re-adopted without its %d credentials (secrets are not kept on the node); the servers send them again", sb.ID, len(sb.Network.Credentials))
	}
}
