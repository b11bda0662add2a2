package cluster

// Credential sync: a credential deleted through any replica stops being
// injected on every node at once. Secrets themselves reach a node only in
// the start and network calls of the sandboxes placed there (network.go).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// Credential sync paths: drop a deleted credential from every sandbox of
// a node; give a sandbox the secrets of the credentials its applied policy
// attaches (after the node restarted).
const (
	PathRevokeCredential = "/node/v1/revoke-credential"
	PathCredentials      = "/node/v1/credentials"
)

// CredentialRevoker is what a node with the egress gateway offers for
// deleted credentials.
type CredentialRevoker interface {
	RevokeCredential(ctx context.Context, id string) error
}

// CredentialSetter is what a node with the egress gateway offers to give
// a running sandbox its secrets again without touching its policy. The
// node refuses (ErrConflict) credentials other than exactly those of the
// policy it applies to the sandbox now: a stale resync never attaches a
// credential a newer policy detached.
type CredentialSetter interface {
	SetSandboxCredentials(ctx context.Context, sb core.Sandbox, creds []Credential) error
}

type credentialsReq struct {
	Sandbox     core.Sandbox `json:"sandbox"`
	Credentials []Credential `json:"credentials"`
}

func (h *Handler) credentialRoutes() {
	cs, _ := h.b.(CredentialSetter)
	h.route(PathCredentials, func(ctx context.Context, body []byte) (any, error) {
		var r credentialsReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.Sandbox.ID) || len(r.Credentials) == 0 || len(r.Credentials) > maxWireCredentials {
			return nil, fmt.Errorf("credentials request: %w", core.ErrInvalid)
		}
		if cs == nil {
			return nil, fmt.Errorf("this node keeps no sandbox networks: %w", core.ErrUnavailable)
		}
		return okResp{true}, cs.SetSandboxCredentials(ctx, r.Sandbox, r.Credentials)
	})
	rv, _ := h.b.(CredentialRevoker)
	h.route(PathRevokeCredential, func(ctx context.Context, body []byte) (any, error) {
		var r idReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !strings.HasPrefix(r.ID, "cred-") || len(r.ID) > 64 {
			return nil, fmt.Errorf("credential id %.40q: %w", r.ID, core.ErrInvalid)
		}
		if rv == nil {
			return okResp{true}, nil // no gateway: nothing injected here
		}
		return okResp{true}, rv.RevokeCredential(ctx, r.ID)
	})
}

// SetCredentials gives a sandbox on the node the secrets of its policy.
func (c *Client) SetCredentials(ctx context.Context, sb core.Sandbox, creds []Credential) error {
	return c.call(ctx, PathCredentials, credentialsReq{Sandbox: sb, Credentials: creds}, &okResp{})
}

// RevokeCredential asks the node to stop injecting credential id.
func (c *Client) RevokeCredential(ctx context.Context, id string) error {
	return c.call(ctx, PathRevokeCredential, idReq{ID: id}, &okResp{})
}

// RevokeCredential tells every ready node with the egress gateway that
// credential id was deleted. Nodes that cannot be told are named in the
// error; they hold the secret only in memory, so a restart drops it too.
func (r *Remote) RevokeCredential(ctx context.Context, id string) error {
	nodes, err := r.ns.ListNodes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nodes {
		if n.Kind != core.NodeKindNode || n.State != core.NodeReady || !n.Egress {
			continue
		}
		c, err := r.client(ctx, n.Name)
		if err == nil {
			err = c.RevokeCredential(ctx, id)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// secretsTo refuses to send secrets to a node over a link that is not
// TLS (a plaintext loopback link carries no credentials).
func (r *Remote) secretsTo(c *Client, creds []Credential) error {
	if len(creds) == 0 || strings.HasPrefix(c.URL, "https://") || r.o.Link.PlaintextSecrets || r.o.HTTP != nil {
		return nil
	}
	return fmt.Errorf("node %s: credentials go to nodes over TLS only, and its link is plaintext (%s): %w", c.Name, c.URL, core.ErrUnavailable)
}

// ResyncCredentials keeps nodes holding the secrets of their sandboxes: a
// node keeps them in memory only, so one that restarted re-adopts its
// sandboxes without them. Every interval it looks at the registry and, for
// each ready egress node that started since it last looked (every node,
// the first time), sends the secrets of the running and paused sandboxes
// placed there whose policy attaches credentials (the network call, as a
// policy change does). Sending them again to a node that has them is
// harmless; a node that could not be served is tried again next time.
func (r *Remote) ResyncCredentials(ctx context.Context, every time.Duration) {
	seen := map[string]time.Time{}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		r.resyncOnce(ctx, seen)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Remote) resyncOnce(ctx context.Context, seen map[string]time.Time) {
	nodes, err := r.ns.ListNodes(ctx)
	if err != nil || r.o.Credentials == nil {
		return
	}
	now := r.o.Now()
	var restarted []core.NodeRecord
	for _, n := range nodes {
		if r.fresh(n, now) && n.Egress && !n.StartedAt.Equal(seen[n.Name]) {
			restarted = append(restarted, n)
		}
	}
	if len(restarted) == 0 {
		return
	}
	ok := map[string]bool{}
	for _, n := range restarted {
		ok[n.Name] = true
	}
	after := ""
	for {
		page, err := r.o.Store.ListSandboxes(ctx, core.SandboxFilter{States: []core.SandboxState{core.SandboxRunning, core.SandboxPaused}, After: after, Limit: 500})
		if err != nil {
			return
		}
		for _, sb := range page {
			after = sb.ID
			if _, on := ok[sb.Node]; !on || sb.Network == nil || len(sb.Network.Credentials) == 0 {
				continue
			}
			if err := r.resendCredentials(ctx, sb); err != nil && !errors.Is(err, core.ErrConflict) {
				r.o.Logf("sandbox %s: credentials to node %s: %v", sb.ID, sb.Node, err)
				// Only an unreachable node is tried again (a deleted
				// credential would fail the same way every time).
				if errors.Is(err, core.ErrUnavailable) {
					ok[sb.Node] = false
				}
			}
		}
		if len(page) < 500 {
			break
		}
	}
	for _, n := range restarted {
		if ok[n.Name] {
			seen[n.Name] = n.StartedAt
		}
	}
}

// resendCredentials sends sb's node the secrets its recorded policy
// attaches.
func (r *Remote) resendCredentials(ctx context.Context, sb core.Sandbox) error {
	creds, err := r.credentials(ctx, sb.ProjectID, sb.Network)
	if err != nil {
		return err
	}
	return r.onNode(ctx, sb.ID, func(c *Client) error {
		if err := r.secretsTo(c, creds); err != nil {
			return err
		}
		return c.SetCredentials(ctx, sb, creds)
	})
}
