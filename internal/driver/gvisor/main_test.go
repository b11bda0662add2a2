package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/uidpool"
)

// Built once by TestMain when running as root with runsc available.
var (
	agentBin  string // stands in for `space agent --listen`
	rootfs    string // busybox root filesystem owned by DefaultUIDBase
	runscPath string
	skipWhy   string // non-empty: why the sandbox tests skip
	setupErr  error
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	switch p, err := FindRunsc(os.Getenv("SPACE_RUNSC")); {
	case os.Geteuid() != 0:
		skipWhy = "the gvisor driver needs root"
	case err != nil:
		skipWhy = fmt.Sprintf("runsc not found (build it with scripts/runsc.sh or set SPACE_RUNSC): %v", err)
	default:
		runscPath = p
	}
	if skipWhy != "" {
		return m.Run()
	}
	// Short: runsc's sockets live under RunDir.
	dir, err := os.MkdirTemp("", "gv-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	setupErr = prepare(dir)
	return m.Run()
}

func prepare(dir string) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	agentBin = filepath.Join(dir, "agentbin")
	cmd := exec.Command("go", "build", "-o", agentBin, "./testdata/agentbin")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build agentbin: %v\n%s", err, out)
	}
	rootfs = filepath.Join(dir, "rootfs")
	return buildRootfs(rootfs, DefaultUIDBase)
}

// buildRootfs makes a minimal busybox root filesystem owned by uid.
func buildRootfs(dir string, uid int) error {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox-static is needed: %w", err)
	}
	for _, d := range []string{"bin", "etc", "root", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), data, 0o755); err != nil {
		return err
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(string(list)) {
		if name == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", name)); err != nil {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
		"etc/group":  "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}

func requireRunsc(t testing.TB) {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	if setupErr != nil {
		t.Fatalf("test setup: %v", setupErr)
	}
}

// testOptions returns options over dir; the cgroup base is unique to the
// test process so a running node or another test never sees our groups.
// Sandboxes get their own uid blocks from the host-wide registry shared
// with every node and test run on this host.
func testOptions(t testing.TB, dir string) Options {
	t.Helper()
	pool, err := uidpool.Open(uidpool.DefaultDir, uidpool.DefaultStart, uidpool.DefaultCount)
	if err != nil {
		t.Fatal(err)
	}
	return Options{
		Pool:       pool,
		Runsc:      runscPath,
		StateDir:   filepath.Join(dir, "state"),
		RunDir:     filepath.Join(dir, "run"),
		AgentPath:  agentBin,
		CgroupBase: fmt.Sprintf("space-gvtest-%d", os.Getpid()),
		Debug:      os.Getenv("SPACE_RUNSC_DEBUG") != "",
		Logf:       t.Logf,
	}
}

// shortDir is a short temp dir (runsc's socket paths must fit sun_path).
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gvt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func newDriver(t testing.TB, opts Options) *Driver {
	t.Helper()
	d, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := d.Sweep(ctx, nil); err != nil {
			t.Errorf("final sweep: %v", err)
		}
		d.cg.RemoveBase()
		removeOtherCgroupDirs("", opts.CgroupBase)
	})
	return d
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func create(t testing.TB, d *Driver, id string, l driver.Limits) *Instance {
	t.Helper()
	inst, err := d.Create(testCtx(t), driver.Spec{ID: id, Hostname: "box-" + id, RootfsDir: rootfs, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Destroy(context.Background()) })
	return inst.(*Instance)
}

// leftovers lists what is left on the host of sandbox id.
func leftovers(d *Driver, id string) []string {
	var left []string
	paths := append([]string{d.sandboxDir(id), d.sockDir(id)}, d.cg.Paths(id).Dirs...)
	for _, name := range []string{"runsc-" + id + ".sock", id + "_sandbox:" + id + ".state", id + "_sandbox:" + id + ".lock"} {
		paths = append(paths, filepath.Join(d.r.root, name))
	}
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	if m, _ := mountsUnder(d.sandboxDir(id)); len(m) > 0 {
		left = append(left, "mounts "+strings.Join(m, ","))
	}
	if m, _ := mountsUnder(d.r.root); len(m) > 0 {
		left = append(left, "mounts "+strings.Join(m, ","))
	}
	if _, err := d.r.state(context.Background(), id); err == nil {
		left = append(left, "runsc still knows "+id)
	}
	left = append(left, diskquota.LoopsBacking(d.sandboxDir(id))...)
	return left
}
