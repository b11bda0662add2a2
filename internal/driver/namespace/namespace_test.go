package namespace

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/driver"
)

// assertGone checks that nothing of sandbox id is left on the host.
func assertGone(t *testing.T, d *Driver, id string, pid int) {
	t.Helper()
	for _, p := range append([]string{d.sandboxDir(id), d.sockPath(id)}, d.cg.Paths(id).Dirs...) {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", p, err)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), d.opts.StateDir) {
		t.Errorf("a mount references %s", d.opts.StateDir)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		if os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("process %d still exists", pid)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func hostRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestCreateExecDestroy(t *testing.T) {
	requireSandbox(t)
	d := newDriver(t, testOptions(t))
	inst := create(t, d, "sbx1", driver.Limits{})
	t.Logf("timing %+v", inst.Timing())
	if inst.Timing().Total == 0 || inst.Timing().AgentReady == 0 || inst.Timing().Hardening == 0 {
		t.Errorf("timing not filled in: %+v", inst.Timing())
	}

	c := client.New(inst.Dial)
	if err := c.Health(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	c.Close()

	if got := mustSh(t, inst, "id -u; id -g"); got != "0\n0" {
		t.Errorf("ids inside: %q", got)
	}
	if got := mustSh(t, inst, "hostname"); got != "box-sbx1" {
		t.Errorf("hostname %q", got)
	}
	// The root is the overlay, the host's tree is gone, /dev is minimal.
	mounts := mustSh(t, inst, "cat /proc/self/mounts")
	for _, want := range []string{"overlay / overlay", "proc /proc proc", "tmpfs /dev tmpfs", "devpts /dev/pts devpts", "/dev/shm tmpfs", "sysfs /sys sysfs ro"} {
		if !strings.Contains(mounts, want) {
			t.Errorf("mount %q missing:\n%s", want, mounts)
		}
	}
	// No host path shows inside: not in the overlay's options (relative
	// to init's working directory), not in PID 1's command line, and the
	// agent runs from a memfd, not from its host path.
	inside := mustSh(t, inst, "cat /proc/self/mounts /proc/self/mountinfo /proc/1/mountinfo; tr '\\0' ' ' < /proc/1/cmdline")
	for _, host := range []string{d.opts.StateDir, rootfs, initBin, filepath.Dir(initBin)} {
		if strings.Contains(inside, host) {
			t.Errorf("host path %s visible inside:\n%s", host, inside)
		}
	}
	if !strings.Contains(inside, "lowerdir=lower,upperdir=upper,workdir=work") {
		t.Errorf("overlay options inside:\n%s", inside)
	}
	// The writable layer is volatile: a delete does not sync the host's
	// filesystem (sandboxinit.Config.OverlayOptions). Linux 6.x shows the
	// option as fsync=volatile, older kernels as volatile.
	if !regexp.MustCompile(`(?m)^overlay / overlay \S*,(fsync=)?volatile\b`).MatchString(inside) {
		t.Errorf("root overlay not mounted volatile:\n%s", inside)
	}
	if exe, err := os.Readlink("/proc/" + strconv.Itoa(inst.proc.pid) + "/exe"); err != nil || !strings.HasPrefix(exe, "/memfd:space-agent") {
		t.Errorf("PID 1 runs %q (%v), want the agent's memfd", exe, err)
	}
	if maps := hostRead(t, "/proc/"+strconv.Itoa(inst.proc.pid)+"/maps"); strings.Contains(maps, initBin) {
		t.Errorf("PID 1 maps its binary from the host path:\n%s", maps)
	}
	if got := mustSh(t, inst, "ls /dev | sort | tr '\\n' ' '"); got != "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero" {
		t.Errorf("/dev: %q", got)
	}
	if got := mustSh(t, inst, "echo hello > /tmp/f && cat /tmp/f && echo x > /dev/null && head -c 4 /dev/zero | wc -c"); got != "hello\n4" {
		t.Errorf("writes: %q", got)
	}
	// Only loopback, and it is up.
	if got := mustSh(t, inst, "ls /sys/class/net"); got != "lo" {
		t.Errorf("interfaces: %q", got)
	}
	if got := mustSh(t, inst, "cat /sys/class/net/lo/operstate; cat /sys/class/net/lo/flags"); !strings.HasSuffix(got, "0x9") {
		t.Errorf("lo: %q", got)
	}
	// Locked down: no_new_privs, seccomp filter mode, own cgroup namespace.
	status := mustSh(t, inst, "cat /proc/self/status")
	for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(status, want) {
			t.Errorf("%q missing from status", want)
		}
	}
	if got := mustSh(t, inst, "grep -c -v ':/$' /proc/self/cgroup || true"); got != "0" {
		t.Errorf("cgroup paths not namespaced:\n%s", mustSh(t, inst, "cat /proc/self/cgroup"))
	}
	// PID 1 runs with one P (agentEnv); its commands do not inherit that.
	if env := hostRead(t, fmt.Sprintf("/proc/%d/environ", inst.PID())); !slices.Contains(strings.Split(env, "\x00"), "GOMAXPROCS=1") {
		t.Errorf("PID 1's environment lacks GOMAXPROCS=1: %q", env)
	}
	if got := mustSh(t, inst, "env | grep -c ^GOMAXPROCS= || true"); got != "0" {
		t.Errorf("a command inherited the agent's GOMAXPROCS:\n%s", mustSh(t, inst, "env"))
	}
	// Fork and exec from a busybox (libc) shell work under the filter.
	if got := mustSh(t, inst, "sleep 0 & wait; (echo sub) | cat"); got != "sub" {
		t.Errorf("fork: %q", got)
	}

	// uid 0 inside is the sandbox's own pool block outside.
	if !d.opts.Pool.Contains(inst.uidBase) {
		t.Errorf("sandbox runs as host %d, not a block of the pool", inst.uidBase)
	}
	hs := hostRead(t, fmt.Sprintf("/proc/%d/status", inst.PID()))
	if want := fmt.Sprintf("Uid:\t%[1]d\t%[1]d\t%[1]d\t%[1]d", inst.uidBase); !strings.Contains(hs, want) {
		t.Errorf("host view of PID 1, want %q:\n%s", want, hs)
	}
	// The written file landed in the upper layer, owned by the mapped root.
	fi, err := os.Stat(filepath.Join(d.sandboxDir("sbx1"), "upper/tmp/f"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != inst.uidBase {
		t.Errorf("upper file owned by %d, want %d", st.Uid, inst.uidBase)
	}

	pid := inst.PID()
	start := time.Now()
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("destroy %v", time.Since(start))
	assertGone(t, d, "sbx1", pid)
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
	select {
	case <-inst.Done():
	default:
		t.Error("Done not closed after destroy")
	}
}

func TestSeccompInside(t *testing.T) {
	requireSandbox(t)
	d := newDriver(t, testOptions(t))
	inst := create(t, d, "sec", driver.Limits{})
	defer inst.Destroy(context.Background())
	for _, script := range []string{
		"unshare -U true",
		"unshare -n true",
		"mount -t tmpfs none /mnt",
		"umount /proc",
	} {
		out, exit := sh(t, inst, "mkdir -p /mnt; "+script)
		if exit.Code == 0 {
			t.Errorf("%q succeeded: %s", script, out)
		} else if o := strings.ToLower(out); !strings.Contains(o, "not permitted") && !strings.Contains(o, "permission denied") {
			t.Errorf("%q: want EPERM, got %q", script, out)
		}
	}
}

func TestLimitsAndOOM(t *testing.T) {
	requireSandbox(t)
	d := newDriver(t, testOptions(t))
	inst := create(t, d, "lim", driver.Limits{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 64})
	defer inst.Destroy(context.Background())
	p := inst.Cgroup().Paths()
	check := func(dir, file, want string) {
		t.Helper()
		if dir == "" {
			t.Logf("no controller for %s", file)
			return
		}
		if got := hostRead(t, filepath.Join(dir, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	unified := p.Memory != "" && p.Memory == p.Unified
	if unified {
		check(p.Memory, "memory.max", "67108864")
		check(p.CPU, "cpu.max", "50000 100000")
	} else {
		check(p.Memory, "memory.limit_in_bytes", "67108864")
		check(p.CPU, "cpu.cfs_quota_us", "50000")
	}
	check(p.Pids, "pids.max", "64")

	if err := inst.SetLimits(testCtx(t), driver.Limits{MemoryBytes: 48 << 20, Pids: 32}); err != nil {
		t.Fatal(err)
	}
	check(p.Pids, "pids.max", "32")
	if !unified {
		check(p.Memory, "memory.limit_in_bytes", "50331648")
		check(p.CPU, "cpu.cfs_quota_us", "-1")
	}

	if n, err := inst.OOMKills(); err != nil || n != 0 {
		t.Fatalf("oom kills before: %d %v", n, err)
	}
	// dd allocates its block in one piece and fills it.
	out, exit := sh(t, inst, "dd if=/dev/zero of=/dev/null bs=96M count=1")
	if exit.Signal != "SIGKILL" {
		t.Errorf("dd not OOM-killed: %+v %s", exit, out)
	}
	if n, err := inst.OOMKills(); err != nil || n < 1 {
		t.Errorf("oom kills after: %d %v", n, err)
	}
	// The agent (oom_score_adj -1000) survived.
	if got := mustSh(t, inst, "echo alive"); got != "alive" {
		t.Errorf("after OOM: %q", got)
	}
}

func TestAttachAfterRestart(t *testing.T) {
	requireSandbox(t)
	opts := testOptions(t)
	d1 := newDriver(t, opts)
	inst := create(t, d1, "keep", driver.Limits{Pids: 99})
	mustSh(t, inst, "echo state > /root/mark")

	// A new driver value over the same dirs, as after a node restart.
	d2 := newDriver(t, opts)
	got, err := d2.Attach(testCtx(t), "keep")
	if err != nil {
		t.Fatal(err)
	}
	re := got.(*Instance)
	if re.PID() != inst.PID() {
		t.Fatalf("attached pid %d, created %d", re.PID(), inst.PID())
	}
	if out := mustSh(t, re, "cat /root/mark"); out != "state" {
		t.Errorf("mark %q", out)
	}
	if err := re.SetLimits(testCtx(t), driver.Limits{Pids: 77}); err != nil {
		t.Fatal(err)
	}
	if p := re.Cgroup().Paths().Pids; p != "" && hostRead(t, filepath.Join(p, "pids.max")) != "77" {
		t.Error("SetLimits on attached instance not applied")
	}
	if _, err := d2.Attach(testCtx(t), "nosuch"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("attach of unknown id: %v", err)
	}
	if err := re.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-re.Done():
	case <-time.After(5 * time.Second):
		t.Error("attached Done not closed")
	}
	assertGone(t, d2, "keep", inst.PID())
}

func TestAttachLost(t *testing.T) {
	requireSandbox(t)
	opts := testOptions(t)
	d1 := newDriver(t, opts)
	d2 := newDriver(t, opts)

	// PID 1 killed behind the driver's back.
	dead := create(t, d1, "dead", driver.Limits{})
	if err := syscall.Kill(dead.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-dead.Done()
	_, err := d2.Attach(testCtx(t), "dead")
	if !errors.Is(err, driver.ErrLost) {
		t.Fatalf("want ErrLost, got %v", err)
	}
	t.Log(err)
	assertGone(t, d2, "dead", dead.PID())

	// Alive but its agent socket is gone: killed and cleaned up.
	mute := create(t, d1, "mute", driver.Limits{})
	if err := os.Remove(d1.sockPath("mute")); err != nil {
		t.Fatal(err)
	}
	_, err = d2.Attach(testCtx(t), "mute")
	if !errors.Is(err, driver.ErrLost) {
		t.Fatalf("want ErrLost, got %v", err)
	}
	t.Log(err)
	assertGone(t, d2, "mute", mute.PID())

	// The recorded pid now belongs to another process (the start time does
	// not match): that process is left alone, while the sandbox itself,
	// found through its cgroup, is still removed.
	reused := create(t, d1, "reused", driver.Limits{})
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Process.Kill()
	st, err := readState(d1.sandboxDir("reused"))
	if err != nil {
		t.Fatal(err)
	}
	st.PID = other.Process.Pid
	if err := writeState(d1.sandboxDir("reused"), st); err != nil {
		t.Fatal(err)
	}
	_, err = d2.Attach(testCtx(t), "reused")
	if !errors.Is(err, driver.ErrLost) {
		t.Fatalf("want ErrLost, got %v", err)
	}
	t.Log(err)
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("unrelated process with the recorded pid was killed: %v", err)
	}
	assertGone(t, d2, "reused", reused.PID())
}

func TestSweep(t *testing.T) {
	requireSandbox(t)
	d := newDriver(t, testOptions(t))
	a := create(t, d, "a", driver.Limits{})
	b := create(t, d, "b", driver.Limits{})
	// Leftovers without a state file: a bare cgroup and a bare dir.
	if _, err := d.cg.Create("stray"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(d.sandboxDir("stray2"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.Sweep(testCtx(t), map[string]bool{"a": true}); err != nil {
		t.Fatal(err)
	}
	assertGone(t, d, "b", b.PID())
	for _, id := range []string{"stray", "stray2"} {
		for _, p := range append([]string{d.sandboxDir(id)}, d.cg.Paths(id).Dirs...) {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s left behind", p)
			}
		}
	}
	if got := mustSh(t, a, "echo a"); got != "a" {
		t.Errorf("kept sandbox broken: %q", got)
	}
	ids, _ := d.cg.List()
	if len(ids) != 1 || ids[0] != "a" {
		t.Errorf("cgroups after sweep: %v", ids)
	}
	if err := a.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	// b's Instance is stale; destroying it again is harmless.
	if err := b.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestCreateFailures(t *testing.T) {
	requireSandbox(t)
	d := newDriver(t, testOptions(t))
	ctx := testCtx(t)

	// A template whose /proc is a symlink out of the tree is refused by
	// init; nothing is left.
	bad := filepath.Join(t.TempDir(), "badroot")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(bad, "proc")); err != nil {
		t.Fatal(err)
	}
	_, err := d.Create(ctx, driver.Spec{ID: "bad", RootfsDir: bad})
	if err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("want a not-a-directory error, got %v", err)
	}
	t.Log(err)
	for _, p := range append([]string{d.sandboxDir("bad"), d.sockPath("bad")}, d.cg.Paths("bad").Dirs...) {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind", p)
		}
	}

	for _, spec := range []driver.Spec{
		{ID: "Bad_ID", RootfsDir: rootfs},
		{ID: "../x", RootfsDir: rootfs},
		{ID: "x", RootfsDir: "relative"},
		{ID: "x", RootfsDir: "/nonexistent"},
		{ID: "x", RootfsDir: rootfs, Hostname: "bad host"},
	} {
		if _, err := d.Create(ctx, spec); err == nil {
			t.Errorf("created %+v", spec)
		}
	}

	// A duplicate id is refused and does not harm the first.
	first := create(t, d, "dup", driver.Limits{})
	if _, err := d.Create(ctx, driver.Spec{ID: "dup", RootfsDir: rootfs}); err == nil {
		t.Fatal("duplicate create succeeded")
	}
	if got := mustSh(t, first, "echo ok"); got != "ok" {
		t.Errorf("first sandbox broken: %q", got)
	}
	if err := first.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	// A cancelled context stops the wait for the agent.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := d.Create(cctx, driver.Spec{ID: "cancelled", RootfsDir: rootfs}); err == nil {
		t.Fatal("create with a cancelled context succeeded")
	}
	if _, err := os.Stat(d.sandboxDir("cancelled")); !os.IsNotExist(err) {
		t.Error("cancelled create left its dir")
	}
}

func TestStateParsing(t *testing.T) {
	dir := t.TempDir()
	if _, err := readState(dir); !os.IsNotExist(err) {
		t.Fatalf("missing state: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readState(dir); err == nil {
		t.Fatal("accepted bad json")
	}
	if err := writeState(dir, state{ID: "x", PID: 42, StartTime: 7}); err != nil {
		t.Fatal(err)
	}
	st, err := readState(dir)
	if err != nil || st.PID != 42 || st.StartTime != 7 || st.Version != stateVersion {
		t.Fatalf("%+v %v", st, err)
	}
	start, zombie, err := procStat(os.Getpid())
	if err != nil || start == 0 || zombie {
		t.Fatalf("procStat self: %d %v %v", start, zombie, err)
	}
}

// BenchmarkCreateDestroy measures create → agent ready and destroy, with
// the per-phase breakdown as extra metrics.
func BenchmarkCreateDestroy(b *testing.B) {
	requireSandbox(b)
	d := newDriver(b, testOptions(b))
	ctx := context.Background()
	var sum driver.Timing
	var totals, destroys []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		inst, err := d.Create(ctx, driver.Spec{ID: fmt.Sprintf("bench-%d", i), RootfsDir: rootfs})
		if err != nil {
			b.Fatal(err)
		}
		tm := inst.Timing()
		sum.Namespaces += tm.Namespaces
		sum.Cgroups += tm.Cgroups
		sum.Overlay += tm.Overlay
		sum.Network += tm.Network
		sum.AgentReady += tm.AgentReady
		sum.Total += tm.Total
		totals = append(totals, tm.Total)
		start := time.Now()
		if err := inst.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		destroys = append(destroys, time.Since(start))
	}
	n := float64(len(totals))
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(sum.Namespaces)/n, "start-ms")
	b.ReportMetric(ms(sum.Cgroups)/n, "cgroups-ms")
	b.ReportMetric(ms(sum.Overlay)/n, "mounts-ms")
	b.ReportMetric(ms(sum.Network)/n, "net-ms")
	b.ReportMetric(ms(sum.AgentReady)/n, "ready-ms")
	b.ReportMetric(ms(sum.Total)/n, "create-ms")
	b.ReportMetric(ms(percentile(totals, 50)), "create-p50-ms")
	b.ReportMetric(ms(percentile(totals, 95)), "create-p95-ms")
	b.ReportMetric(ms(percentile(destroys, 50)), "destroy-p50-ms")
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

func TestNetworkHookAndProbe(t *testing.T) {
	requireSandbox(t)
	opts := testOptions(t)
	hostNet, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var sawPid int
	opts.Network = func(ctx context.Context, id string, pid int) error {
		sawPid = pid
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			return err
		}
		if ns == hostNet {
			return errors.New("sandbox shares the host's network namespace")
		}
		return nil
	}
	failProbe := false
	opts.Probe = func(ctx context.Context, inst driver.Instance) error {
		if failProbe {
			return errors.New("probe says no")
		}
		c := client.New(inst.Dial)
		defer c.Close()
		return c.Health(ctx)
	}
	d := newDriver(t, opts)
	inst := create(t, d, "hooks", driver.Limits{})
	if sawPid != inst.PID() {
		t.Errorf("network hook saw pid %d, PID 1 is %d", sawPid, inst.PID())
	}
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}

	failProbe = true
	_, err = d.Create(testCtx(t), driver.Spec{ID: "noprobe", RootfsDir: rootfs})
	if err == nil || !strings.Contains(err.Error(), "probe says no") {
		t.Fatalf("want probe error, got %v", err)
	}
	assertGone(t, d, "noprobe", sawPid)
}

// TestSurvivesNodeKill creates a sandbox from another process, kills that
// process with SIGKILL, and re-adopts the sandbox, which is then nobody's
// child of ours: liveness and kill go through the pidfd.
func TestSurvivesNodeKill(t *testing.T) {
	requireSandbox(t)
	opts := testOptions(t)
	d := newDriver(t, opts) // its cleanup sweeps the orphan if the test fails
	spec, err := json.Marshal(nodeHelperSpec{
		StateDir: opts.StateDir, RunDir: opts.RunDir, AgentPath: opts.AgentPath, CgroupBase: opts.CgroupBase,
		ID: "orphan", Rootfs: rootfs, Pool: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	node := exec.Command(os.Args[0], "-test.run=^$")
	node.Env = append(os.Environ(), nodeHelperEnv+"="+string(spec))
	stdout, err := node.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "READY ") {
		_ = node.Process.Kill()
		_ = node.Wait()
		t.Fatalf("node helper: %q %v", line, err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "READY ")))
	if err := node.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = node.Wait()

	got, err := d.Attach(testCtx(t), "orphan")
	if err != nil {
		t.Fatal(err)
	}
	inst := got.(*Instance)
	if inst.PID() != pid {
		t.Fatalf("attached pid %d, node reported %d", inst.PID(), pid)
	}
	if out := mustSh(t, inst, "echo survived"); out != "survived" {
		t.Errorf("got %q", out)
	}
	// The block outlived the node in the registry and stays the sandbox's.
	dir := d.sandboxDir("orphan")
	if base, _ := uidMap(t, pid); uint64(inst.uidBase) != base || !d.opts.Pool.Contains(inst.uidBase) {
		t.Errorf("re-adopted block %d, uid_map %d", inst.uidBase, base)
	}
	if o, _ := d.opts.Pool.Owner(inst.uidBase); o != dir {
		t.Errorf("block %d owned by %q after the kill", inst.uidBase, o)
	}
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inst.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed for a re-attached sandbox")
	}
	if o, _ := d.opts.Pool.Owner(inst.uidBase); o == dir {
		t.Errorf("block %d not freed", inst.uidBase)
	}
	// Reaping the orphan is up to its new parent (init), so only check
	// it is no longer running.
	if _, zombie, err := procStat(pid); err == nil && !zombie {
		t.Errorf("pid %d still running", pid)
	}
	for _, p := range append([]string{d.sandboxDir("orphan"), d.sockPath("orphan")}, d.cg.Paths("orphan").Dirs...) {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind", p)
		}
	}
}

func TestParallelCreate(t *testing.T) {
	requireSandbox(t)
	d := newDriver(t, testOptions(t))
	const n = 6
	errs := make(chan error, n)
	insts := make(chan *Instance, n)
	for i := range n {
		go func() {
			inst, err := d.Create(testCtx(t), driver.Spec{ID: fmt.Sprintf("par-%d", i), RootfsDir: rootfs})
			if err != nil {
				errs <- err
				return
			}
			insts <- inst.(*Instance)
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(insts)
	for inst := range insts {
		if got := mustSh(t, inst, "hostname"); got != inst.ID() {
			t.Errorf("hostname %q in %s", got, inst.ID())
		}
		pid := inst.PID()
		if err := inst.Destroy(testCtx(t)); err != nil {
			t.Error(err)
		}
		assertGone(t, d, inst.ID(), pid)
	}
}

// TestForkHelper checks who forks PID 1: the fork helper by default (so
// the node's page tables are not copied per create), this process with
// DirectFork. Both sandboxes work and leave nothing behind.
func TestForkHelper(t *testing.T) {
	requireSandbox(t)
	ppid := func(pid int) int {
		t.Helper()
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, direct := range []bool{false, true} {
		opts := testOptions(t)
		opts.DirectFork = direct
		d := newDriver(t, opts)
		inst := create(t, d, "fork", driver.Limits{})
		pid, parent := inst.PID(), ppid(inst.PID())
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", parent))
		switch {
		case direct && parent != os.Getpid():
			t.Errorf("DirectFork: PID 1's parent is %d (%q), want this process %d", parent, cmdline, os.Getpid())
		case !direct && !bytes.Contains(cmdline, []byte("--spawner")):
			t.Errorf("PID 1's parent is %d (%q), want the fork helper", parent, cmdline)
		}
		// Either way PID 1 is in its groups (cloned into them by the
		// helper, moved there after a direct fork) and its cgroup
		// namespace is rooted there.
		hostView := hostRead(t, fmt.Sprintf("/proc/%d/cgroup", pid)) + "\n"
		for _, dir := range d.cg.Paths("fork").Dirs {
			if rel := dir[strings.LastIndex(dir, "/"+d.opts.CgroupBase+"/"):]; !strings.Contains(hostView, rel+"\n") {
				t.Errorf("direct=%v: PID 1 not in %s:\n%s", direct, dir, hostView)
			}
		}
		if got := mustSh(t, inst, "grep -c -v ':/$' /proc/1/cgroup || true"); got != "0" {
			t.Errorf("direct=%v: cgroup paths not namespaced:\n%s", direct, mustSh(t, inst, "cat /proc/1/cgroup"))
		}
		// Closing the driver stops the helper, not the sandbox it forked.
		d.Close()
		if !direct {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", parent)); err == nil {
				time.Sleep(200 * time.Millisecond)
				if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", parent)); bytes.Equal(b, cmdline) {
					t.Errorf("fork helper %d still runs after Close", parent)
				}
			}
		}
		c := client.New(inst.Dial)
		if err := c.Health(testCtx(t)); err != nil {
			t.Errorf("direct=%v: health after Close: %v", direct, err)
		}
		c.Close()
		if err := inst.Destroy(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		assertGone(t, d, "fork", pid)
	}
}

// TestSignalsToPID1: root in the sandbox sends PID 1 every termination
// signal; the agent has none of them caught (the kernel then delivers
// them to a namespace's init not at all) and keeps serving.
func TestSignalsToPID1(t *testing.T) {
	requireSandbox(t)
	d := newDriver(t, testOptions(t))
	inst := create(t, d, "sig", driver.Limits{})
	defer inst.Destroy(testCtx(t))
	if got := mustSh(t, inst, "grep -E '^Sig(Cgt|Ign)' /proc/1/status"); !strings.Contains(got, "SigCgt:") {
		t.Fatalf("PID 1 status: %q", got)
	} else {
		for _, line := range strings.Split(got, "\n") {
			_, hex, _ := strings.Cut(line, ":")
			v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE} {
				if v&(1<<(sig-1)) != 0 {
					t.Errorf("PID 1 has %v in %q", sig, line)
				}
			}
		}
	}
	out := mustSh(t, inst, "for s in TERM INT HUP QUIT USR1 USR2 PIPE; do kill -s $s 1 || echo refused $s; done; sleep 0.2; echo sent")
	if out != "sent" {
		t.Errorf("kill: %q", out)
	}
	if got := mustSh(t, inst, "echo alive"); got != "alive" {
		t.Errorf("after the signals: %q", got)
	}
	select {
	case <-inst.proc.done:
		t.Fatal("PID 1 exited")
	default:
	}
}

func TestAgentEnv(t *testing.T) {
	base := make([]string, 2, 4)
	copy(base, []string{"PATH=/bin", "HOME=/root"})
	got := agentEnv(base)
	if want := []string{"PATH=/bin", "HOME=/root", "GOMAXPROCS=1"}; !slices.Equal(got, want) {
		t.Errorf("agentEnv(%q) = %q, want %q", base, got, want)
	}
	// The caller's backing array is not written to.
	if spare := base[:3]; spare[2] != "" {
		t.Errorf("agentEnv wrote into the caller's slice: %q", spare)
	}
	// An operator's own setting wins and is not duplicated.
	own := []string{"GOMAXPROCS=2", "PATH=/bin"}
	if got := agentEnv(own); !slices.Equal(got, own) {
		t.Errorf("agentEnv(%q) = %q", own, got)
	}
}
