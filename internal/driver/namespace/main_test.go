package namespace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/uidpool"
	"golang.org/x/sys/unix"
)

// Built once by TestMain when running as root.
var (
	initBin  string // sandboxinit + agent, standing in for `space agent --init`
	rootfs   string // busybox root filesystem owned by DefaultUIDBase
	setupErr error
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(nodeHelperEnv); spec != "" {
		os.Exit(nodeHelper(spec))
	}
	os.Exit(run(m))
}

// nodeHelperEnv makes the test binary act as a node process that creates
// one sandbox, reports it and then waits to be killed.
const nodeHelperEnv = "NSDRV_NODE_HELPER"

type nodeHelperSpec struct {
	StateDir, RunDir, AgentPath, CgroupBase string
	ID, Rootfs                              string
	Pool                                    bool
}

func nodeHelper(spec string) int {
	var (
		hs  nodeHelperSpec
		err error
	)
	if err := json.Unmarshal([]byte(spec), &hs); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	opts := Options{StateDir: hs.StateDir, RunDir: hs.RunDir, AgentPath: hs.AgentPath, CgroupBase: hs.CgroupBase}
	if hs.Pool {
		if opts.Pool, err = openTestPool(); err != nil {
			fmt.Println("ERR", err)
			return 1
		}
	}
	d, err := New(opts)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	inst, err := d.Create(context.Background(), driver.Spec{ID: hs.ID, RootfsDir: hs.Rootfs})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Println("READY", inst.(*Instance).PID())
	select {}
}

// sharedRootEnv makes the test binary a child that runs its tests in a
// mount namespace of its own whose root is shared, as on a systemd host
// (this one's is private); the value is the parent's initbin, rootfs and
// mount namespace, newline-separated.
const sharedRootEnv = "NSDRV_SHARED_ROOT"

func enterSharedRoot(v string) error {
	f := strings.Split(v, "\n")
	if len(f) != 3 {
		return fmt.Errorf("bad %s", sharedRootEnv)
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	if self == f[2] {
		return errors.New("refusing to make the host's root shared: not in a mount namespace of our own")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make / shared: %w", err)
	}
	initBin, rootfs = f[0], f[1]
	return nil
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		return m.Run()
	}
	if v := os.Getenv(sharedRootEnv); v != "" {
		setupErr = enterSharedRoot(v)
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "nsdrv-")
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
	initBin = filepath.Join(dir, "initbin")
	cmd := exec.Command("go", "build", "-o", initBin, "./testdata/initbin")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build initbin: %v\n%s", err, out)
	}
	rootfs = filepath.Join(dir, "rootfs")
	return buildRootfs(rootfs, DefaultUIDBase)
}

// buildRootfs makes a minimal busybox root filesystem owned by uid. It has
// no /proc, /dev or /sys: init must create them in the upper layer.
func buildRootfs(dir string, uid int) error {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox-static is needed: %w", err)
	}
	for _, d := range []string{"bin", "etc", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
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

func requireSandbox(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the namespace driver needs root")
	}
	if setupErr != nil {
		t.Fatalf("test setup: %v", setupErr)
	}
}

// testOptions returns options over fresh dirs; the cgroup base is unique to
// the test so a concurrent node or test never sees (or sweeps) our groups.
// Sandboxes get their own uid blocks from the host-wide registry, shared
// with every node and test run on this host, so none of them can be
// handed a block of ours.
func testOptions(t testing.TB) Options {
	t.Helper()
	base := t.TempDir()
	pool, err := openTestPool()
	if err != nil {
		t.Fatal(err)
	}
	return Options{
		StateDir:   filepath.Join(base, "state"),
		RunDir:     filepath.Join(base, "run"),
		AgentPath:  initBin,
		CgroupBase: fmt.Sprintf("space-test-%d", os.Getpid()),
		Pool:       pool,
		Logf:       t.Logf,
		// The package's checkpoint tests skip where CRIU is missing.
		Checkpoints: true,
	}
}

func openTestPool() (*uidpool.Pool, error) {
	return uidpool.Open(uidpool.DefaultDir, uidpool.DefaultStart, uidpool.DefaultCount)
}

func newDriver(t testing.TB, opts Options) *Driver {
	t.Helper()
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Sweep(ctx, nil); err != nil {
			t.Errorf("final sweep: %v", err)
		}
		d.cg.RemoveBase()
	})
	return d
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func create(t testing.TB, d *Driver, id string, l driver.Limits) *Instance {
	t.Helper()
	inst, err := d.Create(testCtx(t), driver.Spec{ID: id, Hostname: "box-" + id, RootfsDir: rootfs, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	return inst.(*Instance)
}

// sh runs a shell script in the sandbox through the agent and returns its
// combined output and exit.
func sh(t testing.TB, inst driver.Instance, script string) (string, agent.Exit) {
	t.Helper()
	ctx := testCtx(t)
	c := client.New(inst.Dial)
	defer c.Close()
	info, err := c.Start(ctx, agent.ProcessSpec{Shell: script})
	if err != nil {
		t.Fatalf("start %q: %v", script, err)
	}
	r, err := c.Events(ctx, info.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out bytes.Buffer
	for {
		ev, err := r.Next()
		if err == io.EOF {
			t.Fatal("no exit event")
		}
		if err != nil {
			t.Fatalf("events of %q: %v", script, err)
		}
		if ev.Type == agent.EventExit {
			exit, err := client.ExitStatus(ev)
			if err != nil {
				t.Fatal(err)
			}
			return out.String(), exit
		}
		out.Write(ev.Data)
	}
}

// mustSh runs script and fails the test unless it exits 0.
func mustSh(t testing.TB, inst driver.Instance, script string) string {
	t.Helper()
	out, exit := sh(t, inst, script)
	if exit.Code != 0 {
		t.Fatalf("%q: exit %+v\n%s", script, exit, out)
	}
	return strings.TrimSpace(out)
}
