package multinode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/postgres"
	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/test/testenv"
)

// TestNodeLinkTLS runs nodes and replicas as separate processes with node
// links over mutual TLS and checks who is refused: a node whose
// certificate is from another CA (by the replica), a replica whose
// certificate is from another CA, a replica without a certificate and a
// client without one (by the node), plaintext HTTP to a node, and a node
// asked to serve plaintext off loopback or with no certificate at all.
func TestNodeLinkTLS(t *testing.T) {
	if os.Getenv(pgtest.EnvDSN) == "" {
		t.Skipf("needs PostgreSQL: set %s (export %s=$(bash scripts/postgres.sh))", pgtest.EnvDSN, pgtest.EnvDSN)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (the namespace driver)")
	}
	dsn := pgtest.FreshDSN(t)
	env, err := testenv.New("space-nodelink")
	if err != nil {
		if env != nil {
			env.Remove()
		}
		t.Fatal(err)
	}
	c, secret := newFrame(t, env, dsn)
	// Two CAs: the cluster's, and another one (a certificate from it must
	// not open the cluster). "bundle" trusts both: the impostors use it so
	// that it is the other end that refuses them.
	ca1, ca2 := filepath.Join(env.Work, "ca1"), filepath.Join(env.Work, "ca2")
	certsInit(t, env.Bin, ca1)
	certsInit(t, env.Bin, ca2)
	pem1, _ := os.ReadFile(filepath.Join(ca1, "ca.crt"))
	pem2, _ := os.ReadFile(filepath.Join(ca2, "ca.crt"))
	bundle := filepath.Join(env.Work, "bundle.crt")
	if err := os.WriteFile(bundle, append(append([]byte{}, pem1...), pem2...), 0o644); err != nil {
		t.Fatal(err)
	}
	impostor := func(dir string) []string {
		return []string{"--cluster-cert", filepath.Join(dir, "tls.crt"), "--cluster-key", filepath.Join(dir, "tls.key"), "--cluster-ca", bundle}
	}
	rogue := c.addNode(env, secret, 0, "rogue", impostor(certsIssue(t, env.Bin, ca2, filepath.Join(env.Work, "tls-rogue"), "node", "rogue"))...)
	good := c.addServer(env, secret, "srv-good", "--cluster-tls-dir", certsIssue(t, env.Bin, ca1, filepath.Join(env.Work, "tls-good"), "server", "srv-good"))
	rogue.start(t)
	good.start(t)
	c.apiKey(env.Bin)
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waitNodes(t, st, []*proc{rogue})
	create := func(via *proc) map[string]any {
		m := c.mustCall(via, "POST", "/v1/sandboxes", map[string]any{"template": "minimal",
			"limits": map[string]any{"memory_bytes": 32 << 20, "cpu_millis": 100, "pids": 64}})
		return c.waitOp(via, opID(m), 60*time.Second)
	}
	failedWith := func(op map[string]any, want string) {
		t.Helper()
		if op["state"] != "failed" || !strings.Contains(fmt.Sprint(op["error"]), want) {
			t.Fatalf("operation %v, want failed with %q", op, want)
		}
	}

	// 1. The replica refuses a node whose certificate is from another CA
	// (the node itself would accept the replica).
	failedWith(create(good), "certificate signed by unknown authority")
	rogue.signal(syscall.SIGTERM)
	waitLost(t, st, "rogue")

	// 2. The cluster's node, and replicas with a certificate of another
	// CA and without one.
	n1 := c.addNode(env, secret, 1, "n1", "--cluster-tls-dir", certsIssue(t, env.Bin, ca1, filepath.Join(env.Work, "tls-n1"), "node", "n1"))
	bad := c.addServer(env, secret, "srv-bad", impostor(certsIssue(t, env.Bin, ca2, filepath.Join(env.Work, "tls-bad"), "server", "srv-bad"))...)
	bare := c.addServer(env, secret, "srv-bare", "--cluster-plaintext")
	for _, p := range []*proc{n1, bad, bare} {
		p.start(t)
	}
	if !strings.HasPrefix(n1.addr["rpc"], "https://") {
		t.Fatalf("node RPC URL %s is not https", n1.addr["rpc"])
	}
	waitNodes(t, st, []*proc{n1})
	// The cluster's replica works over mutual TLS, end to end.
	op := create(good)
	if op["state"] != "succeeded" {
		t.Fatalf("create through the cluster's replica: %v", op)
	}
	id := op["target"].(string)
	url, tok := c.session(good, id)
	if out, code, err := exec1(url, tok, id, "echo", "over-mtls"); err != nil || code != 0 || out != "over-mtls\n" {
		t.Fatalf("exec: %q %d %v", out, code, err)
	}
	// A replica with a certificate of another CA: the node refuses it.
	failedWith(create(bad), "")
	waitLog(t, n1, "certificate signed by unknown authority")
	// A replica with no certificate does not even try an https node.
	failedWith(create(bare), "no node link certificate")
	// A client with no certificate, trusting the node: refused in the
	// handshake.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem1)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "n1", MinVersion: tls.VersionTLS13}}}
	if resp, err := hc.Post(n1.addr["rpc"]+"/node/v1/stop", "application/json", strings.NewReader(`{"id":"`+id+`"}`)); err == nil {
		resp.Body.Close()
		t.Fatalf("a client without a certificate got %s", resp.Status)
	}
	waitLog(t, n1, "client didn't provide a certificate")
	// Plaintext HTTP to the TLS port reaches no handler.
	plain := "http://" + strings.TrimPrefix(n1.addr["rpc"], "https://")
	if resp, err := http.Post(plain+"/node/v1/stop", "application/json", strings.NewReader(`{"id":"`+id+`"}`)); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plaintext HTTP reached the node RPC")
		}
	}
	// The sandbox is untouched by all of this.
	if out, code, err := exec1(url, tok, id, "echo", "still"); err != nil || code != 0 || out != "still\n" {
		t.Fatalf("exec after the refusals: %q %d %v", out, code, err)
	}
	if m := c.mustCall(good, "DELETE", "/v1/sandboxes/"+id, nil); opID(m) != "" {
		if done := c.waitOp(good, opID(m), 30*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete: %v", done)
		}
	}

	// 3. A node refuses to start without a certificate, and with plaintext
	// off loopback.
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{nil, "needs a certificate"},
		{[]string{"--cluster-plaintext", "--listen", "0.0.0.0:0"}, "loopback"},
	} {
		args := append([]string{"node", "--name", "n9", "--store", dsn, "--data-dir", filepath.Join(env.Work, "n9"),
			"--cluster-secret-file", secret}, tc.extra...)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		out, err := exec.CommandContext(ctx, env.Bin, args...).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Fatalf("space node %v: %v, want a refusal with %q:\n%s", tc.extra, err, tc.want, out)
		}
	}
}

// waitLost waits until node name is marked lost in the registry.
func waitLost(t *testing.T, st core.NodeStore, name string) {
	t.Helper()
	for deadline := time.Now().Add(3 * nodeTimeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		list, err := st.ListNodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range list {
			if n.Name == name && n.State == core.NodeLost {
				return
			}
		}
	}
	t.Fatalf("node %s not marked lost", name)
}

// waitLog waits for s in a process's log.
func waitLog(t *testing.T, p *proc, s string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if raw, _ := os.ReadFile(p.log); strings.Contains(string(raw), s) {
			return
		}
	}
	t.Fatalf("%s never logged %q; log:\n%s", p.name, s, p.tail())
}
