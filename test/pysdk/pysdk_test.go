// Package pysdk runs the Python SDK's own unittest suite (sdk/python/tests)
// against a real `space server`, and checks that the SDK installs with pip
// offline. It needs root (namespaces) and python3 ≥ 3.9; it skips otherwise.
package pysdk

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

func python(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not on PATH: skipping the Python SDK suite")
	}
	out, err := exec.Command(py, "-c", "import sys; print(sys.version_info >= (3, 9))").Output()
	if err != nil || strings.TrimSpace(string(out)) != "True" {
		t.Skipf("python3 ≥ 3.9 needed (%s): skipping the Python SDK suite", strings.TrimSpace(string(out)))
	}
	return py
}

func sdkDir() string { return filepath.Join(testenv.RepoRoot(), "sdk", "python") }

// pyEnv is the environment of every python3 run: no bytecode written into
// the repository, the SDK importable without installing it.
func pyEnv(extra ...string) []string {
	return append(os.Environ(), append([]string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH=" + sdkDir(),
		"PYTHONUNBUFFERED=1"}, extra...)...)
}

// TestOffline runs the suite without a server: the unit tests run, the
// integration tests skip. Needs neither root nor a server.
func TestOffline(t *testing.T) {
	py := python(t)
	cmd := exec.Command(py, "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-v")
	cmd.Dir = sdkDir()
	cmd.Env = append(pyEnv(), "SPACE_URL=", "SPACE_API_KEY=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("unittest (offline): %v\n%s", err, out)
	}
}

// TestPipInstallOffline installs the SDK with pip from the repository path
// with no package index at all: the in-tree build backend needs nothing.
func TestPipInstallOffline(t *testing.T) {
	py := python(t)
	if exec.Command(py, "-m", "pip", "--version").Run() != nil {
		t.Skip("pip not available for python3")
	}
	target := t.TempDir()
	cmd := exec.Command(py, "-m", "pip", "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check",
		"--target", target, sdkDir())
	cmd.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install --no-index %s: %v\n%s", sdkDir(), err, out)
	}
	chk := exec.Command(py, "-c", "import space_sandbox, sys; print(space_sandbox.__file__); sys.exit(0 if space_sandbox.__file__.startswith(sys.argv[1]) else 1)", target)
	chk.Env = append(os.Environ(), "PYTHONPATH="+target, "PYTHONDONTWRITEBYTECODE=1")
	chk.Dir = target
	if out, err := chk.CombinedOutput(); err != nil {
		t.Fatalf("import the installed SDK: %v\n%s", err, out)
	}
	// pip builds in a temporary copy; nothing may be left in the repository.
	for _, p := range []string{"build", "space_sandbox.egg-info", "dist"} {
		if _, err := os.Stat(filepath.Join(sdkDir(), p)); err == nil {
			t.Errorf("pip left %s in %s", p, sdkDir())
		}
	}
}

// TestAgainstServer starts a real server and runs the whole suite against it.
func TestAgainstServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, cgroups, overlayfs) to run a real server")
	}
	py := python(t)
	srv, err := testenv.New("space-pysdk-")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Remove()
	defer srv.RemoveCgroupBase()                 // runs after Stop: the groups are empty once the sandboxes are gone
	srv.Args = []string{"--builtins", "minimal"} // the driver: testenv's (SPACE_TEST_DRIVER, default namespace)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	key, err := srv.CreateKey("pysdk")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitTemplate(key, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-v")
	cmd.Dir = sdkDir()
	cmd.Env = pyEnv("SPACE_URL="+srv.Ctrl, "SPACE_API_KEY="+key, "SPACE_TEST_TEMPLATE=minimal")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatalf("Python SDK suite failed: %v\n---- server log (tail) ----\n%s", err, srv.LogTail(20000))
	}
	if s := string(out); !strings.Contains(s, "test_dropped_stream_resumes_without_loss") ||
		strings.Contains(s, "skipped 'set SPACE_URL") {
		t.Fatalf("the integration tests did not run")
	}
	// The suite deletes what it creates.
	st, m, err := testenv.DoJSON("GET", srv.Ctrl+"/v1/sandboxes", map[string]string{"X-API-Key": key}, nil)
	if err != nil || st != 200 {
		t.Fatalf("list sandboxes: %d %v %v", st, m, err)
	}
	if left, _ := m["sandboxes"].([]any); len(left) != 0 {
		t.Errorf("sandboxes left behind: %s", fmt.Sprint(left))
	}
}
