package e2btest

import (
	"testing"
	"time"
)

// TestCodeInterpreter runs test/e2b/interp.test.mjs: the unmodified
// @e2b/code-interpreter SDK (2.8.0) against the code-interpreter-v1
// template (stateful Python and JavaScript contexts, rich results, env
// vars, timeouts that interrupt, private sandboxes).
func TestCodeInterpreter(t *testing.T) {
	e := need(t)
	if !e.interp {
		t.Skip("set SPACE_TEST_BASE=1 (and SPACE_TEMPLATE_CACHE): code-interpreter-v1 is a Debian template")
	}
	// A cold cache builds it after base: up to several minutes.
	if err := e.WaitTemplate(e.key, "code-interpreter-v1", 20*time.Minute); err != nil {
		t.Fatalf("code-interpreter-v1: %v", err)
	}
	runScript(t, e, "@e2b/code-interpreter", "interp.test.mjs", 5*time.Minute)
}
