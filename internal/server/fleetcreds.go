package server

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress/credstore"
)

// credentialStoreOf finds the core.CredentialStore under st's wrappers
// (the metrics wrapper keeps only the interfaces it knows).
func credentialStoreOf(st core.Store) (core.CredentialStore, bool) {
	for st != nil {
		if cs, ok := st.(core.CredentialStore); ok {
			return cs, true
		}
		u, ok := st.(interface{ Unwrap() core.Store })
		if !ok {
			return nil, false
		}
		st = u.Unwrap()
	}
	return nil, false
}

// fleetCredentials opens the credential store the replicas of a
// --remote-nodes cluster share (nil, nil without operator keys: requests
// for credentials then answer 503). The resolver opens secrets for the
// node of a sandbox; revoke tells the nodes of a deleted credential.
func fleetCredentials(cfg Config, st core.Store, revoke func(ctx context.Context, id string) error) (*credstore.Shared, cluster.CredentialResolver, error) {
	if cfg.CredentialKeys == nil {
		return nil, nil, nil
	}
	cs, ok := credentialStoreOf(st)
	if !ok {
		return nil, nil, fmt.Errorf("credential keys: the store keeps no credentials: %w", core.ErrInvalid)
	}
	logf := cfg.Logf
	shared := credstore.NewShared(cs, cfg.CredentialKeys, func(ctx context.Context, id string) {
		// The record is gone: no node is given it again. A node that
		// missed this drops it when it restarts (secrets live in memory).
		if err := revoke(context.WithoutCancel(ctx), id); err != nil {
			logf("credential %s deleted; telling the nodes: %v", id, err)
		}
	})
	resolve := func(ctx context.Context, projectID string, ids []string) ([]cluster.Credential, error) {
		creds, infos, err := shared.Resolve(ctx, projectID, ids)
		if err != nil {
			return nil, err
		}
		out := make([]cluster.Credential, len(creds))
		for i := range creds {
			out[i] = cluster.Credential{Info: infos[i], Secret: creds[i].Secret}
		}
		return out, nil
	}
	cfg.Logf("credentials: shared store in the database, operator key %s seals (%d keys)", cfg.CredentialKeys.ActiveID(), len(cfg.CredentialKeys.IDs()))
	return shared, resolve, nil
}

// RevokeCredential implements cluster.CredentialRevoker: the node's
// gateway stops injecting a deleted credential.
func (t *trackedRuntime) RevokeCredential(ctx context.Context, id string) error {
	if t.eg != nil {
		t.eg.net.GW.Revoke(id)
	}
	return nil
}

// netState is what a node remembers of its sandboxes' networks for the
// credentials resync: the credential ids of the policy it applies to each.
// Policy changes and resyncs take mu, so they apply one at a time.
type netState struct {
	mu    sync.Mutex
	creds map[string][]string // sandbox id → credential ids of its policy
}

func (n *netState) set(id string, p *core.NetworkPolicy) {
	if p == nil || len(p.Credentials) == 0 {
		delete(n.creds, id)
		return
	}
	n.creds[id] = slices.Clone(p.Credentials)
}

// SetSandboxCredentials implements cluster.CredentialSetter: the secrets
// of exactly the credentials of the policy this node applies to sb.
func (t *trackedRuntime) SetSandboxCredentials(ctx context.Context, sb core.Sandbox, creds []cluster.Credential) error {
	if t.eg == nil {
		return fmt.Errorf("network: this node has no egress gateway (space node --egress): %w", core.ErrUnavailable)
	}
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	want, ok := t.net.creds[sb.ID]
	if !ok {
		return fmt.Errorf("sandbox %s: its policy attaches no credentials here: %w", sb.ID, core.ErrConflict)
	}
	if err := cluster.CheckCredentials(&core.NetworkPolicy{Credentials: want}, creds); err != nil {
		return fmt.Errorf("sandbox %s: not the credentials of its current policy: %v: %w", sb.ID, err, core.ErrConflict)
	}
	inst := sb.Instance
	if inst == "" {
		inst = sb.ID
	}
	ec, _ := wireCredentials(creds)
	return t.eg.net.GW.SetCredentials(inst, ec)
}
