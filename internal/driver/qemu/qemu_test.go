package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/space-sandbox/space/internal/netns/netnstest"
	"github.com/space-sandbox/space/internal/vmimage"
)

// Built once by TestMain when QEMU and a kernel are present.
var (
	agentBin string // CGO_ENABLED=0 build of ./cmd/space
	rootfs   string // busybox root filesystem
	skipWhy  string // why VM tests skip
)

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 && !netnstest.Inside() {
		// Re-run in a private network namespace: the network tests make
		// veths, nftables tables and fake upstreams there, never on the
		// host. It does not return.
		netnstest.Main(m)
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
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
	for _, a := range []string{"sh", "echo", "cat", "id", "hostname", "sleep", "dd", "ls", "mkdir", "grep", "true", "uname", "ps", "nc", "nslookup", "printf", "ip", "cut"} {
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
	if os.Geteuid() != 0 {
		t.Skip("qemu driver: needs root (cgroups for the VM's host budget)")
	}
}

// testOptions keeps the run dir short: unix socket paths are limited.
func testOptions(t testing.TB, dir string) Options {
	run, err := os.MkdirTemp("", "qv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	return Options{StateDir: filepath.Join(dir, "state"), RunDir: run, AgentPath: agentBin, Logf: t.Logf,
		CgroupBase: cgroupBase(dir)}
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
		d.cg.RemoveBase() // the test dir's own cgroup parents, empty by now
	})
	return d
}

// leftovers lists what sandbox id left on the host: its dir, its sockets,
// its QEMU process.
func leftovers(d *Driver, id string) []string {
	var left []string
	for _, p := range append([]string{d.sandboxDir(id), d.agentSock(id), d.qmpSock(id)}, d.cg.Paths(id).Dirs...) {
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
