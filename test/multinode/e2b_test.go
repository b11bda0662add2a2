package multinode

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// TestE2BAnyNode runs the unmodified e2b npm SDK (2.51.0,
// test/e2b/anynode.test.mjs) against a sandbox of a fleet through the data
// listener of the other node, which forwards its envd calls and its
// forwarded port over the node link: commands (with streamed output),
// files, and a private port by E2B's headers (with the session token; not
// without).
func TestE2BAnyNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; install Node.js 20+ to run the E2B SDK tests")
	}
	dir := filepath.Join(testenv.RepoRoot(), "test", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		t.Skip("npm package e2b is not installed; run scripts/e2b-deps.sh")
	}
	c, srv, _ := twoNodes(t, "space-mne2b")
	m := c.mustCall(srv, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 64 << 20}})
	if done := c.waitOp(srv, opID(m), 60*time.Second); done["state"] != "succeeded" {
		t.Fatalf("create: %v", done)
	}
	sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
	id, on := sb["id"].(string), sb["node"].(string)
	var via string
	for _, p := range c.nodes {
		if p.name != on {
			via = p.addr["data"]
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "anynode.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+srv.addr["control"], "E2B_SANDBOX_URL="+via, "E2B_API_KEY="+c.key,
		"SPACE_E2B_PKG=e2b", "SPACE_SBX_ID="+id, "SPACE_SBX_TOKEN="+sess["token"].(string))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("e2b SDK against %s (on %s) through %s: %v\n%s", id, on, via, err, out)
	}
	t.Logf("sandbox %s on %s, SDK through %s:\n%s", id, on, via, out)
	if done := c.waitOp(srv, opID(c.mustCall(srv, "DELETE", "/v1/sandboxes/"+id, nil)), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("delete: %v", done)
	}
}
