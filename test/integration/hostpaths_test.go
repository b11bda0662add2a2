package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// hostInfoScript prints what a sandbox can read about its mounts and its
// PID 1 (the agent): the mount table, both mountinfo views, PID 1's maps
// and command line, and the shell's own maps.
const hostInfoScript = `echo "== mount"; mount
echo "== /proc/self/mountinfo"; cat /proc/self/mountinfo
echo "== /proc/1/mountinfo"; cat /proc/1/mountinfo
echo "== /proc/1/maps"; cat /proc/1/maps 2>&1
echo "== /proc/self/maps"; cat /proc/self/maps
echo "== /proc/1/cmdline"; tr '\0' ' ' < /proc/1/cmdline; echo
echo "== /proc/1/exe"; readlink /proc/1/exe 2>&1; true`

// hostNeedles are strings that name the host's layout, which nothing
// inside a sandbox may show: the server's data, run and template dirs, its
// binaries (the agent's host copy included), the repository, and the usual
// places of a SPACE install.
func hostNeedles(e *env) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range []string{e.DataDir, filepath.Join(e.DataDir, "bin"), e.Work, e.Bin, e.RunDir, e.TemplateDir,
		repoRoot(), "/var/lib/space", "/var/cache/space", "/var/tmp/space", "/tmp/space-", "/run/space"} {
		if n = filepath.Clean(n); n != "." && n != "/" && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

func assertNoHostPaths(t *testing.T, what, out string, needles []string) {
	t.Helper()
	for _, n := range needles {
		if strings.Contains(out, n) {
			t.Errorf("%s shows the host path %s:\n%s", what, n, out)
		}
	}
}

// TestNoHostPathsInside: `mount`, /proc/self/mountinfo and /proc/1/maps
// inside a namespace sandbox name no host path (issue 13): the overlay is
// mounted with options relative to init's working directory, PID 1's
// command line carries only those relative names, and the agent runs from
// a memfd.
func TestNoHostPathsInside(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	needles := hostNeedles(e)
	checkHostInfo(t, sb, "overlay on / type overlay", needles)
	// The agent is not dumpable, so /proc/1/maps and /proc/1/exe are
	// closed to the sandbox; what they would show is what the host sees.
	pid := namespacePID(t, e, instanceOf(t, e, sb.ID))
	maps, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(exe, "/memfd:") {
		t.Errorf("PID 1 runs %q, want the agent's memfd", exe)
	}
	assertNoHostPaths(t, "PID 1's maps and exe (host view)", exe+"\n"+string(maps), needles)
}

// namespacePID is the host pid of a namespace sandbox's PID 1.
func namespacePID(t *testing.T, e *env, inst string) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.DataDir, "sandboxes", inst, "state.json"))
	if err != nil {
		t.Fatalf("namespace state of %s: %v", inst, err)
	}
	var st struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || st.PID <= 0 {
		t.Fatalf("state.json %s: %v", raw, err)
	}
	return st.PID
}

// TestNoHostPathsInsideGvisor: the same under gVisor, whose Sentry shows
// its own mount table (gofer mounts named by their sandbox paths) and maps
// (the agent bind-mounted at /.space/agent).
func TestNoHostPathsInsideGvisor(t *testing.T) {
	e := gvisorEnv(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	checkHostInfo(t, sb, " on / type ", hostNeedles(e))
}

// checkHostInfo runs hostInfoScript in sb as root and as the unprivileged
// user and fails on any needle in what it prints; rootMount is a piece of
// the root's line in `mount`, to know the table was read.
func checkHostInfo(t *testing.T, sb *sandbox, rootMount string, needles []string) {
	t.Helper()
	for _, user := range []string{"root", "user"} {
		out, errs, ex := sb.run(t, map[string]any{"shell": hostInfoScript, "user": user})
		if ex.Code != 0 {
			t.Fatalf("as %s: %+v\n%s%s", user, ex, out, errs)
		}
		if !strings.Contains(out, rootMount) || !strings.Contains(out, " / / ") {
			t.Fatalf("as %s: no mount table in the output:\n%s", user, out)
		}
		assertNoHostPaths(t, "inside, as "+user, out+errs, needles)
		t.Logf("as %s:\n%s%s", user, out, errs)
	}
}
