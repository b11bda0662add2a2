package e2btest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/test/testenv"
)

// tlsDomain is the wildcard name of the test's certificate. ".test" is
// reserved (RFC 2606): no resolver answers it, the node script resolves
// it to loopback itself.
const tlsDomain = "space.test"

// TestSDKTLS runs tls.test.mjs with each pinned SDK version against a
// second server whose data listener serves HTTPS (--data-tls-cert and
// --data-tls-key) with a wildcard certificate for *.space.test signed by
// a CA this test makes, and --sandbox-domain space.test:<data port>.
func TestSDKTLS(t *testing.T) {
	e := need(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; install Node.js 20+ to run the E2B SDK tests")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed (the test opens a signed URL with it)")
	}
	dir := t.TempDir()
	ca, cert, keyFile := writeTestCerts(t, dir)
	work := t.TempDir()
	os.Chmod(work, 0o711)
	runDir, err := os.MkdirTemp("/tmp", "spt")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(runDir)
	// The sandbox domain carries the data port, so pick it first.
	ctrlAddr, dataAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	srv := &testenv.Server{Bin: e.Bin, Work: work, DataDir: filepath.Join(work, "data"), RunDir: runDir,
		TemplateDir: e.TemplateDir, LogPath: filepath.Join(work, "server.log"),
		Ctrl: "http://" + ctrlAddr, Data: "http://" + dataAddr,
		Args: []string{"--builtins", "minimal", "--data-tls-cert", cert, "--data-tls-key", keyFile,
			"--sandbox-domain", fmt.Sprintf("%s:%d", tlsDomain, portOf(t, dataAddr))}}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var key string
	defer func() {
		srv.DeleteSandboxes(key)
		srv.Stop()
		if t.Failed() {
			t.Logf("TLS server log (tail):\n%s", srv.LogTail(8000))
		}
		srv.RemoveCgroupBase()
	}()
	if key, err = srv.CreateKey("p1"); err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitTemplate(key, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"e2b", "e2b-2.50"} {
		t.Run(pkg, func(t *testing.T) {
			sdkDir := filepath.Join(repoRoot(), "test", "e2b")
			if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", pkg, "package.json")); err != nil {
				t.Skipf("npm package %s is not installed; run scripts/e2b-deps.sh", pkg)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "tls.test.mjs")
			cmd.Dir = sdkDir
			for _, kv := range os.Environ() {
				// The SDK must find the sandboxes by their host names.
				if len(kv) < 16 || kv[:16] != "E2B_SANDBOX_URL=" {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, "E2B_API_URL="+srv.Ctrl, "E2B_API_KEY="+key, "SPACE_E2B_PKG="+pkg,
				"SPACE_E2B_TEMPLATE=minimal", "NODE_EXTRA_CA_CERTS="+ca, "SPACE_TLS_DOMAIN="+tlsDomain)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("node --test tls.test.mjs (%s): %v\n%s", pkg, err, out)
			}
			t.Logf("%s", out)
		})
	}
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	fmt.Sscan(p, &n)
	return n
}

// writeTestCerts makes a CA and a certificate for *.space.test (and
// space.test) signed by it with the CA code of `space certs`, and writes
// ca.pem, cert.pem and key.pem into dir.
func writeTestCerts(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	now := time.Now()
	caPEM, caKey, err := cluster.NewCA("space test CA", 24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := cluster.IssueCert(caPEM, caKey,
		cluster.CertRequest{Role: cluster.RoleNode, Name: tlsDomain, Hosts: []string{"*." + tlsDomain}, Validity: 24 * time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for f, b := range map[string][]byte{ca: caPEM, cert: certPEM, key: keyPEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return ca, cert, key
}
