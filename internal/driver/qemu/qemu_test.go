package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
	"github.com/space-sandbox/space/internal/vmimage"
)

// Built once by TestMain when QEMU and a kernel are present.
var (
	agentBin string // CGO_ENABLED=0 build of ./cmd/space
	rootfs   string // busybox root filesystem
	skipWhy  string // why VM tests skip
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		skipWhy = "qemu-system-x86_64 not installed (scripts/vm-deps.sh)"
		return m.Run()
	}
	if _, _, err := vmimage.FindKernel("/boot", "/lib/modules"); err != nil {
		skipWhy = err.Error()
		return m.Run()
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		skipWhy = "mkfs.ext4 not installed (e2fsprogs)"
		return m.Run()
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		skipWhy = "/bin/busybox not installed (busybox-static)"
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "qemudrv-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agentBin = filepath.Join(dir, "space")
	cmd := exec.Command("go", "build", "-o", agentBin, "../../../cmd/space")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
		return 1
	}
	rootfs = filepath.Join(dir, "rootfs")
	if err := buildRootfs(rootfs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func buildRootfs(dir string) error {
	for _, d := range []string{"bin", "etc", "root", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		return err
	}
	for _, a := range []string{"sh", "echo", "cat", "id", "hostname", "sleep", "dd", "ls", "mkdir", "grep", "true", "uname", "ps"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
}

func requireVM(t testing.TB) {
	t.Helper()
	if skipWhy != "" {
		t.Skip("qemu driver: " + skipWhy)
	}
}

// testOptions keeps the run dir short: unix socket paths are limited.
func testOptions(t testing.TB, dir string) Options {
	run, err := os.MkdirTemp("", "qv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	return Options{StateDir: filepath.Join(dir, "state"), RunDir: run, AgentPath: agentBin, Logf: t.Logf}
}

func newDriver(t testing.TB, o Options) *Driver {
	t.Helper()
	d, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Sweep(context.Background(), nil); err != nil {
			t.Errorf("final sweep: %v", err)
		}
	})
	return d
}

// leftovers lists what sandbox id left on the host: its dir, its sockets,
// its QEMU process.
func leftovers(d *Driver, id string) []string {
	var left []string
	for _, p := range []string{d.sandboxDir(id), d.agentSock(id), d.qmpSock(id)} {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	// By the agent socket path, which is unique to this driver's RunDir
	// (tests in other packages or processes may run VMs with the same id).
	out, _ := exec.Command("pgrep", "-f", "--", "path="+d.agentSock(id)+",").Output()
	if s := strings.TrimSpace(string(out)); s != "" {
		left = append(left, "qemu process "+s)
	}
	return left
}

func TestCreateExecDestroy(t *testing.T) {
	requireVM(t)
	d := newDriver(t, testOptions(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	inst, err := d.Create(ctx, driver.Spec{ID: "vm-a", Hostname: "box-a", RootfsDir: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Destroy(context.Background()) })
	t.Logf("create (cold, builds images): %v, timing %+v, accel %s", time.Since(t0), inst.Timing(), d.Accel())
	if err := health(ctx, inst); err != nil {
		t.Fatalf("health: %v", err)
	}
	var execs []time.Duration
	for range 5 {
		t1 := time.Now()
		drivertest.MustSh(t, inst, "true")
		execs = append(execs, time.Since(t1))
	}
	t.Logf("exec round trips: %v", execs)
	if got := drivertest.MustSh(t, inst, "echo hello; id -u; hostname"); got != "hello\n0\nbox-a" {
		t.Errorf("exec output %q", got)
	}
	if _, exit, err := drivertest.Sh(ctx, inst, "exit 7"); err != nil || exit.Code != 7 {
		t.Errorf("exit 7: %+v %v", exit, err)
	}
	// Writes land in the sandbox's own disk, the template stays as it is.
	drivertest.MustSh(t, inst, "echo data > /root/f && echo y > /etc/extra")
	if got := drivertest.MustSh(t, inst, "cat /root/f"); got != "data" {
		t.Errorf("read back %q", got)
	}
	// Concurrent connections over the one port.
	errs := make(chan error, 4)
	for n := range 4 {
		go func() {
			out, _, err := drivertest.Sh(ctx, inst, fmt.Sprintf("echo c%d", n))
			if err == nil && strings.TrimSpace(out) != fmt.Sprintf("c%d", n) {
				err = fmt.Errorf("conn %d: %q", n, out)
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	// A large output crosses the mux's flow-control window many times.
	out, _, err := drivertest.Sh(ctx, inst, "dd if=/dev/zero bs=1024 count=2048 2>/dev/null | busybox od -An -v | busybox wc -c")
	if err != nil || strings.TrimSpace(out) == "" {
		t.Errorf("bulk output: %q %v", out, err)
	}
	// Pause and resume through QMP.
	if err := inst.(driver.Pauser).Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := inst.(driver.Pauser).Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	drivertest.MustSh(t, inst, "sleep 1000 >/dev/null 2>&1 &")
	// The leftover check must see a running VM, or its silence below
	// means nothing.
	if left := strings.Join(leftovers(d, "vm-a"), " "); !strings.Contains(left, "qemu process") {
		t.Errorf("leftover check misses the running VM: %q", left)
	}
	t2 := time.Now()
	if err := inst.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	t.Logf("destroy: %v", time.Since(t2))
	if err := inst.Destroy(ctx); err != nil {
		t.Errorf("second destroy: %v", err)
	}
	if left := leftovers(d, "vm-a"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if c, err := inst.Dial(ctx); err == nil {
		c.Close()
		t.Error("dial after destroy succeeded")
	}
}
