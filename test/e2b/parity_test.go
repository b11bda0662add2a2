package e2btest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// runSuite runs one node --test script of test/e2b with each pinned SDK
// version against e's server; env adds variables to the SDK's.
func runSuite(t *testing.T, e *env, script string, limit time.Duration, env ...string) {
	for _, pkg := range []string{"e2b", "e2b-2.50"} {
		t.Run(pkg, func(t *testing.T) { runScript(t, e, pkg, script, limit, env...) })
	}
}

// runScript runs script once with the npm package pkg (which it needs
// installed) as the SDK.
func runScript(t *testing.T, e *env, pkg, script string, limit time.Duration, env ...string) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; install Node.js 20+ to run the E2B SDK tests")
	}
	dir := filepath.Join(repoRoot(), "test", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
		t.Skipf("npm package %s is not installed; run scripts/e2b-deps.sh", pkg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", script)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "E2B_API_URL="+e.Ctrl, "E2B_SANDBOX_URL="+e.Data, "E2B_API_KEY="+e.key,
		"SPACE_E2B_PKG="+pkg, "SPACE_E2B_TEMPLATE="+e.template), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test %s (%s): %v\n%s", script, pkg, err, out)
	}
	t.Logf("%s", out)
}

// TestSDKParity runs test/e2b/parity.test.mjs (metrics, snapshots, fork,
// signed URLs) with each pinned SDK version.
func TestSDKParity(t *testing.T) {
	e := need(t)
	runSuite(t, e, "parity.test.mjs", 4*time.Minute, "SPACE_E2B_KEY2="+e.key2)
}
