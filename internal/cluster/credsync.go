package cluster

// Credential sync: a credential deleted through any replica stops being
// injected on every node at once. Secrets themselves reach a node only in
// the start and network calls of the sandboxes placed there (network.go).

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/space-sandbox/space/internal/core"
)

// PathRevokeCredential drops a credential from every sandbox of a node.
const PathRevokeCredential = "/node/v1/revoke-credential"

// CredentialRevoker is what a node with the egress gateway offers for
// deleted credentials.
type CredentialRevoker interface {
	RevokeCredential(ctx context.Context, id string) error
}

func (h *Handler) credentialRoutes() {
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
