package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentpids"
)

func TestFindRunsc(t *testing.T) {
	if _, err := FindRunsc("/nonexistent/runsc"); err == nil {
		t.Error("FindRunsc of a missing path succeeded")
	}
}

func TestIsolation(t *testing.T) {
	requireRunsc(t)
	d := newDriver(t, testOptions(t, shortDir(t)))
	inst := create(t, d, "iso", driver.Limits{MemoryBytes: 256 << 20})
	// gVisor's kernel, not the host's; ids mapped like the namespace driver.
	out := drivertest.MustSh(t, inst, "dmesg 2>/dev/null | head -1; id -u; echo x > /root/f; stat -c %u /bin/busybox; grep MemTotal /proc/meminfo; cat /proc/self/status | grep CapEff")
	if !strings.Contains(out, "gVisor") && !strings.Contains(out, "Starting") {
		t.Logf("dmesg: %s", out)
	}
	if !strings.Contains(out, "\n0\n0\n") {
		t.Errorf("uid / file owner inside: %q", out)
	}
	if !strings.Contains(out, "262144 kB") {
		t.Errorf("sentry memory not sized to the limit: %q", out)
	}
	layer, err := inst.WritableLayer()
	if err != nil {
		t.Fatal(err)
	}
	// The host's overlay is volatile: a delete does not sync the host's
	// filesystem.
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[2] == "overlay" && strings.Contains(f[3], "upperdir="+layer.Dir+",") {
			found = true
			if !strings.Contains(","+f[3]+",", ",volatile,") && !strings.Contains(f[3], ",fsync=volatile") {
				t.Errorf("sandbox overlay not volatile: %s", line)
			}
		}
	}
	if !found {
		t.Errorf("no overlay with upperdir %s in the host's mounts", layer.Dir)
	}
	var st os.FileInfo
	if st, err = os.Lstat(filepath.Join(layer.Dir, "root/f")); err != nil {
		t.Fatal(err)
	}
	if uid := fileUID(st); uid != layer.UIDBase || !d.opts.Pool.Contains(uid) {
		t.Errorf("file written by sandbox root has host uid %d, want its pool block %d", uid, layer.UIDBase)
	}
	// A symlink planted where the host dials must not be followed.
	drivertest.MustSh(t, inst, "ln -s /proc/self/fd/0 /.space/run/evil; ls /.space/run")
	if _, err := dialSocket(testCtx(t), filepath.Join(d.sockDir("iso"), "evil")); err == nil {
		t.Error("dialSocket followed a symlink")
	}
	// No network but loopback.
	if out := drivertest.MustSh(t, inst, "ls /sys/class/net 2>/dev/null || cat /proc/net/dev"); strings.Contains(out, "eth") {
		t.Errorf("network interfaces: %q", out)
	}
}

func TestPauseResume(t *testing.T) {
	requireRunsc(t)
	d := newDriver(t, testOptions(t, shortDir(t)))
	inst := create(t, d, "pz", driver.Limits{})
	ctx := testCtx(t)
	t0 := time.Now()
	if err := inst.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	tp := time.Since(t0)
	if err := inst.Pause(ctx); err != nil {
		t.Fatalf("second pause: %v", err)
	}
	// Attach sees a paused sandbox.
	d2 := newDriver(t, d.opts)
	if _, err := d2.Attach(ctx, "pz"); err != nil {
		t.Fatalf("attach paused: %v", err)
	}
	t1 := time.Now()
	if err := inst.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("pause %v, resume %v", tp, time.Since(t1))
	if got := drivertest.MustSh(t, inst, "echo back"); got != "back" {
		t.Errorf("after resume: %q", got)
	}
}

func TestAttachLost(t *testing.T) {
	requireRunsc(t)
	d := newDriver(t, testOptions(t, shortDir(t)))
	inst := create(t, d, "lost", driver.Limits{})
	// The pid from runsc's pid file is the one runsc reports (what Kill
	// and the liveness check below rely on).
	if cs, err := d.r.state(testCtx(t), "lost"); err != nil || cs.PID != inst.PID() {
		t.Fatalf("runsc state: pid %d, %v; the driver took %d from the pid file", cs.PID, err, inst.PID())
	}
	// The sandbox dies behind the node's back.
	if err := killPid(inst.PID()); err != nil {
		t.Fatal(err)
	}
	if err := waitGone(testCtx(t), inst.PID(), inst.st.StartTime); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inst.Done():
	case <-time.After(5 * time.Second):
		t.Error("Done not closed after the sandbox process died")
	}
	d2 := newDriver(t, d.opts)
	if _, err := d2.Attach(testCtx(t), "lost"); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("attach of a dead sandbox: %v", err)
	}
	if left := leftovers(d2, "lost"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// BenchmarkCreateDestroy measures cold create (to agent ready), an exec
// round trip and destroy (drivertest.Bench).
func BenchmarkCreateDestroy(b *testing.B) {
	requireRunsc(b)
	drivertest.Bench(b, drivertest.Env{Rootfs: rootfs}, shortDir(b), func(dir string) driver.Driver {
		return newDriver(b, testOptions(b, dir))
	})
}

// BenchmarkCreateDestroyDisk is BenchmarkCreateDestroy with a 1 GiB disk
// per sandbox (the blank image made before the timer starts).
func BenchmarkCreateDestroyDisk(b *testing.B) {
	requireRunsc(b)
	if err := diskquota.Available(); err != nil {
		b.Skip(err)
	}
	drivertest.Bench(b, drivertest.Env{Rootfs: rootfs}, shortDir(b), func(dir string) driver.Driver {
		o := testOptions(b, dir)
		m, err := diskquota.New(diskquota.Options{CacheDir: filepath.Join(dir, "disks")})
		if err != nil {
			b.Fatal(err)
		}
		o.Disks, o.DefaultLimits.DiskBytes = m, 1<<30
		warmBlank(b, m, dir, 1<<30)
		return newDriver(b, o)
	})
}

// warmBlank makes the manager's blank image of size (the one-time mkfs).
func warmBlank(b *testing.B, m *diskquota.Manager, dir string, size int64) {
	mnt := filepath.Join(dir, "warm")
	os.Mkdir(mnt, 0o755)
	if err := m.Create(context.Background(), filepath.Join(dir, "warm.img"), mnt, size); err != nil {
		b.Fatal(err)
	}
	if err := diskquota.Remove(filepath.Join(dir, "warm.img"), mnt); err != nil {
		b.Fatal(err)
	}
}

// TestForkBomb: the sandbox's pids limit holds in the Sentry (the commands'
// cgroup), so a fork bomb fails to fork past it and the sandbox, whose
// host cgroup leaves room for runsc's own tasks, lives on and answers.
func TestForkBomb(t *testing.T) {
	requireRunsc(t)
	d := newDriver(t, testOptions(t, shortDir(t)))
	inst := create(t, d, "bomb", driver.Limits{MemoryBytes: 256 << 20, Pids: 32})
	g := d.cg.Open(inst.st.Cgroups)
	hostMax := func() string {
		b, _ := os.ReadFile(filepath.Join(g.Paths().Pids, "pids.max"))
		return strings.TrimSpace(string(b))
	}
	if got, want := hostMax(), strconv.FormatInt(hostPids(32), 10); got != want {
		t.Errorf("host pids.max %s, want %s", got, want)
	}
	grp := agentpids.Root + "/" + agentpids.GroupName
	if out := drivertest.MustSh(t, inst, "cat "+grp+"/pids.max; grep -c . "+grp+"/cgroup.procs"); !strings.HasPrefix(out, "32\n") {
		t.Errorf("in-sandbox pids.max and procs: %q", out)
	}
	// The bomb runs 3 s; then the sandbox must answer (a command may not
	// start while the bomb holds every slot: retry) and clean up.
	ctx := testCtx(t)
	out, exit, err := drivertest.Sh(ctx, inst, "bomb() { bomb | bomb & }; bomb; sleep 3; kill -9 -1; echo done")
	t.Logf("bomb: exit %+v err %v out %.200q", exit, err, out)
	var got string
	for i := 0; i < 40; i++ {
		out, exit, err := drivertest.Sh(ctx, inst, "kill -9 -1 2>/dev/null; sleep 0.2; cat "+grp+"/pids.events; echo alive")
		if err == nil && exit.Code == 0 && strings.Contains(out, "alive") {
			got = out
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if !strings.Contains(got, "alive") {
		t.Fatalf("sandbox unusable after the fork bomb")
	}
	if strings.Contains(got, "max 0") {
		t.Errorf("the bomb never hit the in-sandbox limit: %q", got)
	}
	select {
	case <-inst.Done():
		t.Fatal("the sandbox died")
	default:
	}
	// No more than 32 at once (a subshell forks until it cannot, which
	// ends it; the count uses builtins); SetLimits moves both limits.
	out = drivertest.MustSh(t, inst, "(i=0; while [ $i -lt 40 ]; do sleep 5 & i=$((i+1)); done) 2>/dev/null; set -- /proc/[0-9]*; echo $#; kill -9 -1 2>/dev/null; true")
	if n, _ := strconv.Atoi(strings.TrimSpace(out)); n < 20 || n > 32+3 {
		t.Errorf("tasks under pids=32: %q", out)
	}
	if err := inst.SetLimits(ctx, driver.Limits{MemoryBytes: 256 << 20, Pids: 50}); err != nil {
		t.Fatal(err)
	}
	if got, want := hostMax(), strconv.FormatInt(hostPids(50), 10); got != want {
		t.Errorf("host pids.max after SetLimits %s, want %s", got, want)
	}
	if out := drivertest.MustSh(t, inst, "cat "+grp+"/pids.max"); out != "50" {
		t.Errorf("in-sandbox pids.max after SetLimits: %q", out)
	}
}
