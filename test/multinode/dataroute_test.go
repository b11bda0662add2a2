package multinode

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/store/postgres"
	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/test/testenv"
)

// TestDataPlaneAnyNode: any node's data listener serves every sandbox. Two
// nodes and a replica (node links over mutual TLS); a sandbox on one node
// is driven through the other node's data listener: a command and its
// streamed output, a file written there and read on its own node, a
// forwarded port by its signed path URL; a token of another sandbox opens
// nothing through the peer either; an idle sandbox with auto_pause_seconds
// is paused by the replica and a command sent to the other node's
// listener resumes it (auto_resume) on its own node.
func TestDataPlaneAnyNode(t *testing.T) {
	c, srv, env := twoNodes(t, "space-mndata")

	type sbx struct{ id, node, url, tok string }
	create := func() sbx {
		m := c.mustCall(srv, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 32 << 20}})
		if done := c.waitOp(srv, opID(m), 60*time.Second); done["state"] != "succeeded" {
			t.Fatalf("create: %v", done)
		}
		sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
		return sbx{sb["id"].(string), sb["node"].(string), sess["data_url"].(string), sess["token"].(string)}
	}
	s1, s2 := create(), create()
	peerOf := func(s sbx) string { // the data URL of the node it is not on
		for _, p := range c.nodes {
			if p.name != s.node {
				return p.addr["data"]
			}
		}
		return ""
	}
	via := peerOf(s1)
	if via == "" || via == s1.url {
		t.Fatalf("no other node for %s on %s", s1.id, s1.node)
	}
	// A command through the other node, its output streamed back.
	if out, code, err := exec1(via, s1.tok, s1.id, "sh", "-c", "echo via-peer; hostname"); err != nil || code != 0 || !strings.HasPrefix(out, "via-peer\n") {
		t.Fatalf("exec in %s on %s through %s: %q %d %v", s1.id, s1.node, via, out, code, err)
	}
	// A file written through the other node is on the sandbox's own.
	src := filepath.Join(env.Work, "payload")
	os.WriteFile(src, []byte("payload-through-peer\n"), 0o644)
	upload(t, via, s1.tok, s1.id, "/tmp/payload", src)
	if out, code, err := exec1(s1.url, s1.tok, s1.id, "cat", "/tmp/payload"); err != nil || code != 0 || out != "payload-through-peer\n" {
		t.Fatalf("file written through the peer, read on %s: %q %d %v", s1.node, out, code, err)
	}
	// Another sandbox's token opens nothing through the peer.
	if _, _, err := exec1(via, s2.tok, s1.id, "true"); err == nil {
		t.Fatalf("sandbox %s's token worked for %s through the peer", s2.id, s1.id)
	}
	// A forwarded port, by its signed path URL on the other node.
	if _, code, err := exec1(s1.url, s1.tok, s1.id, "sh", "-c", "mkdir -p /tmp/w && echo on-"+s1.node+" > /tmp/w/index.html && busybox httpd -p 127.0.0.1:8080 -h /tmp/w"); err != nil || code != 0 {
		t.Fatalf("start httpd: %d %v", code, err)
	}
	signed := c.mustCall(srv, "POST", "/v1/sandboxes/"+s1.id+"/ports/8080/url", map[string]any{"ttl_seconds": 60})
	pu := strings.Replace(signed["path_url"].(string), s1.url, via, 1)
	var page string
	for i := 0; i < 50 && page != "on-"+s1.node+"\n"; i++ {
		if resp, err := http.Get(pu); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			page = string(b)
		}
		if page != "on-"+s1.node+"\n" {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if page != "on-"+s1.node+"\n" {
		t.Fatalf("forwarded port through the peer: %q", page)
	}
	// Auto-pause and automatic resume: an idle sandbox is paused by the
	// replica (its node reports the idle time), and a command sent to the
	// other node's listener wakes it on its own node.
	m := c.mustCall(srv, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 32 << 20},
		"auto_pause_seconds": 2, "auto_resume": true})
	if done := c.waitOp(srv, opID(m), 60*time.Second); done["state"] != "succeeded" {
		t.Fatalf("create: %v", done)
	}
	sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
	s3 := sbx{sb["id"].(string), sb["node"].(string), sess["data_url"].(string), sess["token"].(string)}
	t0 := time.Now()
	for st := ""; st != "paused"; {
		if time.Since(t0) > 30*time.Second {
			t.Fatalf("sandbox %s with auto_pause_seconds 2 is %s after %v", s3.id, st, time.Since(t0))
		}
		time.Sleep(200 * time.Millisecond)
		st, _ = c.mustCall(srv, "GET", "/v1/sandboxes/"+s3.id, nil)["state"].(string)
	}
	t.Logf("sandbox %s on %s auto-paused %v after its creation", s3.id, s3.node, time.Since(t0).Round(time.Millisecond))
	if out, code, err := exec1(peerOf(s3), s3.tok, s3.id, "echo", "awake"); err != nil || code != 0 || out != "awake\n" {
		t.Fatalf("exec through the peer woke nothing: %q %d %v", out, code, err)
	}
	if st := c.mustCall(srv, "GET", "/v1/sandboxes/"+s3.id, nil)["state"]; st != "running" {
		t.Fatalf("after the call through the peer %s is %v", s3.id, st)
	}
	for _, s := range []sbx{s1, s2, s3} {
		if done := c.waitOp(srv, opID(c.mustCall(srv, "DELETE", "/v1/sandboxes/"+s.id, nil)), 30*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete %s: %v", s.id, done)
		}
	}
}

// twoNodes starts two nodes and one replica (node links over mutual TLS)
// on a fresh database, with an API key of project p1.
func twoNodes(t *testing.T, prefix string) (*cluster, *proc, *testenv.Server) {
	t.Helper()
	if os.Getenv(pgtest.EnvDSN) == "" {
		t.Skipf("needs PostgreSQL: set %s (export %s=$(bash scripts/postgres.sh))", pgtest.EnvDSN, pgtest.EnvDSN)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (the namespace driver)")
	}
	dsn := pgtest.FreshDSN(t)
	env, err := testenv.New(prefix)
	if err != nil {
		if env != nil {
			env.Remove()
		}
		t.Fatal(err)
	}
	c, secret := newFrame(t, env, dsn)
	c.addNode(env, secret, 0, "d1")
	c.addNode(env, secret, 1, "d2")
	srv := c.addServer(env, secret, "srv-a")
	withLinkCerts(t, env.Bin, env.Work, c.nodes, c.servers)
	for _, p := range append(append([]*proc{}, c.nodes...), c.servers...) {
		p.start(t)
	}
	c.apiKey(env.Bin)
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waitNodes(t, st, c.nodes)

	return c, srv, env
}
