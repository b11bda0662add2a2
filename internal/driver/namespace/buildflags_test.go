package namespace

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
	"golang.org/x/sys/unix"
)

// TestAgentBuildFlags builds the real space-agent both ways and starts a
// sandbox with each. Built with CGO_ENABLED=0 (the documented way) its
// commands lack CAP_SYS_PTRACE, CAP_NET_RAW and CAP_NET_ADMIN; built with
// cgo the agent cannot drop them from every thread, so it must refuse to
// serve and Create must say why, rather than run an unhardened sandbox.
func TestAgentBuildFlags(t *testing.T) {
	requireSandbox(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc: cannot build the agent with cgo")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, cgo := range []string{"0", "1"} {
		t.Run("CGO_ENABLED="+cgo, func(t *testing.T) {
			bin := filepath.Join(dir, "space-agent-cgo"+cgo)
			build := exec.Command("go", "build", "-o", bin, "./cmd/space-agent")
			build.Dir = "../../.."
			build.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			opts := testOptions(t)
			opts.AgentPath = bin
			d := newDriver(t, opts)
			id := "bf" + cgo
			inst, err := d.Create(testCtx(t), driver.Spec{ID: id, RootfsDir: rootfs})
			if cgo == "1" {
				if err == nil {
					inst.Destroy(testCtx(t))
					t.Fatal("a cgo-built agent served: want Create to fail")
				}
				if !strings.Contains(err.Error(), "CGO_ENABLED=0") {
					t.Fatalf("Create with a cgo-built agent: %v; want an error that names the build flag", err)
				}
				t.Logf("cgo build refused: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer inst.Destroy(testCtx(t))
			out, x := sh(t, inst, "grep -E '^Cap(Bnd|Eff):' /proc/self/status")
			if x.Code != 0 {
				t.Fatalf("%+v %q", x, out)
			}
			dropped := uint64(1<<unix.CAP_SYS_PTRACE | 1<<unix.CAP_NET_RAW | 1<<unix.CAP_NET_ADMIN)
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(line)
				v, err := strconv.ParseUint(f[len(f)-1], 16, 64)
				if err != nil || v&dropped != 0 {
					t.Errorf("command (root) %s: %#x includes dropped capabilities (%v)", f[0], v&dropped, err)
				}
			}
		})
	}
}
