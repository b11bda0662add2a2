package namespace

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

// uidMap reads the host range of a process's user namespace: "0 base n".
func uidMap(t *testing.T, pid int) (base, n uint64) {
	t.Helper()
	f := strings.Fields(hostRead(t, fmt.Sprintf("/proc/%d/uid_map", pid)))
	if len(f) != 3 || f[0] != "0" {
		t.Fatalf("uid_map of %d: %q", pid, f)
	}
	base, _ = strconv.ParseUint(f[1], 10, 32)
	n, _ = strconv.ParseUint(f[2], 10, 32)
	return base, n
}

// Two sandboxes of one node run under disjoint host ranges, own their
// writes by their own range, see the shared template as root's, cannot
// reach each other's files or processes even from the host, and keep
// their blocks across a node restart until they are destroyed.
func TestOwnUIDRanges(t *testing.T) {
	requireSandbox(t)
	opts := testOptions(t)
	d := newDriver(t, opts)
	a, b := create(t, d, "uid-a", driver.Limits{}), create(t, d, "uid-b", driver.Limits{})

	ab, an := uidMap(t, a.PID())
	bb, bn := uidMap(t, b.PID())
	if an != 65536 || bn != 65536 || ab+an > bb && bb+bn > ab {
		t.Fatalf("ranges overlap or are not 65536 wide: a %d+%d, b %d+%d", ab, an, bb, bn)
	}
	for _, s := range []struct {
		inst *Instance
		base uint64
	}{{a, ab}, {b, bb}} {
		if uint64(s.inst.uidBase) != s.base || !opts.Pool.Contains(s.inst.uidBase) {
			t.Errorf("%s: uid_map base %d, instance %d", s.inst.id, s.base, s.inst.uidBase)
		}
		if o, _ := opts.Pool.Owner(s.inst.uidBase); o != d.sandboxDir(s.inst.id) {
			t.Errorf("%s: block %d owned by %q in the registry", s.inst.id, s.inst.uidBase, o)
		}
		hs := hostRead(t, fmt.Sprintf("/proc/%d/status", s.inst.PID()))
		if want := fmt.Sprintf("Uid:\t%[1]d\t%[1]d\t%[1]d\t%[1]d", s.base); !strings.Contains(hs, want) {
			t.Errorf("%s: host status lacks %q", s.inst.id, want)
		}
	}

	// The template reads the same in both, owned by root inside.
	const look = "stat -c '%u:%g %a %s' /bin/busybox /etc/passwd /root; md5sum /bin/busybox"
	ta, tb := mustSh(t, a, look), mustSh(t, b, look)
	if ta != tb || !strings.HasPrefix(ta, "0:0 ") {
		t.Errorf("template views differ or are not root's:\na: %s\nb: %s", ta, tb)
	}
	// Writes land owned by each sandbox's own range.
	for _, inst := range []*Instance{a, b} {
		mustSh(t, inst, "umask 077; echo secret > /root/secret; touch /root/user; chown 1000:1000 /root/user")
		for name, want := range map[string]uint32{"secret": inst.uidBase, "user": inst.uidBase + 1000} {
			fi, err := os.Lstat(filepath.Join(d.upperDir(inst.id), "root", name))
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != want || st.Gid != want {
				t.Errorf("%s: /root/%s owned by host %d:%d, want %d", inst.id, name, st.Uid, st.Gid, want)
			}
		}
	}

	// A host process with a's root uid reaches nothing of b; with b's own
	// uid the same script works (so the refusals are about the range).
	secret := filepath.Join(d.upperDir("uid-b"), "root", "secret")
	probes := map[string]string{
		"read":   "cat " + secret,
		"write":  "echo x >> " + secret,
		"create": "touch " + filepath.Join(filepath.Dir(secret), "planted"),
		"signal": "kill -0 " + strconv.Itoa(b.PID()),
	}
	for what, script := range probes {
		if ok, out := drivertest.AsHostUID(testCtx(t), a.uidBase, script); ok {
			t.Errorf("host uid %d (sandbox a's root) could %s sandbox b's: %s", a.uidBase, what, out)
		}
		if ok, out := drivertest.AsHostUID(testCtx(t), b.uidBase, script); !ok {
			t.Errorf("control: host uid %d (b's root) could not %s b's: %s", b.uidBase, what, out)
		}
	}

	// A restarted node re-adopts both blocks and hands a new sandbox a
	// third one.
	d2 := newDriver(t, opts)
	got, err := d2.Attach(testCtx(t), "uid-a")
	if err != nil {
		t.Fatal(err)
	}
	ra := got.(*Instance)
	if ra.uidBase != a.uidBase {
		t.Fatalf("re-adopted with block %d, created with %d", ra.uidBase, a.uidBase)
	}
	c := create(t, d2, "uid-c", driver.Limits{})
	if c.uidBase == a.uidBase || c.uidBase == b.uidBase {
		t.Fatalf("block %d handed out again", c.uidBase)
	}

	// Destroy frees the block (someone else may take it at once).
	dirA := d.sandboxDir("uid-a")
	if err := ra.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if o, _ := opts.Pool.Owner(a.uidBase); o == dirA {
		t.Errorf("block %d still held by the destroyed sandbox", a.uidBase)
	}
	for _, inst := range []*Instance{b, c} {
		if err := inst.Destroy(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// A restored sandbox (fork, snapshot restore, wake) lands in a fresh block:
// its layer is written for that block, not the source's.
func TestRestoreFreshRange(t *testing.T) {
	requireSandbox(t)
	d := newDriver(t, testOptions(t))
	src := create(t, d, "uid-src", driver.Limits{})
	var layer driver.Layer
	inst, err := d.Create(testCtx(t), driver.Spec{ID: "uid-copy", RootfsDir: rootfs, InitLayer: func(_ context.Context, l driver.Layer) error {
		layer = l
		p := filepath.Join(l.Dir, "restored")
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			return err
		}
		return os.Lchown(p, int(l.UIDBase+1000), int(l.UIDBase+1000))
	}})
	if err != nil {
		t.Fatal(err)
	}
	cp := inst.(*Instance)
	defer cp.Destroy(testCtx(t))
	if cp.uidBase == src.uidBase || layer.UIDBase != cp.uidBase {
		t.Fatalf("copy runs as %d with a layer for %d; source %d", cp.uidBase, layer.UIDBase, src.uidBase)
	}
	if out := mustSh(t, cp, "stat -c %u:%g /restored"); out != "1000:1000" {
		t.Errorf("restored file inside: %s", out)
	}
	if l, err := cp.WritableLayer(); err != nil || l.UIDBase != cp.uidBase {
		t.Errorf("writable layer for capture: %+v %v", l, err)
	}
}

// A sandbox made before the node had a pool keeps the shared range after
// the node restarts with one.
func TestLegacyRangeKept(t *testing.T) {
	requireSandbox(t)
	opts := testOptions(t)
	legacy := opts
	legacy.Pool = nil
	old := create(t, newDriver(t, legacy), "uid-old", driver.Limits{})
	if old.uidBase != DefaultUIDBase {
		t.Fatalf("legacy sandbox runs as %d", old.uidBase)
	}
	got, err := newDriver(t, opts).Attach(testCtx(t), "uid-old")
	if err != nil {
		t.Fatal(err)
	}
	inst := got.(*Instance)
	if base, _ := uidMap(t, inst.PID()); inst.uidBase != DefaultUIDBase || base != DefaultUIDBase {
		t.Errorf("re-adopted legacy sandbox: instance %d, uid_map %d", inst.uidBase, base)
	}
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

// On a host whose root mount is shared (systemd's default) the sandbox's
// copy of the idmapped template is a slave of the host's until init makes
// its mounts private: the host must not detach its copy before then, or
// the sandbox's lower layer is empty. The uid-range tests run again in a
// child whose mount namespace has a shared root.
func TestSharedHostRoot(t *testing.T) {
	requireSandbox(t)
	if os.Getenv(sharedRootEnv) != "" {
		t.Skip("already the shared-root child")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1", "-test.v", "-test.run=^(TestOwnUIDRanges|TestRestoreFreshRange)$")
	mnt, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), sharedRootEnv+"="+initBin+"\n"+rootfs+"\n"+mnt)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestOwnUIDRanges") || !strings.Contains(string(out), "--- PASS: TestRestoreFreshRange") {
		t.Fatalf("under a shared root: %v\n%s", err, out)
	}
}

// BenchmarkUIDPool interleaves creates (→ agent ready) and destroys of
// three layouts in one loop, so load drift hits all alike: the shared
// range (no pool), a pool block whose user namespace for the idmapped
// template is cached (a block reused after a delete, the steady state),
// and one whose namespace is made afresh (a block never used before).
func BenchmarkUIDPool(b *testing.B) {
	requireSandbox(b)
	opts := testOptions(b)
	shared := opts
	shared.Pool = nil
	shared.StateDir += "-shared"
	pooled := newDriver(b, opts)
	layouts := []struct {
		name string
		d    *Driver
		prep func()
	}{
		{"shared", newDriver(b, shared), func() {}},
		{"pool", pooled, func() {}},
		{"pool-fresh-userns", pooled, func() { _ = pooled.idmaps.Close() }},
	}
	ctx := context.Background()
	took := make([][]time.Duration, len(layouts))
	for i := 0; b.Loop(); i++ {
		for k, l := range layouts {
			l.prep()
			inst, err := l.d.Create(ctx, driver.Spec{ID: fmt.Sprintf("ub-%d-%d", k, i), RootfsDir: rootfs})
			if err != nil {
				b.Fatal(err)
			}
			took[k] = append(took[k], inst.Timing().Total)
			if err := inst.Destroy(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for k, l := range layouts {
		b.ReportMetric(float64(percentile(took[k], 50))/float64(time.Millisecond), l.name+"-p50-ms")
	}
}
