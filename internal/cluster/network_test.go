package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// netBackend is a fakeBackend with sandbox networks: it records what the
// node would give its gateway.
type netBackend struct {
	fakeBackend
	mu       sync.Mutex
	policies map[string]core.NetworkPolicy
	secrets  map[string][]string // sandbox → "id=secret"
}

func (n *netBackend) note(sb core.Sandbox, p core.NetworkPolicy, creds []Credential) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.policies[sb.ID] = p
	var s []string
	for _, c := range creds {
		s = append(s, c.Info.ID+"="+string(c.Secret))
	}
	n.secrets[sb.ID] = s
}

func (n *netBackend) StartSandboxWithCredentials(ctx context.Context, sb core.Sandbox, creds []Credential, p core.Progress) (core.Placement, error) {
	pol := core.NetworkPolicy{Mode: "blocked"}
	if sb.Network != nil {
		pol = *sb.Network
	}
	n.note(sb, pol, creds)
	return n.fakeBackend.StartSandbox(ctx, sb, p)
}

func (n *netBackend) SetNetworkPolicyWithCredentials(ctx context.Context, sb core.Sandbox, p core.NetworkPolicy, creds []Credential) error {
	n.note(sb, p, creds)
	return nil
}

func (n *netBackend) NetworkLog(ctx context.Context, sb core.Sandbox, after uint64, limit int) (core.NetworkLog, error) {
	out := core.NetworkLog{Decisions: []core.NetworkDecision{}}
	for i := after + 1; i <= 3 && len(out.Decisions) < limit; i++ {
		out.Decisions = append(out.Decisions, core.NetworkDecision{Seq: i, Name: fmt.Sprintf("h%d.test", i), Verdict: "allow"})
	}
	return out, nil
}

// TestNetworkRPC: a remote runtime with a credential resolver sends the
// secrets a policy attaches to the sandbox's node, in the signed start and
// network calls only; the node refuses secrets the policy does not name;
// the decision log reads through.
func TestNetworkRPC(t *testing.T) {
	ctx := context.Background()
	st, b, srv := netFixture(t)
	resolved := 0
	resolver := func(ctx context.Context, projectID string, ids []string) ([]Credential, error) {
		resolved++
		var out []Credential
		for _, id := range ids {
			if id == "cred-00000000000000ff" {
				return nil, fmt.Errorf("credential %s: %w", id, core.ErrNotFound)
			}
			out = append(out, Credential{Info: core.Credential{ID: id, ProjectID: projectID, Host: "api.test"}, Secret: []byte("s3cret-" + id)})
		}
		return out, nil
	}
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true, PlaintextSecrets: true}, Credentials: resolver})
	if err != nil {
		t.Fatal(err)
	}
	pol := &core.NetworkPolicy{Mode: "allowlist", Allow: core.AllowRules{"api.test"}, Credentials: []string{"cred-0000000000000001"}}
	sb := core.Sandbox{ID: "sbx-0000000000000001", ProjectID: "p", Template: "minimal", Node: "n1", State: core.SandboxRunning, Network: pol}
	if _, _, err := st.CreateSandboxOp(ctx, sb, core.Operation{ID: "op-1", ProjectID: "p", Kind: "sandbox.create", Target: sb.ID, State: core.OpSucceeded}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := r.StartSandbox(ctx, sb, func(int, string) {}); err != nil {
		t.Fatalf("start: %v", err)
	}
	if got := b.secrets[sb.ID]; len(got) != 1 || got[0] != "cred-0000000000000001=s3cret-cred-0000000000000001" {
		t.Fatalf("node got credentials %v", got)
	}
	p2 := core.NetworkPolicy{Mode: "allowlist", Allow: core.AllowRules{"b.test"}, Credentials: []string{"cred-0000000000000002"}}
	if err := r.SetNetworkPolicy(ctx, sb, p2); err != nil {
		t.Fatalf("set network: %v", err)
	}
	if got := b.secrets[sb.ID]; len(got) != 1 || !strings.HasPrefix(got[0], "cred-0000000000000002=") || b.policies[sb.ID].Allow[0] != "b.test" {
		t.Fatalf("after set: %v %+v", got, b.policies[sb.ID])
	}
	if err := r.SetNetworkPolicy(ctx, sb, core.NetworkPolicy{Mode: "allowlist", Credentials: []string{"cred-00000000000000ff"}}); !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("unknown credential: %v", err)
	}
	l, err := r.NetworkLog(ctx, sb, 1, 10)
	if err != nil || len(l.Decisions) != 2 || l.Decisions[0].Seq != 2 {
		t.Fatalf("log: %+v %v", l, err)
	}
	// A secret the policy does not attach, or a policy without its
	// secrets, is refused by the node before anything runs.
	c := NewClient("n1", srv.URL, NewSigner(secret, nil), nil)
	extra := Credential{Info: core.Credential{ID: "cred-0000000000000009"}, Secret: []byte("x")}
	if err := c.SetNetwork(ctx, sb, core.NetworkPolicy{Mode: "open"}, []Credential{extra}); !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("unattached secret: %v", err)
	}
	if err := c.SetNetwork(ctx, sb, p2, nil); !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("missing secret: %v", err)
	}
	if _, err := c.StartSandbox(ctx, core.Sandbox{ID: "sbx-0000000000000002", Network: pol}); !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("start without the secrets: %v", err)
	}
	if fmt.Sprint(extra) != "credential cred-0000000000000009" || fmt.Sprintf("%#v", extra) != "credential cred-0000000000000009" {
		t.Fatalf("a credential prints its secret: %v", extra)
	}
	// Without a resolver, a policy with credentials is refused (503),
	// nothing reaches the node.
	r0, _ := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}})
	if err := r0.SetNetworkPolicy(ctx, sb, p2); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("no resolver: %v", err)
	}
	// A node without network routes (no NetworkBackend) refuses secrets.
	plain := httptest.NewServer(NewHandler(&fakeBackend{}, NewVerifier(secret, "n2", nil), t.Logf))
	defer plain.Close()
	c2 := NewClient("n2", plain.URL, NewSigner(secret, nil), nil)
	if _, err := c2.StartSandbox(ctx, core.Sandbox{ID: "sbx-0000000000000003", Network: pol}, extra); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("plain node with secrets: %v", err)
	}
	if err := c2.SetNetwork(ctx, sb, core.NetworkPolicy{Mode: "open"}, nil); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("plain node network: %v", err)
	}
}

// TestPlaceEgress: a sandbox whose policy is not blocked goes only to
// nodes that advertise egress; a blocked one anywhere; a policy change
// to a non-blocked mode is refused on a node without egress.
func TestPlaceEgress(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now().UTC()
	put := func(name string, egress bool, mem, used int64) {
		if _, err := st.PutNode(ctx, core.NodeRecord{Name: name, Kind: core.NodeKindNode, RPCURL: "http://127.0.0.1:1", HeartbeatAt: now,
			Templates: []string{"minimal"}, MemoryBytes: mem, UsedMemoryBytes: used, Egress: egress}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	open := core.Sandbox{ProjectID: "p", Template: "minimal", Network: &core.NetworkPolicy{Mode: "allowlist", Allow: core.AllowRules{"a.test"}}}
	put("plain", false, 64<<30, 0)
	if _, err := r.Place(ctx, open); !errors.Is(err, core.ErrUnavailable) || !strings.Contains(err.Error(), "egress") {
		t.Fatalf("no egress node: %v", err)
	}
	put("gw", true, 8<<30, 4<<30)
	for i := 0; i < 5; i++ {
		if got, err := r.Place(ctx, open); err != nil || got != "gw" {
			t.Fatalf("allowlist placed on %q %v, want gw", got, err)
		}
	}
	for _, p := range []*core.NetworkPolicy{nil, {Mode: "blocked"}} {
		if got, err := r.Place(ctx, core.Sandbox{ProjectID: "p", Template: "minimal", Network: p}); err != nil || got != "plain" {
			t.Fatalf("blocked placed on %q %v, want plain (most free memory)", got, err)
		}
	}
	if err := r.AdmitNetwork(ctx, core.Sandbox{ID: "sbx-0000000000000001", Node: "plain"}, core.NetworkPolicy{Mode: "open"}); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("open on a plain node: %v", err)
	}
	for _, c := range []struct {
		node string
		mode string
	}{{"plain", "blocked"}, {"gw", "open"}, {"gw", "blocked"}} {
		if err := r.AdmitNetwork(ctx, core.Sandbox{ID: "sbx-0000000000000001", Node: c.node}, core.NetworkPolicy{Mode: c.mode}); err != nil {
			t.Fatalf("%s on %s: %v", c.mode, c.node, err)
		}
	}
}
