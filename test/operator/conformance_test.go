package operator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/operator"
	"github.com/space-sandbox/space/pkg/client"
)

// conformancePython is an interpreter that can import agent-sandbox's
// Python client's dependencies (pydantic 2, kubernetes, requests,
// prometheus_client), or "" with the reason.
func conformancePython(script string) (string, string) {
	var why []string
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		out, err := exec.Command(path, script, "probe").CombinedOutput()
		if err == nil {
			return path, ""
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		why = append(why, path+": "+lines[len(lines)-1])
	}
	return "", strings.Join(why, "; ")
}

// TestAgentSandboxClient runs kubernetes-sigs/agent-sandbox's own Python
// client (testdata/agent-sandbox, unmodified, commit 2fd412d5) and the
// test functions of its test_client.py that need no pod inside the
// sandbox against SPACE's operator, then applies its example
// SandboxTemplate and SandboxWarmPool as they are. docs/kubernetes-api.md
// ("Conformance") lists what differs.
func TestAgentSandboxClient(t *testing.T) {
	script, err := filepath.Abs("testdata/conformance.py")
	if err != nil {
		t.Fatal(err)
	}
	py, why := conformancePython(script)
	if py == "" {
		t.Skipf("no python3 with pydantic 2, kubernetes, requests and prometheus_client (scripts/deps.sh --test installs python3-kubernetes and python3-prometheus-client): %s", why)
	}
	c := startCluster(t)
	if c.kubectl == "" {
		t.Skip("kubectl is not built: run scripts/k8s.sh build")
	}
	srv, key := spaceServer(t)
	api := client.New(srv.Ctrl, key)
	startOperator(t, c, srv, key, "operator")
	c.create(t, "", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	c.create(t, ns, templateObj("busy"))
	c.create(t, ns, poolObj("pool", "busy", 2))

	pyRun := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, py, append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig, "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		t.Logf("conformance.py %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Fatalf("conformance.py %s: %v", args[0], err)
		}
		return string(out)
	}

	out := pyRun("create", "pool", ns)
	var res struct{ Claim, Sandbox string }
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "{") {
			if err := json.Unmarshal([]byte(line), &res); err != nil {
				t.Fatal(err)
			}
		}
	}
	if res.Sandbox == "" {
		t.Fatal("the client printed no sandbox")
	}
	// What the client's runtime connection does not reach, SPACE's data
	// plane does: a command through the claim's Secret.
	s := session(t, c, res.Sandbox)
	if got := run(t, s, "echo from $FROM_TEMPLATE"); got != "from yes" {
		t.Fatalf("command output %q", got)
	}
	pyRun("terminate", "pool", ns, res.Claim)
	waitFor(t, time.Minute, "SPACE sandbox of the terminated claim gone", func() error {
		ssb, err := api.GetSandbox(context.Background(), s.SandboxID)
		if err == nil && ssb.State != client.StateDeleted {
			return fmt.Errorf("SPACE sandbox %s", ssb.State)
		}
		return nil
	})

	// agent-sandbox's example template and warm pool, as its README
	// applies them (environment variables substituted): the schema takes
	// them; a claim's Sandbox is refused, since the template asks for a
	// persistent volume claim.
	dir := t.TempDir()
	env := map[string]string{"${SANDBOX_TEMPLATE_NAME}": "python-sandbox-template", "${SANDBOX_NAMESPACE}": ns,
		"${SANDBOX_WARMPOOL_NAME}": "python-sandbox-warmpool"}
	for _, f := range []string{"python-sandbox-template.yaml", "python-sandbox-warmpool.yaml"} {
		raw, err := os.ReadFile(filepath.Join("testdata/agent-sandbox", f))
		if err != nil {
			t.Fatal(err)
		}
		text := string(raw)
		for k, v := range env {
			text = strings.ReplaceAll(text, k, v)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := c.kubectlRun(t, "apply", "-f", filepath.Join(dir, f)); err != nil {
			t.Fatalf("kubectl apply %s: %v: %s", f, err, out)
		}
	}
	c.create(t, ns, claimObj("example", "python-sandbox-warmpool", nil))
	waitFor(t, time.Minute, "example claim refused", func() error {
		var cl operator.SandboxClaim
		if err := c.getObj(operator.ResClaim, ns, "example", &cl); err != nil {
			return err
		}
		ok, why := ready(cl.Status.Conditions, operator.CondReady)
		if ok || !strings.HasPrefix(why, "Unsupported: ") || !strings.Contains(why, "volumeClaimTemplates") {
			return fmt.Errorf("condition %q", why)
		}
		return nil
	})
}
