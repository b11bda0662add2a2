package multinode

// TestMultiNodeCredentials: egress credentials in a fleet. Two replicas
// share the credential store in PostgreSQL (envelope-encrypted under an
// operator key file the database never sees); one `space node --egress`
// runs the sandbox, inside a network namespace of the test's own with a
// fake upstream world (as TestMultiNodeEgress) that serves
// https://allowed.test with a certificate of a test CA the node's gateway
// trusts. Checked: a credential created through replica A is injected
// into a request of a sandbox created through replica B (the upstream sees
// the secret; the sandbox sent only the placeholder); the secret is
// nowhere in the sandbox (environment, files) nor in any API answer, nor
// in the database in clear; the binding holds (a path outside it gets no
// secret); a policy change through A takes effect on the live sandbox
// (detached: no secret; attached again: injected); the node restarted
// gets the secret again from a replica (it lived in its memory); a key rotation (new
// first key on the replicas, `space credentials rewrap`, the old key
// dropped) keeps it working; deleting the credential through A stops the
// injection on the node at once.

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	vns "github.com/vishvananda/netns"

	spacecluster "github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/store/postgres"
	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/test/testenv"
)

// authSeen records the Authorization headers the upstream received.
type authSeen struct {
	mu   sync.Mutex
	seen []string
}

func (a *authSeen) add(s string) {
	a.mu.Lock()
	a.seen = append(a.seen, s)
	a.mu.Unlock()
}

func (a *authSeen) count(s string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, x := range a.seen {
		if x == s {
			n++
		}
	}
	return n
}

// serveTLSUpstream serves https://allowed.test (allowedIP:443) in the
// upstream namespace with a certificate of a new CA; it returns the CA
// file for the node's --egress-upstream-ca.
func serveTLSUpstream(t *testing.T, w *upstreams, dir, want string, seen *authSeen) string {
	t.Helper()
	caPEM, caKey, err := spacecluster.NewCA("upstream test CA", 24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := spacecluster.IssueCert(caPEM, caKey, spacecluster.CertRequest{Role: spacecluster.RoleNode, Name: "allowed.test", Validity: time.Hour}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "upstream-ca.crt")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := func() (net.Listener, error) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		host, err := vns.Get()
		if err != nil {
			return nil, err
		}
		defer host.Close()
		if err := vns.Set(w.ns); err != nil {
			return nil, err
		}
		defer vns.Set(host)
		return net.Listen("tcp4", allowedIP+":443")
	}()
	if err != nil {
		t.Fatalf("listen in the upstream namespace: %v", err)
	}
	srv := testenv.ServeAuthEcho(ln, pair, want, seen.add)
	w.closers = append(w.closers, func() { srv.Close() })
	return caFile
}

func TestMultiNodeCredentials(t *testing.T) {
	if !inPrivateNetns(t) {
		return
	}
	began := time.Now()
	rnd := make([]byte, 16)
	rand.Read(rnd)
	canary := "space-canary-" + hex.EncodeToString(rnd)
	seen := &authSeen{}
	w := startUpstreams(t)
	defer w.close()
	dsn := pgtest.FreshDSN(t)
	env, err := testenv.New("space-mncreds")
	if err != nil {
		if env != nil {
			env.Remove()
		}
		t.Fatal(err)
	}
	upstreamCA := serveTLSUpstream(t, w, env.Work, "Bearer "+canary, seen)
	fetcher := buildFetcher(t, env.Work)
	c, secret := newFrame(t, env, dsn)
	opKey := make([]byte, 32)
	rand.Read(opKey)
	keyFile := filepath.Join(env.Work, "credential-keys")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(opKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n1 := c.addNode(env, secret, 0, "e1", "--egress", "--egress-pool", "10.214.0.0/24", "--egress-if-prefix", "mnc1",
		"--egress-table", "space-mnc1", "--egress-dns", wanDNS, "--egress-upstream-ca", upstreamCA)
	for _, name := range []string{"srv-a", "srv-b"} {
		c.addServer(env, secret, name, "--credential-keys", keyFile)
	}
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
	t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))
	a, b := c.servers[0], c.servers[1]
	var answers []string // every API answer: none may hold the secret
	call := func(via *proc, method, path string, body any) map[string]any {
		t.Helper()
		m := c.mustCall(via, method, path, body)
		answers = append(answers, fmt.Sprint(m))
		return m
	}

	// Created through A, read back through B without its secret.
	cred := call(a, "POST", "/v1/credentials", map[string]any{"name": "api token", "secret": canary, "host": "allowed.test",
		"prefix": "Bearer ", "methods": []string{"GET"}, "path_prefix": "/v1/", "env": "API_TOKEN"})
	credID, placeholder := cred["id"].(string), cred["placeholder"].(string)
	if l := call(b, "GET", "/v1/credentials", nil); !strings.Contains(fmt.Sprint(l), credID) {
		t.Fatalf("%s does not list the credential made through %s: %v", b.name, a.name, l)
	}

	// The database holds the secret sealed only, and never the operator key.
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	var dump string
	if err := conn.QueryRow(context.Background(), `SELECT COALESCE(string_agg(doc || encode(sealed,'hex') || encode(wrapped_key,'hex'), ''), '') FROM credentials`).Scan(&dump); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(dump, canary) || strings.Contains(dump, hex.EncodeToString([]byte(canary))) || strings.Contains(dump, hex.EncodeToString(opKey)) {
		t.Fatal("the database holds the secret or the operator key")
	}
	conn.Close(context.Background())

	// A sandbox through B with the credential attached.
	pol := map[string]any{"mode": "allowlist", "allow": []string{"allowed.test:443"}, "credentials": []string{credID}}
	m := call(b, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 64 << 20}, "network": pol})
	if done := c.waitOp(b, opID(m), 60*time.Second); done["state"] != "succeeded" {
		t.Fatalf("create: %v", done)
	}
	sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
	id, url, tok := sb["id"].(string), sess["data_url"].(string), sess["token"].(string)
	upload(t, url, tok, id, "/tmp/mnfetch", fetcher)
	fetch := func(path string) string {
		t.Helper()
		out, _, err := exec1(url, tok, id, "sh", "-c", `/tmp/mnfetch https://allowed.test`+path+` "Authorization: Bearer $API_TOKEN"`)
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		answers = append(answers, out)
		return out
	}
	injected := func() int { return seen.count("Bearer " + canary) }

	// Injected: the upstream got the secret, the sandbox sent the placeholder.
	echoed := fetch("/v1/echo")
	if !strings.Contains(echoed, "sent Authorization: Bearer "+placeholder+"\n") || !strings.Contains(echoed, "auth-ok /v1/echo") || injected() != 1 {
		t.Fatalf("not injected (upstream saw the secret %d times): %q", injected(), echoed)
	}
	// The binding: a path outside it gets no secret.
	if out := fetch("/admin/x"); strings.Contains(out, "auth-ok") || injected() != 1 {
		t.Fatalf("secret sent outside the binding's path: %q", out)
	}
	// Nothing in the sandbox holds the secret: its environment, and every
	// file outside /proc, /sys and /dev (searched for the canary's public
	// prefix, so the search itself carries no secret).
	inside, _, err := exec1(url, tok, id, "sh", "-c",
		"env; echo BEGIN; /bin/busybox find / -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f -print 2>/dev/null | /bin/busybox xargs /bin/busybox grep -l space-canary- 2>/dev/null; echo END")
	if err != nil {
		t.Fatal(err)
	}
	answers = append(answers, inside)
	_, rest, _ := strings.Cut(inside, "BEGIN")
	found, _, _ := strings.Cut(rest, "END")
	if !strings.Contains(inside, "API_TOKEN="+placeholder) || strings.TrimSpace(found) != "" {
		t.Fatalf("sandbox environment and files: %s", inside)
	}

	// Policy changes on the live sandbox through A: detached, then again.
	call(a, "PUT", "/v1/sandboxes/"+id+"/network", map[string]any{"mode": "allowlist", "allow": []string{"allowed.test:443"}})
	if out := fetch("/v1/echo"); strings.Contains(out, "auth-ok") || injected() != 1 {
		t.Fatalf("detached credential still injected: %q", out)
	}
	call(a, "PUT", "/v1/sandboxes/"+id+"/network", pol)
	if out := fetch("/v1/echo"); !strings.Contains(out, "auth-ok") || injected() != 2 {
		t.Fatalf("attached again through %s: %q", a.name, out)
	}
	call(b, "GET", "/v1/sandboxes/"+id, nil)
	call(b, "GET", "/v1/sandboxes/"+id+"/network/log", nil)

	// The node restarted: it re-adopts the sandbox without the secret (it
	// was in its memory only), and a replica sends it again.
	n1.signal(syscall.SIGTERM)
	n1.start(t)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if out := fetch("/v1/echo"); strings.Contains(out, "auth-ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s restarted, the credential was not injected again", n1.name)
		}
		time.Sleep(200 * time.Millisecond)
	}
	restartedAt := injected()

	// Key rotation: the replicas get a new first key (the old one still
	// opens), `space credentials rewrap` moves the record to it, and a
	// replica with the new key alone opens it.
	newKey := make([]byte, 32)
	rand.Read(newKey)
	rotate := func(keys string, procs ...*proc) {
		t.Helper()
		if err := os.WriteFile(keyFile, []byte(keys), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			p.signal(syscall.SIGTERM)
			p.start(t)
		}
	}
	rotate(hex.EncodeToString(newKey)+"\n"+hex.EncodeToString(opKey)+"\n", a, b)
	rw, err := exec.Command(env.Bin, "credentials", "rewrap", "--store", dsn, "--credential-keys", keyFile).CombinedOutput()
	if err != nil || !strings.Contains(string(rw), "rewrapped 1 credentials") {
		t.Fatalf("space credentials rewrap: %v\n%s", err, rw)
	}
	rotate(hex.EncodeToString(newKey)+"\n", a)
	call(a, "PUT", "/v1/sandboxes/"+id+"/network", map[string]any{"mode": "allowlist", "allow": []string{"allowed.test:443"}})
	call(a, "PUT", "/v1/sandboxes/"+id+"/network", pol)
	if out := fetch("/v1/echo"); !strings.Contains(out, "auth-ok") || injected() != restartedAt+1 {
		t.Fatalf("after the rotation, through %s with the new key only: %q", a.name, out)
	}

	// Deleted through A: the node stops injecting it at once.
	if st, _ := c.call(a, "DELETE", "/v1/credentials/"+credID, nil); st != http.StatusNoContent {
		t.Fatalf("delete credential: %d", st)
	}
	if out := fetch("/v1/echo"); strings.Contains(out, "auth-ok") || injected() != restartedAt+1 {
		t.Fatalf("deleted credential still injected: %q", out)
	}
	if l := call(b, "GET", "/v1/credentials", nil); strings.Contains(fmt.Sprint(l), credID) {
		t.Fatalf("%s still lists the deleted credential: %v", b.name, l)
	}

	// The secret never came back out.
	for _, s := range answers {
		if strings.Contains(s, canary) {
			t.Fatalf("an answer or output holds the secret: %.300s", s)
		}
	}
	if done := c.waitOp(a, opID(c.mustCall(a, "DELETE", "/v1/sandboxes/"+id, nil)), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("delete sandbox: %v", done)
	}
	t.Logf("done in %v", time.Since(began).Round(time.Millisecond))
}
