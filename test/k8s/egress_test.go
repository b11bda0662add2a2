package k8s

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	spacecluster "github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/test/testenv"
)

// The fake internet of the egress check: addresses the test puts on the
// cluster's bridge (pods route to them through their gateway, the
// bridge), outside every range the egress gateway treats as internal.
const (
	upstreamDNS     = "11.0.0.53"
	upstreamAllowed = "11.0.0.10"
	upstreamDenied  = "11.0.0.20"
)

// upstreamCADir is the host directory of the upstream CA file; the test
// puts it in the ConfigMap space-upstream-ca, as
// docs/install-kubernetes.md says.
const upstreamCADir = state + "/upstream-ca"

// testEgress checks the egress allowlist with an injected credential on
// the cluster: the node DaemonSet gets the resolver and the upstream CA
// (--egress-dns, --egress-upstream-ca from a ConfigMap), a credential is
// stored through the Service, and a sandbox created with an allowlist
// holding allowed.test and the credential reaches https://allowed.test
// with the secret injected by the node's gateway (the sandbox holds only
// the placeholder), while https://denied.test is refused before it is
// dialled.
func testEgress(t *testing.T, k kube, srv *testenv.Server, key string) {
	t.Helper()
	t0 := time.Now()
	canary := fmt.Sprintf("space-canary-%d", time.Now().UnixNano())
	seen := serveUpstreams(t, "Bearer "+canary)
	k.must(time.Minute, "-n", "space", "create", "configmap", "space-upstream-ca", "--from-file=ca.crt="+filepath.Join(upstreamCADir, "ca.crt"))
	patch := []map[string]any{
		{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--egress-dns=" + upstreamDNS},
		{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--egress-upstream-ca=/etc/space/upstream-ca/ca.crt"},
		{"op": "add", "path": "/spec/template/spec/volumes/-", "value": map[string]any{"name": "upstream-ca", "configMap": map[string]any{"name": "space-upstream-ca"}}},
		{"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": map[string]any{"name": "upstream-ca", "mountPath": "/etc/space/upstream-ca", "readOnly": true}},
	}
	raw, _ := json.Marshal(patch)
	k.must(time.Minute, "-n", "space", "patch", "daemonset", "space-node", "--type=json", "-p", string(raw))
	if _, err := k.run(4*time.Minute, "-n", "space", "rollout", "status", "daemonset/space-node", "--timeout=3m"); err != nil {
		t.Fatalf("the node with --egress-dns and --egress-upstream-ca: %v\nlogs:\n%s", err, podLogs())
	}
	waitHealthy(t, srv)
	hdr := map[string]string{"X-API-Key": key}
	st, cred, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/credentials", hdr, map[string]any{"name": "api token", "secret": canary,
		"host": "allowed.test", "prefix": "Bearer ", "methods": []string{"GET"}, "path_prefix": "/v1/", "env": "API_TOKEN"})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("create credential: %d %v %v", st, cred, err)
	}
	credID, placeholder := cred["id"].(string), cred["placeholder"].(string)
	// The node may still be registering after its rollout: retry create.
	var sb testenv.Sandbox
	for deadline := time.Now().Add(time.Minute); ; {
		sb, err = srv.CreateSandbox(key, map[string]any{"template": "minimal",
			"network": map[string]any{"mode": "allowlist", "allow": []string{"allowed.test:443"}, "credentials": []string{credID}}})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if err != nil {
		t.Fatalf("create with an allowlist and a credential: %v\nlogs:\n%s", err, podLogs())
	}
	fetcher := filepath.Join(t.TempDir(), "mnfetch")
	build := exec.Command("go", "build", "-ldflags", "-s -w", "-o", fetcher, "./test/multinode/mnfetch")
	build.Dir = testenv.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build mnfetch: %v\n%s", err, out)
	}
	if err := sb.Upload("/tmp/mnfetch", fetcher); err != nil {
		t.Fatal(err)
	}
	out, code, err := sb.Run(`/tmp/mnfetch https://allowed.test/v1/echo "Authorization: Bearer $API_TOKEN"`, "")
	if err != nil || code != 0 || !strings.Contains(out, "sent Authorization: Bearer "+placeholder+"\n") ||
		!strings.Contains(out, "auth-ok /v1/echo") || seen.count("allowed", "Bearer "+canary) != 1 || strings.Contains(out, canary) {
		t.Fatalf("https://allowed.test through the gateway: %q exit %d %v (the upstream saw the secret %d times)\nlogs:\n%s",
			out, code, err, seen.count("allowed", "Bearer "+canary), podLogs())
	}
	out, code, err = sb.Run(`/tmp/mnfetch https://denied.test/v1/echo "Authorization: Bearer $API_TOKEN"`, "")
	if err != nil || code == 0 || strings.Contains(out, "auth-") || seen.count("denied", "") != 0 {
		t.Fatalf("https://denied.test, not in the allowlist: %q exit %d %v (its upstream got %d requests)", out, code, err, seen.count("denied", ""))
	}
	t.Logf("egress through the node pod's gateway: allowed.test answered with the injected credential, denied.test refused (%s); in %v",
		strings.TrimSpace(out), time.Since(t0).Round(time.Second))
	st, m, err := testenv.DoJSON("DELETE", srv.Ctrl+"/v1/sandboxes/"+sb.ID, hdr, nil)
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("delete: %d %v %v", st, m, err)
	}
	waitOK(t, srv, key, m, "delete")
}

// upstreamsSeen records the Authorization header of each request an
// upstream got ("" for none), per upstream.
type upstreamsSeen struct {
	mu   sync.Mutex
	auth map[string][]string
}

// count is how many requests upstream got with Authorization auth, or at
// all when auth is "".
func (s *upstreamsSeen) count(upstream, auth string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.auth[upstream] {
		if auth == "" || a == auth {
			n++
		}
	}
	return n
}

// serveUpstreams puts the fake internet's addresses on the cluster's
// bridge and serves, from this process: DNS on upstreamDNS:53
// (allowed.test, denied.test), and HTTPS for each name on its address
// with a certificate of a new CA, written to upstreamCADir/ca.crt. The
// allowed upstream answers auth-ok when it gets wantAuth.
func serveUpstreams(t *testing.T, wantAuth string) *upstreamsSeen {
	t.Helper()
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{upstreamDNS, upstreamAllowed, upstreamDenied} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a).To4(), Mask: net.CIDRMask(32, 32)}}
		if err := netlink.AddrAdd(br, addr); err != nil {
			t.Fatalf("address %s on %s: %v", a, bridge, err)
		}
		// down deletes the bridge, and the addresses with it; a test that
		// ends before removes them itself.
		t.Cleanup(func() { netlink.AddrDel(br, addr) })
	}
	pc, err := net.ListenPacket("udp4", upstreamDNS+":53")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go testenv.ServeDNS(pc, map[string]string{"allowed.test.": upstreamAllowed, "denied.test.": upstreamDenied})

	caPEM, caKey, err := spacecluster.NewCA("upstream test CA", 24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(upstreamCADir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upstreamCADir, "ca.crt"), caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	seen := &upstreamsSeen{auth: map[string][]string{}}
	for name, ip := range map[string]string{"allowed": upstreamAllowed, "denied": upstreamDenied} {
		crt, key, err := spacecluster.IssueCert(caPEM, caKey, spacecluster.CertRequest{Role: spacecluster.RoleNode, Name: name + ".test", Validity: time.Hour}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp4", ip+":443")
		if err != nil {
			t.Fatal(err)
		}
		srv := testenv.ServeAuthEcho(ln, pair, wantAuth, func(auth string) {
			seen.mu.Lock()
			defer seen.mu.Unlock()
			seen.auth[name] = append(seen.auth[name], auth)
		})
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(ctx)
		})
	}
	return seen
}
