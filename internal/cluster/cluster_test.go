package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func TestTokens(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	s := NewSigner(secret, clock)
	body := []byte(`{"id":"sbx-0123456789abcdef"}`)
	fresh := func() *Verifier { return NewVerifier(secret, "n1", clock) }

	tok := s.Sign("n1", "POST", PathStop, body)
	v := fresh()
	if err := v.Verify(tok, "POST", PathStop, body); err != nil {
		t.Fatalf("valid token: %v", err)
	}
	if err := v.Verify(tok, "POST", PathStop, body); !errors.Is(err, ErrBadToken) || !strings.Contains(err.Error(), "replayed") {
		t.Fatalf("replay: %v", err)
	}
	cases := map[string]func() error{
		"other secret": func() error {
			return fresh().Verify(NewSigner([]byte(strings.Repeat("x", 32)), clock).Sign("n1", "POST", PathStop, body), "POST", PathStop, body)
		},
		"other node": func() error { return fresh().Verify(s.Sign("n2", "POST", PathStop, body), "POST", PathStop, body) },
		"other path": func() error { return fresh().Verify(s.Sign("n1", "POST", PathStop, body), "POST", PathStart, body) },
		"other body": func() error {
			return fresh().Verify(s.Sign("n1", "POST", PathStop, body), "POST", PathStop, []byte(`{}`))
		},
		"garbage":  func() error { return fresh().Verify("v1.x.y", "POST", PathStop, body) },
		"empty":    func() error { return fresh().Verify("", "POST", PathStop, body) },
		"too long": func() error { return fresh().Verify(strings.Repeat("a", 600), "POST", PathStop, body) },
		"tampered ts": func() error {
			return fresh().Verify(strings.Replace(tok, "1800000000000", "1800000001000", 1), "POST", PathStop, body)
		},
		"expired": func() error {
			old := NewSigner(secret, func() time.Time { return now.Add(-TokenWindow - time.Second) })
			return fresh().Verify(old.Sign("n1", "POST", PathStop, body), "POST", PathStop, body)
		},
		"future": func() error {
			f := NewSigner(secret, func() time.Time { return now.Add(TokenWindow + time.Second) })
			return fresh().Verify(f.Sign("n1", "POST", PathStop, body), "POST", PathStop, body)
		},
	}
	for name, fn := range cases {
		if err := fn(); !errors.Is(err, ErrBadToken) {
			t.Errorf("%s: %v, want ErrBadToken", name, err)
		}
	}
	if _, err := CheckSecret([]byte("short")); err == nil {
		t.Fatal("a short secret was accepted")
	}
}

// fakeBackend records calls.
type fakeBackend struct {
	mu      sync.Mutex
	started []string
	stopped []string
	failAt  string
	reqIDs  map[string]string // sandbox id → the request id its start carried
}

func (f *fakeBackend) StartSandbox(ctx context.Context, sb core.Sandbox, _ core.Progress) (core.Placement, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb.ID == f.failAt {
		return core.Placement{}, fmt.Errorf("no room: %w", core.ErrExhausted)
	}
	f.started = append(f.started, sb.ID)
	if f.reqIDs == nil {
		f.reqIDs = map[string]string{}
	}
	f.reqIDs[sb.ID] = audit.RequestID(ctx)
	return core.Placement{Driver: "fake", Instance: sb.ID}, nil
}
func (f *fakeBackend) StopSandbox(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, id)
	return nil
}
func (f *fakeBackend) AdoptSandbox(ctx context.Context, sb core.Sandbox) error { return nil }
func (f *fakeBackend) HasTemplate(ctx context.Context, name string) error {
	if name != "minimal" {
		return fmt.Errorf("template %s: %w", name, core.ErrNotFound)
	}
	return nil
}
func (f *fakeBackend) PauseSandbox(ctx context.Context, id string) error  { return nil }
func (f *fakeBackend) ResumeSandbox(ctx context.Context, id string) error { return nil }

func TestRPC(t *testing.T) {
	b := &fakeBackend{failAt: "sbx-00000000000000ff"}
	srv := httptest.NewServer(NewHandler(b, NewVerifier(secret, "n1", nil), t.Logf))
	defer srv.Close()
	ctx := context.Background()
	c := NewClient("n1", srv.URL, NewSigner(secret, nil), nil)
	pl, err := c.StartSandbox(ctx, core.Sandbox{ID: "sbx-0000000000000001", Template: "minimal"})
	if err != nil || pl.Instance != "sbx-0000000000000001" {
		t.Fatalf("start: %+v %v", pl, err)
	}
	if _, err := c.StartSandbox(ctx, core.Sandbox{ID: "sbx-00000000000000ff"}); !errors.Is(err, core.ErrExhausted) {
		t.Fatalf("a node error keeps its kind: %v", err)
	}
	if err := c.HasTemplate(ctx, "nope"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("has-template: %v", err)
	}
	if err := c.StopSandbox(ctx, "../../etc"); !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("a bad id: %v", err)
	}
	// A client of another cluster, or for another node, is refused.
	for _, bad := range []*Client{NewClient("n1", srv.URL, NewSigner([]byte(strings.Repeat("z", 32)), nil), nil),
		NewClient("n2", srv.URL, NewSigner(secret, nil), nil)} {
		if err := bad.StopSandbox(ctx, "sbx-0000000000000001"); !errors.Is(err, core.ErrUnavailable) || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("foreign client: %v", err)
		}
	}
	// No token, a GET, a huge body, unknown fields: JSON errors, nothing run.
	for _, tc := range []struct {
		method, path, auth string
		body               []byte
		want               int
	}{
		{"POST", PathStop, "", []byte(`{"id":"sbx-0000000000000001"}`), 401},
		{"GET", PathStop, "", nil, 405},
		{"POST", PathStop, "SpaceNode x", bytes.Repeat([]byte("a"), maxRPCBody+10), 413},
		{"POST", "/nope", "", nil, 404},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, bytes.NewReader(tc.body))
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || !bytes.Contains(raw, []byte(`"error":{"code"`)) {
			t.Errorf("%s %s: %d %s, want %d with an error envelope", tc.method, tc.path, resp.StatusCode, raw, tc.want)
		}
	}
	body := []byte(`{"id":"sbx-0000000000000001","extra":1}`)
	req, _ := http.NewRequest("POST", srv.URL+PathStop, bytes.NewReader(body))
	req.Header.Set("Authorization", authScheme+NewSigner(secret, nil).Sign("n1", "POST", PathStop, body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("unknown field: %d", resp.StatusCode)
	}
	if len(b.stopped) != 0 {
		t.Fatalf("refused requests ran: %v", b.stopped)
	}
}

// The request id of the API request behind a node call (in the caller's
// context) reaches the node's work as X-Request-Id; a call without one
// carries none.
func TestRPCRequestID(t *testing.T) {
	b := &fakeBackend{}
	srv := httptest.NewServer(NewHandler(b, NewVerifier(secret, "n1", nil), t.Logf))
	defer srv.Close()
	c := NewClient("n1", srv.URL, NewSigner(secret, nil), nil)
	ctx := audit.WithRequestID(context.Background(), "req-0123456789abcdef")
	if _, err := c.StartSandbox(ctx, core.Sandbox{ID: "sbx-0000000000000001", Template: "minimal"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartSandbox(context.Background(), core.Sandbox{ID: "sbx-0000000000000002", Template: "minimal"}); err != nil {
		t.Fatal(err)
	}
	if got := b.reqIDs["sbx-0000000000000001"]; got != "req-0123456789abcdef" {
		t.Errorf("node saw request id %q, want req-0123456789abcdef", got)
	}
	if got := b.reqIDs["sbx-0000000000000002"]; got != "" {
		t.Errorf("a call without a request id got %q", got)
	}
}

func TestPlace(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now().UTC()
	put := func(n core.NodeRecord) {
		n.Kind, n.RPCURL, n.HeartbeatAt = core.NodeKindNode, "http://127.0.0.1:1", now
		if n.Templates == nil {
			n.Templates = []string{"minimal"}
		}
		if _, err := st.PutNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sb := core.Sandbox{ID: "sbx-0000000000000001", ProjectID: "p", Template: "minimal", Limits: core.Limits{MemoryBytes: 1 << 30}}
	if _, err := r.Place(ctx, sb); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("no nodes: %v", err)
	}
	put(core.NodeRecord{Name: "big", MemoryBytes: 8 << 30, UsedMemoryBytes: 1 << 30})
	put(core.NodeRecord{Name: "small", MemoryBytes: 8 << 30, UsedMemoryBytes: 6 << 30})
	put(core.NodeRecord{Name: "notemplate", MemoryBytes: 64 << 30, Templates: []string{"base"}})
	stale := core.NodeRecord{Name: "stale", MemoryBytes: 64 << 30}
	put(stale)
	st.PutNode(ctx, core.NodeRecord{Name: "stale", Kind: core.NodeKindNode, RPCURL: "x", MemoryBytes: 64 << 30,
		Templates: []string{"minimal"}, HeartbeatAt: now.Add(-time.Minute)})
	if got, err := r.Place(ctx, sb); err != nil || got != "big" {
		t.Fatalf("place: %q %v, want big (most free, has the template, fresh)", got, err)
	}
	// Reservations count until a heartbeat reports them: five more 1 GiB
	// sandboxes fill big down to small's level, then they alternate.
	counts := map[string]int{}
	for i := 0; i < 6; i++ {
		got, err := r.Place(ctx, sb)
		if err != nil {
			t.Fatal(err)
		}
		counts[got]++
	}
	if counts["big"] < 4 || counts["notemplate"] != 0 || counts["stale"] != 0 {
		t.Fatalf("placements %v", counts)
	}
	if _, err := r.Place(ctx, core.Sandbox{Template: "other", Limits: sb.Limits}); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("unknown template: %v", err)
	}
	if _, err := r.Place(ctx, core.Sandbox{Template: "minimal", Limits: core.Limits{MemoryBytes: 100 << 30}}); !errors.Is(err, core.ErrExhausted) {
		t.Fatalf("too big: %v", err)
	}
	if err := r.HasTemplate(ctx, "base"); err != nil {
		t.Fatalf("has base: %v", err)
	}
	// Quota: a project with as many live sandboxes as allowed gets none.
	rq, _ := NewRemote(RemoteOptions{Store: st, Signer: NewSigner(secret, nil), Link: LinkOptions{Plaintext: true}, ProjectQuota: 1})
	live := core.Sandbox{ID: "sbx-00000000000000aa", ProjectID: "p", Template: "minimal", State: core.SandboxRunning, Node: "big"}
	if _, _, err := st.CreateSandboxOp(ctx, live, core.Operation{ID: "op-1", ProjectID: "p", Kind: "sandbox.create", Target: live.ID, State: core.OpSucceeded}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := rq.Place(ctx, sb); !errors.Is(err, core.ErrExhausted) {
		t.Fatalf("over quota: %v", err)
	}
}
