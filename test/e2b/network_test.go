package e2btest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// TestSDKNetwork runs network.test.mjs (E2B's allowInternetAccess,
// network.allowOut/denyOut and updateNetwork, checked against the policy
// SPACE stores) with each pinned SDK version: against the suite's server,
// which has no --egress, and against a second server with --egress and
// --e2b-network open (E2B's default network) that runs, with the node
// processes, in a network namespace this test makes (its nftables table
// and veths stay there).
func TestSDKNetwork(t *testing.T) {
	e := need(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; install Node.js 20+ to run the E2B SDK tests")
	}
	dir := filepath.Join(repoRoot(), "test", "e2b")
	pkgs := []string{"e2b", "e2b-2.50"}
	run := func(t *testing.T, wrap []string, ctrl, data, key, tpl string, egress bool) {
		for _, pkg := range pkgs {
			t.Run(pkg, func(t *testing.T) {
				if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
					t.Skipf("npm package %s is not installed; run scripts/e2b-deps.sh", pkg)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				argv := append(append([]string(nil), wrap...), node, "--test", "--test-reporter=spec", "network.test.mjs")
				cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
				cmd.Dir = dir
				eg := "0"
				if egress {
					eg = "1"
				}
				cmd.Env = append(os.Environ(), "E2B_API_URL="+ctrl, "E2B_SANDBOX_URL="+data, "E2B_API_KEY="+key,
					"SPACE_E2B_PKG="+pkg, "SPACE_E2B_TEMPLATE="+tpl, "SPACE_E2B_EGRESS="+eg)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("node --test network.test.mjs (%s): %v\n%s", pkg, err, out)
				}
				t.Logf("%s", out)
			})
		}
	}
	t.Run("without-egress", func(t *testing.T) { run(t, nil, e.Ctrl, e.Data, e.key, e.template, false) })

	t.Run("with-egress", func(t *testing.T) {
		nsenter, err1 := exec.LookPath("nsenter")
		ip, err2 := exec.LookPath("ip")
		if err1 != nil || err2 != nil {
			t.Skip("needs nsenter and ip (util-linux, iproute2) to run a server with --egress in a network namespace of its own")
		}
		ns := fmt.Sprintf("space-e2b-%d", os.Getpid())
		if out, err := exec.Command(ip, "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add: %v %s", err, out)
		}
		defer exec.Command(ip, "netns", "del", ns).Run()
		if out, err := exec.Command(ip, "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
			t.Fatalf("lo up: %v %s", err, out)
		}
		wrap := []string{nsenter, "--net=/run/netns/" + ns, "--"}
		work := t.TempDir()
		os.Chmod(work, 0o711)
		runDir, err := os.MkdirTemp("/tmp", "spn")
		if err != nil {
			t.Fatal(err)
		}
		srv := &testenv.Server{Bin: e.Bin, Work: work, DataDir: filepath.Join(work, "data"), RunDir: runDir,
			TemplateDir: e.TemplateDir, LogPath: filepath.Join(work, "server.log"), Wrap: wrap,
			Args: []string{"--builtins", "minimal", "--egress", "--egress-dns", "192.0.2.53", "--e2b-network", "open"}}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		key, err := srv.CreateKey("p1")
		if err != nil {
			srv.Stop()
			t.Fatal(err)
		}
		defer func() {
			// A failed run may leave sandboxes: they would outlive the server.
			js := `const h={'X-API-Key':process.env.K};const r=await fetch(process.env.U+'/v1/sandboxes?state=creating,running&limit=1000',{headers:h});` +
				`for(const s of (await r.json()).sandboxes||[]) await fetch(process.env.U+'/sandboxes/'+s.id,{method:'DELETE',headers:h})`
			c := exec.Command(wrap[0], append(wrap[1:], node, "--input-type=module", "-e", js)...)
			c.Env = append(os.Environ(), "U="+srv.Ctrl, "K="+key)
			if out, err := c.CombinedOutput(); err != nil {
				t.Logf("cleanup: %v %s", err, out)
			}
			srv.Stop()
			if t.Failed() {
				t.Logf("egress server log (tail):\n%s", srv.LogTail(8000))
			}
			srv.RemoveCgroupBase()
			os.RemoveAll(runDir)
		}()
		run(t, wrap, srv.Ctrl, srv.Data, key, "minimal", true)
	})
}
