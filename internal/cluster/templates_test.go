package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// peerBuilder serves a real snapshot store's objects as a node serves its
// template layers; tamper flips a byte of every chunk it serves.
type peerBuilder struct {
	s       *snapshot.Store
	tamper  atomic.Bool
	builds  atomic.Int32
	payload string
}

func (p *peerBuilder) BuildTemplate(ctx context.Context, spec TemplateBuildSpec, payload string, progress core.Progress) (json.RawMessage, error) {
	p.builds.Add(1)
	if payload != "" {
		raw, err := os.ReadFile(payload)
		if err != nil {
			return nil, err
		}
		p.payload = string(raw)
	}
	progress(50, "half")
	return json.Marshal(map[string]string{"name": spec.Request.Name})
}

func (p *peerBuilder) TemplateBuildLog(ctx context.Context, opID string, step int) (io.ReadCloser, error) {
	return nil, core.ErrNotFound
}

func (p *peerBuilder) TemplateAdmin(ctx context.Context, req TemplateAdminReq) (json.RawMessage, error) {
	return json.Marshal(req)
}

func (p *peerBuilder) TemplateObject(ctx context.Context, key string) ([]byte, error) {
	data, err := p.s.ReadLocal(key, 1<<30)
	if errors.Is(err, os.ErrNotExist) {
		return nil, core.ErrNotFound
	}
	if err == nil && p.tamper.Load() && strings.HasPrefix(key, "chunks/") {
		data[0] ^= 1
	}
	return data, err
}

// A template tree copied from a peer is checked object by object: a
// tampered chunk fails the copy and is not kept; an honest peer's tree
// loads whole.
func TestPeerObjectsVerified(t *testing.T) {
	secret := []byte(strings.Repeat("s", 32))
	src, err := snapshot.Open(t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "hello.txt"), []byte("built-by-run\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := src.Capture(context.Background(), driver.Layer{Dir: tree, UIDBase: 100000, UIDCount: 65536}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pb := &peerBuilder{s: src}
	srv := httptest.NewServer(TemplateRoutes(http.NotFoundHandler(), pb, NewVerifier(secret, "n1", nil), t.Logf))
	defer srv.Close()
	peer := PeerObjects{C: NewClient("n1", srv.URL, NewSigner(secret, nil), nil)}

	pb.tamper.Store(true)
	dst, err := snapshot.Open(t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.LoadStateFrom(context.Background(), peer, []string{res.Manifest}); !errors.Is(err, snapshot.ErrCorrupt) {
		t.Fatalf("tampered chunk: %v, want ErrCorrupt", err)
	}
	n := 0
	filepath.WalkDir(filepath.Join(dst.Dir(), "chunks"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	if n != 0 {
		t.Fatalf("%d chunks kept from a tampering peer", n)
	}
	pb.tamper.Store(false)
	st, err := dst.LoadStateFrom(context.Background(), peer, []string{res.Manifest})
	if err != nil {
		t.Fatal(err)
	}
	if e := st["hello.txt"]; e == nil || e.Size != int64(len("built-by-run\n")) {
		t.Fatalf("state: %v", st)
	}
	// Objects the peer does not have are "not exist" to the store.
	if _, err := peer.Get(context.Background(), "manifests/"+strings.Repeat("0", 64), 1<<20); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing object: %v", err)
	}
}

// A build's streamed body must hash to what its token signs; a good one
// runs, with its progress lines and result reaching the caller.
func TestTemplateBuildBody(t *testing.T) {
	secret := []byte(strings.Repeat("s", 32))
	pb := &peerBuilder{}
	srv := httptest.NewServer(TemplateRoutes(http.NotFoundHandler(), pb, NewVerifier(secret, "n1", nil), t.Logf))
	defer srv.Close()
	c := NewClient("n1", srv.URL, NewSigner(secret, nil), nil)
	payload := filepath.Join(t.TempDir(), "context.tar")
	if err := os.WriteFile(payload, []byte("the-context"), 0o600); err != nil {
		t.Fatal(err)
	}
	var seen []string
	raw, err := c.BuildTemplate(context.Background(), TemplateBuildSpec{Kind: "source", Request: core.TemplateBuildRequest{Name: "t1"}}, payload,
		func(pct int, msg string) { seen = append(seen, msg) })
	if err != nil || !strings.Contains(string(raw), `"t1"`) || len(seen) != 1 || pb.payload != "the-context" {
		t.Fatalf("build: %s %v, progress %v, payload %q", raw, err, seen, pb.payload)
	}
	// The same signed hash over another body: refused, nothing built.
	body := []byte(`{"kind":"source"}` + "\nforged")
	good := sha256.Sum256([]byte(`{"kind":"source"}` + "\n"))
	req, _ := http.NewRequest("POST", srv.URL+PathTemplateBuild, bytes.NewReader(body))
	req.Header.Set(HeaderBodySum, hex.EncodeToString(good[:]))
	req.Header.Set("Authorization", authScheme+NewSigner(secret, nil).SignSum("n1", "POST", PathTemplateBuild, good))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || pb.builds.Load() != 1 {
		t.Fatalf("forged body: %d, builds %d", resp.StatusCode, pb.builds.Load())
	}
	// Another cluster's token: refused before the body is read.
	other := NewClient("n1", srv.URL, NewSigner([]byte(strings.Repeat("z", 32)), nil), nil)
	if _, err := other.BuildTemplate(context.Background(), TemplateBuildSpec{Kind: "source"}, "", nil); !errors.Is(err, core.ErrUnavailable) || pb.builds.Load() != 1 {
		t.Fatalf("foreign token: %v, builds %d", err, pb.builds.Load())
	}
}

// A build goes to the freest ready node that has its FROM template (the
// project's before the public one), and to any ready node when none has
// it; with none ready it is unavailable.
func TestBuildNode(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r, err := NewRemote(RemoteOptions{Store: st, Signer: NewSigner([]byte(strings.Repeat("s", 32)), nil),
		Link: LinkOptions{Plaintext: true}, Timeout: time.Minute, NodeCacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.BuildNode(ctx); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("no node: %v", err)
	}
	put := func(name string, used int64, templates ...string) {
		if _, err := st.PutNode(ctx, core.NodeRecord{Name: name, Kind: core.NodeKindNode, RPCURL: "http://127.0.0.1:1",
			MemoryBytes: 1 << 30, UsedMemoryBytes: used, CPUMillis: 1000, Templates: templates, HeartbeatAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	put("n1", 0, "minimal")
	put("n2", 1<<29, "minimal", "base")
	put("n3", 3<<28, "minimal", "~p1~base")
	for _, tc := range []struct {
		base []string
		want string
	}{
		{nil, "n1"},                          // the freest
		{[]string{"~p1~base", "base"}, "n3"}, // the project's base first
		{[]string{"~p2~base", "base"}, "n2"}, // else the public one
		{[]string{"~p1~none", "none"}, "n1"}, // nowhere: any node
	} {
		c, err := r.BuildNode(ctx, tc.base...)
		if err != nil || c.Name != tc.want {
			t.Errorf("BuildNode(%v): %v %v, want %s", tc.base, c, err, tc.want)
		}
	}
}
