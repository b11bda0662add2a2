package cluster

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// TestSecretsOnlyOverTLS: a replica whose link to a node is plaintext
// (allowed on loopback) sends it no secret: the start and the policy
// change of a sandbox with credentials fail before any call, and the node
// got nothing.
func TestSecretsOnlyOverTLS(t *testing.T) {
	ctx := context.Background()
	st, b, _ := netFixture(t)
	resolver := func(ctx context.Context, projectID string, ids []string) ([]Credential, error) {
		var out []Credential
		for _, id := range ids {
			out = append(out, Credential{Info: core.Credential{ID: id, ProjectID: projectID, Host: "api.test"}, Secret: []byte("s3cret")})
		}
		return out, nil
	}
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}, Credentials: resolver})
	if err != nil {
		t.Fatal(err)
	}
	pol := &core.NetworkPolicy{Mode: "allowlist", Allow: core.AllowRules{"api.test"}, Credentials: []string{"cred-0000000000000001"}}
	sb := core.Sandbox{ID: "sbx-0000000000000001", ProjectID: "p", Template: "minimal", Node: "n1", State: core.SandboxRunning, Network: pol}
	if _, _, err := st.CreateSandboxOp(ctx, sb, core.Operation{ID: "op-1", ProjectID: "p", Kind: "sandbox.create", Target: sb.ID, State: core.OpSucceeded}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := r.StartSandbox(ctx, sb, func(int, string) {}); !errors.Is(err, core.ErrUnavailable) || !strings.Contains(err.Error(), "TLS only") {
		t.Fatalf("start with credentials over plaintext: %v", err)
	}
	if err := r.SetNetworkPolicy(ctx, sb, *pol); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("policy with credentials over plaintext: %v", err)
	}
	if err := r.resendCredentials(ctx, sb); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("resync over plaintext: %v", err)
	}
	if len(b.secrets) != 0 {
		t.Fatalf("the node got secrets over plaintext: %v", b.secrets)
	}
	// Without credentials the plaintext loopback link works.
	sb2 := sb
	sb2.ID, sb2.Network = "sbx-0000000000000002", nil
	if _, err := r.StartSandbox(ctx, sb2, func(int, string) {}); err != nil {
		t.Fatalf("start without credentials: %v", err)
	}
}

// netFixture is a store with node n1 registered (egress, template
// minimal) whose RPC is served by a netBackend.
func netFixture(t *testing.T) (*sqlite.Store, *netBackend, *httptest.Server) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	b := &netBackend{policies: map[string]core.NetworkPolicy{}, secrets: map[string][]string{}}
	srv := httptest.NewServer(NewHandler(b, NewVerifier(secret, "n1", nil), t.Logf))
	t.Cleanup(srv.Close)
	if _, err := st.PutNode(ctx, core.NodeRecord{Name: "n1", Kind: core.NodeKindNode, RPCURL: srv.URL, Egress: true,
		Templates: []string{"minimal"}, HeartbeatAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	return st, b, srv
}
