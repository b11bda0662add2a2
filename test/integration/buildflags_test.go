package integration

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/test/testenv"
)

// TestCgoAgentRefused: a server whose space-agent was built with cgo (a
// plain `go build` on most machines) must not run unhardened sandboxes:
// the agent refuses to serve, and creating a sandbox fails with an error
// that says why and what to do.
func TestCgoAgentRefused(t *testing.T) {
	need(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc: cannot build the agent with cgo")
	}
	srv, err := testenv.New("space-itcgo-")
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(srv.Work, "space-agent"), "./cmd/space-agent")
	build.Dir = testenv.RepoRoot()
	build.Env = append(build.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("cgo build: %v\n%s", err, out)
	}
	srv.Driver = "namespace"
	srv.Args = []string{"--builtins", "minimal"}
	e := &env{Server: srv, baseline: map[string]bool{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- server log (tail) ----\n%s", srv.LogTail(4000))
		}
		srv.Stop()
		srv.Remove()
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if e.key, err = srv.CreateKey("p1"); err != nil {
		t.Fatal(err)
	}
	st, m, err := e.call("POST", "/v1/sandboxes", e.key, map[string]any{"template": "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if st == 202 {
		done := e.waitOp(t, m["operation"].(map[string]any)["id"].(string))
		if done["state"] == "succeeded" {
			t.Fatalf("a sandbox started with a cgo-built agent: %v", done)
		}
		got = fmt.Sprint(done)
	} else {
		got = fmt.Sprint(st, m)
	}
	t.Logf("create with a cgo-built agent: %s", got)
	if !strings.Contains(got, "CGO_ENABLED=0") {
		t.Errorf("the error does not say why: %s", got)
	}
}
