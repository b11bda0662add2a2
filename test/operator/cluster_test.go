// Package operator_test runs `space operator` against a real etcd and
// kube-apiserver (no kubelet: the operator needs only the API) and a real
// `space server`, each started by the test on free loopback ports with
// its own data directories and certificates.
package operator_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/operator"
	"github.com/space-sandbox/space/test/testenv"
	"sigs.k8s.io/yaml"
)

// Tokens of the API server's static token file: the admin the test acts
// as, and the operator's user, bound only to deploy/operator/rbac.yaml's
// ClusterRole so that the test checks those rules are enough.
const (
	adminToken    = "space-test-admin-token"
	operatorToken = "space-test-operator-token"
	operatorUser  = "space-operator-test"
)

// k8sBins finds etcd and kube-apiserver: $SPACE_K8S_BIN, the operator's
// own cache (/var/cache/space/k8s-operator/bin) or scripts/k8s.sh's.
func k8sBins() (etcd, apiserver string) {
	var dirs []string
	if d := os.Getenv("SPACE_K8S_BIN"); d != "" {
		dirs = append(dirs, d)
	}
	dirs = append(dirs, "/var/cache/space/k8s-operator/bin")
	m, _ := filepath.Glob("/var/cache/space/k8s/etcd/*/bin")
	dirs = append(dirs, m...)
	m, _ = filepath.Glob("/var/cache/space/k8s/kubernetes/*/bin")
	dirs = append(dirs, m...)
	for _, d := range dirs {
		if etcd == "" {
			if _, err := os.Stat(filepath.Join(d, "etcd")); err == nil {
				etcd = filepath.Join(d, "etcd")
			}
		}
		if apiserver == "" {
			if _, err := os.Stat(filepath.Join(d, "kube-apiserver")); err == nil {
				apiserver = filepath.Join(d, "kube-apiserver")
			}
		}
	}
	return etcd, apiserver
}

// kubectlBin is kubectl next to kube-apiserver or in scripts/k8s.sh's
// cache, or "".
func kubectlBin(apiserver string) string {
	cands := []string{filepath.Join(filepath.Dir(apiserver), "kubectl")}
	m, _ := filepath.Glob("/var/cache/space/k8s/kubernetes/*/bin/kubectl")
	for _, p := range append(cands, m...) {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// cluster is an etcd and a kube-apiserver with the agent-sandbox CRDs.
type cluster struct {
	dir, server, kubeconfig, opKubeconfig string
	ca                                    []byte
	admin                                 *operator.Kube
	kubectl                               string
}

// startProc starts a long-running process logging to dir/name.log and
// stops it (SIGTERM, then SIGKILL) when the test ends.
func startProc(t *testing.T, dir, name string, argv ...string) *exec.Cmd {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return cmd
}

func logTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// servingPKI makes a CA and a serving certificate for 127.0.0.1 and
// localhost signed by it, and returns the CA, the certificate and its key
// in PEM.
func servingPKI(t *testing.T, caName, name string) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: caName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ecKeyPEM(key)
}

func ecKeyPEM(k *ecdsa.PrivateKey) []byte {
	der, _ := x509.MarshalECPrivateKey(k)
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

// writeFiles writes name -> content into dir.
func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// writePKI makes a CA, the API server's serving certificate for
// 127.0.0.1 and the service-account signing key.
func writePKI(t *testing.T, dir string) []byte {
	t.Helper()
	caPEM, crt, key := servingPKI(t, "space-operator-test-ca", "kube-apiserver")
	saKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	saPub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	writeFiles(t, dir, map[string][]byte{"ca.crt": caPEM, "apiserver.crt": crt, "apiserver.key": key,
		"sa.key": ecKeyPEM(saKey), "sa.pub": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		"tokens.csv": []byte(fmt.Sprintf("%s,space-test-admin,1,\"system:masters\"\n%s,%s,2\n", adminToken, operatorToken, operatorUser))})
	return caPEM
}

func writeKubeconfig(t *testing.T, path, server string, ca []byte, token string) {
	t.Helper()
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %s, certificate-authority-data: %s}
users:
- name: test
  user: {token: %s}
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`, server, base64.StdEncoding.EncodeToString(ca), token)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startCluster starts etcd and kube-apiserver, installs the CRDs and the
// RBAC of deploy/operator, and binds the operator's user to its role.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	etcdBin, apiBin := k8sBins()
	if etcdBin == "" || apiBin == "" {
		t.Skip("etcd and kube-apiserver are not built: run scripts/k8s.sh build (or set SPACE_K8S_BIN)")
	}
	dir := t.TempDir()
	c := &cluster{dir: dir, kubectl: kubectlBin(apiBin)}
	c.ca = writePKI(t, dir)
	etcdClient, etcdPeer, apiPort := freePort(t), freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	startProc(t, dir, "etcd", etcdBin, "--name", "optest", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "optest="+peerURL, "--unsafe-no-fsync")
	waitFor(t, 60*time.Second, "etcd", func() error {
		resp, err := http.Get(etcdURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	start := time.Now()
	startProc(t, dir, "kube-apiserver", apiBin, "--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(apiPort),
		"--tls-cert-file", filepath.Join(dir, "apiserver.crt"), "--tls-private-key-file", filepath.Join(dir, "apiserver.key"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"), "--service-cluster-ip-range", "10.251.0.0/24",
		"--endpoint-reconciler-type", "none", "--profiling=false", "--cert-dir", filepath.Join(dir, "certs"))
	c.server = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	c.admin = operator.NewKubeToken(c.server, adminToken, c.ca)
	waitFor(t, 3*time.Minute, "kube-apiserver", func() error {
		return c.admin.Do(context.Background(), http.MethodGet, "/readyz", "", nil, nil)
	})
	t.Logf("kube-apiserver ready in %v", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- kube-apiserver log (tail) ----\n%s", logTail(filepath.Join(dir, "kube-apiserver.log"), 3000))
		}
	})
	c.kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	c.opKubeconfig = filepath.Join(dir, "operator.kubeconfig")
	writeKubeconfig(t, c.kubeconfig, c.server, c.ca, adminToken)
	writeKubeconfig(t, c.opKubeconfig, c.server, c.ca, operatorToken)

	c.apply(t, "", filepath.Join(testenv.RepoRoot(), "deploy/operator/crds.yaml"))
	c.create(t, "", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "space"}})
	c.apply(t, "", filepath.Join(testenv.RepoRoot(), "deploy/operator/rbac.yaml"))
	c.create(t, "", map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": "space-operator-test"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "space-operator"},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": operatorUser}}})
	for _, crd := range []string{"sandboxes.agents.x-k8s.io", "sandboxtemplates.extensions.agents.x-k8s.io",
		"sandboxclaims.extensions.agents.x-k8s.io", "sandboxwarmpools.extensions.agents.x-k8s.io"} {
		waitFor(t, time.Minute, "CRD "+crd, func() error {
			var obj struct {
				Status struct{ Conditions []operator.Condition }
			}
			if err := c.admin.Get(context.Background(), operator.ResCRD, "", crd, &obj); err != nil {
				return err
			}
			for _, cd := range obj.Status.Conditions {
				if cd.Type == "Established" && cd.Status == "True" {
					return nil
				}
			}
			return fmt.Errorf("not established")
		})
	}
	// A CRD is established before its discovery and storage settle: wait
	// until the collections answer.
	for _, r := range []operator.Resource{operator.ResSandbox, operator.ResClaim, operator.ResTemplate, operator.ResWarmPool} {
		waitFor(t, time.Minute, r.Plural, func() error {
			_, _, err := c.admin.List(context.Background(), r, "")
			return err
		})
	}
	return c
}

// kinds maps the kinds the tests create to their collections.
var kinds = map[string]operator.Resource{
	"CustomResourceDefinition": operator.ResCRD,
	"Namespace":                operator.ResNamespace,
	"ServiceAccount":           {Version: "v1", Plural: "serviceaccounts", Namespaced: true},
	"ClusterRole":              {Group: "rbac.authorization.k8s.io", Version: "v1", Plural: "clusterroles"},
	"ClusterRoleBinding":       {Group: "rbac.authorization.k8s.io", Version: "v1", Plural: "clusterrolebindings"},
	"Sandbox":                  operator.ResSandbox,
	"SandboxClaim":             operator.ResClaim,
	"SandboxTemplate":          operator.ResTemplate,
	"SandboxWarmPool":          operator.ResWarmPool,
	"Secret":                   operator.ResSecret,
	"ConfigMap":                {Version: "v1", Plural: "configmaps", Namespaced: true},
}

// create creates one object (ns overrides its namespace when set).
func (c *cluster) create(t *testing.T, ns string, obj map[string]any) {
	t.Helper()
	if err := c.tryCreate(ns, obj); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) tryCreate(ns string, obj map[string]any) error {
	kind, _ := obj["kind"].(string)
	r, ok := kinds[kind]
	if !ok {
		return fmt.Errorf("unknown kind %q", kind)
	}
	meta, _ := obj["metadata"].(map[string]any)
	if ns == "" && meta != nil {
		ns, _ = meta["namespace"].(string)
	}
	if r.Namespaced && ns == "" {
		ns = "default"
	}
	if !r.Namespaced {
		ns = ""
	}
	if err := c.admin.Create(context.Background(), r, ns, obj, nil); err != nil {
		return fmt.Errorf("create %s %v: %w", kind, meta["name"], err)
	}
	return nil
}

// apply creates every document of a YAML file.
func (c *cluster) apply(t *testing.T, ns, path string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(obj) == 0 {
			continue
		}
		c.create(t, ns, obj)
	}
}

// waitFor polls fn every 50 ms until it returns nil or d passes.
func waitFor(t *testing.T, d time.Duration, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	var err error
	for time.Now().Before(deadline) {
		if err = fn(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s: %v", d, what, err)
}

// spaceServer starts a `space server` with the minimal template and
// returns it with a project API key.
func spaceServer(t *testing.T) (*testenv.Server, string) {
	t.Helper()
	srv, err := testenv.New("space-op-")
	if err != nil {
		t.Fatal(err)
	}
	srv.Args = []string{"--builtins", "minimal"}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	key, err := srv.CreateKey("k8s")
	if err != nil {
		srv.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- space server log (tail) ----\n%s", srv.LogTail(4000))
		}
		// Sandboxes outlive a server stop by design: delete them first.
		srv.DeleteSandboxes(key)
		srv.Stop()
		srv.Remove()
	})
	if err := srv.WaitTemplate(key, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return srv, key
}

// operatorProc is a running `space operator`.
type operatorProc struct {
	cmd     *exec.Cmd
	logPath string
}

// startOperator runs `space operator` as the operator's user.
// Its leader lease is short (4 s) so that a killed operator's successor
// takes over quickly; extra flags follow the defaults.
func startOperator(t *testing.T, c *cluster, srv *testenv.Server, key, logName string, extra ...string) *operatorProc {
	t.Helper()
	keyFile := filepath.Join(c.dir, "api-key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	argv := append([]string{srv.Bin, "operator", "--kubeconfig", c.opKubeconfig, "--url", srv.Ctrl,
		"--api-key-file", keyFile, "--resync", "5s", "--log-level", "debug",
		"--leader-election-namespace", "space", "--leader-lease-duration", "4s", "--leader-renew-period", "500ms"}, extra...)
	cmd := startProc(t, c.dir, logName, argv...)
	logPath := filepath.Join(c.dir, logName+".log")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- %s log (tail) ----\n%s", logName, logTail(logPath, 6000))
		}
	})
	p := &operatorProc{cmd: cmd, logPath: logPath}
	return p
}

// kill stops the operator the hard way, as a crash would.
func (p *operatorProc) kill() {
	p.cmd.Process.Kill()
	for i := 0; i < 500 && p.cmd.ProcessState == nil; i++ {
		time.Sleep(10 * time.Millisecond)
	}
}

// kubectlRun runs kubectl with the admin kubeconfig.
func (c *cluster) kubectlRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// get reads an object as a generic map.
func (c *cluster) getObj(r operator.Resource, ns, name string, out any) error {
	return c.admin.Get(context.Background(), r, ns, name, out)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
