package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

// hostUID is the real uid of a host process.
func hostUID(t *testing.T, pid int) uint32 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			u, err := strconv.ParseUint(f[1], 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(u)
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return 0
}

// Two gVisor sandboxes of one node: runsc's processes run under disjoint
// host blocks of the pool, each owns its writes by its own block, both
// see the shared template as root's, one's host uid reaches nothing of
// the other's, and a restarted node re-adopts the blocks; destroy frees.
func TestOwnUIDRanges(t *testing.T) {
	requireRunsc(t)
	opts := testOptions(t, shortDir(t))
	d := newDriver(t, opts)
	a, b := create(t, d, "uid-a", driver.Limits{}), create(t, d, "uid-b", driver.Limits{})
	ba, bb := a.uidBase(), b.uidBase()
	if ba == bb || !opts.Pool.Contains(ba) || !opts.Pool.Contains(bb) {
		t.Fatalf("blocks %d and %d: not distinct blocks of the pool", ba, bb)
	}
	for _, inst := range []*Instance{a, b} {
		if u := hostUID(t, inst.st.PID); u != inst.uidBase() {
			t.Errorf("%s: runsc sandbox process runs as host %d, want %d", inst.id, u, inst.uidBase())
		}
		if o, _ := opts.Pool.Owner(inst.uidBase()); o != inst.dir {
			t.Errorf("%s: block owned by %q", inst.id, o)
		}
	}
	const look = "stat -c '%u:%g %a %s' /bin/busybox /etc/passwd; md5sum /bin/busybox"
	ta, tb := drivertest.MustSh(t, a, look), drivertest.MustSh(t, b, look)
	if ta != tb || !strings.HasPrefix(ta, "0:0 ") {
		t.Errorf("template views differ or are not root's:\na: %s\nb: %s", ta, tb)
	}
	for _, inst := range []*Instance{a, b} {
		drivertest.MustSh(t, inst, "umask 077; echo secret > /root/secret")
		fi, err := os.Lstat(filepath.Join(upperDir(inst.dir), "root", "secret"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != inst.uidBase() || st.Gid != inst.uidBase() {
			t.Errorf("%s: its file is host %d:%d, want %d", inst.id, st.Uid, st.Gid, inst.uidBase())
		}
	}
	secret := filepath.Join(upperDir(b.dir), "root", "secret")
	probes := map[string]string{
		"read":   "cat " + secret,
		"write":  "echo x >> " + secret,
		"signal": "kill -0 " + strconv.Itoa(b.st.PID),
	}
	for what, script := range probes {
		if ok, out := drivertest.AsHostUID(testCtx(t), ba, script); ok {
			t.Errorf("host uid %d (sandbox a's root) could %s sandbox b's: %s", ba, what, out)
		}
		if ok, out := drivertest.AsHostUID(testCtx(t), bb, script); !ok {
			t.Errorf("control: host uid %d (b's root) could not %s b's: %s", bb, what, out)
		}
	}

	d2 := newDriver(t, opts) // as after a node restart
	got, err := d2.Attach(testCtx(t), "uid-a")
	if err != nil {
		t.Fatal(err)
	}
	ra := got.(*Instance)
	if ra.uidBase() != ba {
		t.Fatalf("re-adopted under %d, created under %d", ra.uidBase(), ba)
	}
	if err := ra.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if o, _ := opts.Pool.Owner(ba); o == a.dir {
		t.Errorf("block %d still held by the destroyed sandbox", ba)
	}
	if err := b.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}
