package e2btest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// TestCodeInterpreter runs test/e2b/interp.test.mjs: the unmodified
// @e2b/code-interpreter SDK (2.8.0) against the code-interpreter-v1
// template (stateful Python and JavaScript contexts, rich results, env
// vars, timeouts that interrupt, private sandboxes).
func TestCodeInterpreter(t *testing.T) {
	e := needInterp(t)
	runScript(t, e, "@e2b/code-interpreter", "interp.test.mjs", 5*time.Minute)
}

// needInterp is the server once code-interpreter-v1 holds this checkout's
// interpreter server; it skips where the suite does not build the template.
func needInterp(t *testing.T) *env {
	t.Helper()
	e := need(t)
	if !e.interp {
		t.Skip("set SPACE_TEST_BASE=1 (and SPACE_TEMPLATE_CACHE): code-interpreter-v1 is a Debian template")
	}
	// A cold cache builds it after base: up to several minutes.
	if err := e.WaitTemplate(e.key, "code-interpreter-v1", 20*time.Minute); err != nil {
		t.Fatalf("code-interpreter-v1: %v", err)
	}
	waitCurrentInterpreter(t, e, 20*time.Minute)
	return e
}

// waitCurrentInterpreter waits until code-interpreter-v1 holds this
// checkout's interpreter server: a cached tree of an older server keeps
// the name (and is what creates get) until the rebuild the server started
// has finished.
func waitCurrentInterpreter(t *testing.T, e *env, d time.Duration) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join(repoRoot(), "internal", "template", "interp", "server.py"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(d)
	for {
		st, m, err := testenv.DoJSON("GET", e.Ctrl+"/v1/templates/code-interpreter-v1", map[string]string{"X-API-Key": e.key}, nil)
		digest, _ := m["digest"].(string)
		if err != nil || st != 200 || !strings.HasPrefix(digest, "sha256:") {
			t.Fatalf("template info: %d %v %v", st, m, err)
		}
		got, err := os.ReadFile(filepath.Join(e.TemplateDir, "rootfs", strings.TrimPrefix(digest, "sha256:"), "opt", "space", "interpreter", "server.py"))
		if err == nil && bytes.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("code-interpreter-v1 (%s) still has another server.py after %s (%v)", digest, d, err)
		}
		time.Sleep(time.Second)
	}
}
