package namespace

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/criu"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
	"github.com/space-sandbox/space/internal/driver/namespace/agenthandoff"
)

// requireCRIU skips unless a working CRIU is at hand (scripts/criu.sh).
func requireCRIU(t testing.TB) {
	t.Helper()
	if _, v, err := criu.ProbeSandboxes(context.Background(), ""); err != nil {
		t.Skipf("no usable CRIU (scripts/criu.sh builds it): %v", err)
	} else {
		t.Logf("criu %s", v)
	}
}

// TestCheckpointWithoutCRIU: with no CRIU, Checkpoint and Restore fail
// with driver.ErrUnsupported and the sandbox runs on untouched (a snapshot
// then keeps files only).
func TestCheckpointWithoutCRIU(t *testing.T) {
	requireSandbox(t)
	o := testOptions(t)
	o.CRIU = filepath.Join(t.TempDir(), "no-criu")
	d := newDriver(t, o)
	inst := create(t, d, "nocriu", driver.Limits{})
	defer inst.Destroy(context.Background())
	if err := inst.Checkpoint(testCtx(t), t.TempDir()); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("checkpoint without criu: %v", err)
	}
	if got := mustSh(t, inst, "echo alive"); got != "alive" {
		t.Errorf("after a refused checkpoint: %q", got)
	}
	if _, err := d.Restore(testCtx(t), driver.Spec{ID: "nocriu-re", RootfsDir: rootfs}, t.TempDir()); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("restore without criu: %v", err)
	}
}

// TestCheckpointRefusesNetwork: a sandbox with an interface besides
// loopback (a veth of --egress; here a veth pair made by the network hook) is
// refused with driver.ErrUnsupported before anything is frozen or handed
// off, since CRIU cannot restore it; the sandbox runs on.
func TestCheckpointRefusesNetwork(t *testing.T) {
	requireSandbox(t)
	requireCRIU(t)
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("needs ip (iproute2)")
	}
	o := testOptions(t)
	o.Network = func(ctx context.Context, id string, pid int) error {
		out, err := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(pid), "-n", ip, "link", "add", "eth9", "type", "veth", "peer", "name", "eth8").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	d := newDriver(t, o)
	inst := create(t, d, "withnet", driver.Limits{})
	defer inst.Destroy(context.Background())
	err = inst.Checkpoint(testCtx(t), t.TempDir())
	if !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), "eth9") {
		t.Fatalf("checkpoint of a sandbox with eth9: %v, want ErrUnsupported naming it", err)
	}
	if got := mustSh(t, inst, "echo alive"); got != "alive" {
		t.Errorf("after a refused checkpoint: %q", got)
	}
}

// TestCheckpointRestoreInPlace: the checkpointed sandbox itself goes on
// after the dump (its agent gets a listener back), twice in a row; a
// restore under the same id after it is destroyed (hibernate, resume)
// continues its counter, and checkpoints again.
func TestCheckpointRestoreInPlace(t *testing.T) {
	requireSandbox(t)
	requireCRIU(t)
	d := newDriver(t, testOptions(t))
	inst := create(t, d, "ckself", driver.Limits{})
	startCounter(t, inst)
	time.Sleep(1500 * time.Millisecond)
	img := t.TempDir()
	saved := t.TempDir()
	l, _ := inst.WritableLayer()
	var nCk int
	for range 2 {
		nCk = readN(t, inst)
		if err := os.RemoveAll(img); err != nil {
			t.Fatal(err)
		}
		if err := inst.Checkpoint(testCtx(t), img); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		// The layer of the checkpointed moment, as a snapshot reads it.
		if err := os.RemoveAll(saved); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(saved, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := drivertest.CopyLayer(l.Dir, 0)(testCtx(t), driver.Layer{Dir: saved}); err != nil {
			t.Fatal(err)
		}
		if err := inst.Resume(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		if got := mustSh(t, inst, "echo again"); got != "again" {
			t.Fatalf("source after checkpoint: %q", got)
		}
	}
	n0 := readN(t, inst)
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	re, err := d.Restore(testCtx(t), driver.Spec{ID: "ckself", RootfsDir: rootfs, InitLayer: drivertest.CopyLayer(saved, l.UIDBase)}, img)
	if err != nil {
		t.Fatalf("restore in place: %v", err)
	}
	defer re.Destroy(context.Background())
	n1 := readN(t, re)
	time.Sleep(300 * time.Millisecond)
	// A counter that restarted would be near 6 by now, not past where
	// the checkpoint found it (≥ 20 after 1.5 s).
	if n2 := readN(t, re); n1 < nCk || n2 <= n1 {
		t.Errorf("counter after restore %d then %d (%d at the checkpoint, %d before the destroy): restarted or stopped", n1, n2, nCk, n0)
	}
	// Its cgroup namespace is rooted at its own groups, as a new one's.
	if got := mustSh(t, re, "cut -d: -f3 /proc/self/cgroup | sort -u"); got != "/" {
		t.Errorf("restored sandbox's /proc/self/cgroup paths: %q, want only /", got)
	}
	// A restored sandbox checkpoints again (patch 0004) and goes on.
	if err := re.(*Instance).Checkpoint(testCtx(t), t.TempDir()); err != nil {
		t.Fatalf("checkpoint of the restored sandbox: %v", err)
	}
	if err := re.(*Instance).Resume(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	n3 := readN(t, re)
	time.Sleep(300 * time.Millisecond)
	if n4 := readN(t, re); n4 <= n3 {
		t.Errorf("counter after the second checkpoint: %d then %d", n3, n4)
	}
}

// startCounter starts a process in inst that writes 1, 2, 3, … to /tmp/n
// every 50 ms (renamed into place: a read never finds it empty).
func startCounter(t *testing.T, inst driver.Instance) {
	t.Helper()
	mustSh(t, inst, "(i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done) >/dev/null 2>&1 &")
}

func readN(t *testing.T, inst driver.Instance) int {
	t.Helper()
	var n int
	for _, c := range mustSh(t, inst, "cat /tmp/n") {
		if c >= '0' && c <= '9' {
			n = n*10 + int(c-'0')
		}
	}
	return n
}

// BenchmarkCheckpointRestore: checkpoint (listener handoff, criu dump,
// listener back) and restore as a fork of an idle sandbox.
func BenchmarkCheckpointRestore(b *testing.B) {
	requireSandbox(b)
	requireCRIU(b)
	d := newDriver(b, testOptions(b))
	inst := create(b, d, "ckbench", driver.Limits{})
	defer inst.Destroy(context.Background())
	l, _ := inst.WritableLayer()
	var ck, rs time.Duration
	var imgBytes int64
	for i := 0; b.Loop(); i++ {
		img := b.TempDir()
		t0 := time.Now()
		if err := inst.Checkpoint(context.Background(), img); err != nil {
			b.Fatal(err)
		}
		ck += time.Since(t0)
		imgBytes += dirBytes(img)
		saved := b.TempDir()
		if err := drivertest.CopyLayer(l.Dir, 0)(context.Background(), driver.Layer{Dir: saved}); err != nil {
			b.Fatal(err)
		}
		if err := inst.Resume(context.Background()); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		re, err := d.Restore(context.Background(), driver.Spec{ID: "ckbench-re", RootfsDir: rootfs, InitLayer: drivertest.CopyLayer(saved, l.UIDBase)}, img)
		if err != nil {
			b.Fatal(err)
		}
		rs += time.Since(t1)
		if err := re.Destroy(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(ck.Milliseconds())/float64(b.N), "checkpoint-ms")
	b.ReportMetric(float64(rs.Milliseconds())/float64(b.N), "restore-ms")
	b.ReportMetric(float64(imgBytes)/float64(b.N)/(1<<20), "image-MiB")
}

// dirBytes is the size of the files in dir.
func dirBytes(dir string) int64 {
	var n int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// TestAttachAfterInterruptedCheckpoint: a node that died between the
// agent's listener handoff and handing one back (the sandbox frozen) gets
// the sandbox back on Attach: thawed, its agent listening again.
func TestAttachAfterInterruptedCheckpoint(t *testing.T) {
	requireSandbox(t)
	o := testOptions(t)
	d := newDriver(t, o)
	inst := create(t, d, "ckcut", driver.Limits{})
	defer inst.Destroy(context.Background())
	fd, err := inst.handoff(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.setHandoff(inst.id, fd); err != nil {
		t.Fatal(err)
	}
	if err := inst.Pause(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	d2, err := New(o) // the restarted node
	if err != nil {
		t.Fatal(err)
	}
	re, err := d2.Attach(testCtx(t), "ckcut")
	if err != nil {
		t.Fatalf("attach after an interrupted checkpoint: %v", err)
	}
	if got := mustSh(t, re, "echo back"); got != "back" {
		t.Errorf("after attach: %q", got)
	}
	if st, err := readState(d.sandboxDir("ckcut")); err != nil || st.Handoff != 0 {
		t.Errorf("state after attach: %+v %v", st, err)
	}
}

// TestConcurrentCheckpoints: checkpoints of one sandbox asked for at the
// same time (a periodic one and a drain's hibernate) run one after the
// other and all succeed; the agent answers after them. Before, the second
// found the listener handed off ("dial agent: connection refused").
func TestConcurrentCheckpoints(t *testing.T) {
	requireSandbox(t)
	requireCRIU(t)
	d := newDriver(t, testOptions(t))
	inst := create(t, d, "ckconc", driver.Limits{})
	defer inst.Destroy(context.Background())
	const n = 3
	errs := make(chan error, n)
	for range n {
		go func() { errs <- inst.Checkpoint(testCtx(t), t.TempDir()) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("checkpoint: %v", err)
		}
	}
	if err := inst.Resume(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, inst, "echo alive"); got != "alive" {
		t.Errorf("after %d concurrent checkpoints: %q", n, got)
	}
}

// TestHandoffAnswerLost: the agent handed its listener off but the driver
// never read the answer (a timeout, a reset): the driver finds the
// agent's end of the pair at agenthandoff.FD and hands a listener in, and
// a later checkpoint works.
func TestHandoffAnswerLost(t *testing.T) {
	requireSandbox(t)
	d := newDriver(t, testOptions(t))
	inst := create(t, d, "cklost", driver.Limits{})
	defer inst.Destroy(context.Background())
	fd, err := inst.handoff(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if fd != agenthandoff.FD {
		t.Errorf("the agent's end is at %d, want %d", fd, agenthandoff.FD)
	}
	if c, err := inst.Dial(testCtx(t)); err == nil {
		c.Close()
		t.Fatal("the agent still listens after the handoff")
	}
	if err := inst.handInAfterFailedHandoff(0); err != nil {
		t.Fatalf("hand in without the answer: %v", err)
	}
	if got := mustSh(t, inst, "echo back"); got != "back" {
		t.Fatalf("after the hand-in: %q", got)
	}
	// Nothing handed off now: nothing to do.
	if err := inst.handInAfterFailedHandoff(0); err != nil {
		t.Errorf("hand in with no handoff pending: %v", err)
	}
	if got := mustSh(t, inst, "echo still"); got != "still" {
		t.Errorf("after a second hand-in: %q", got)
	}
}

// TestCheckpointTimeoutLeavesSandboxRunning: checkpoints cut short by
// CheckpointTimeout at points spread over a whole checkpoint (the
// handoff, the freeze, CRIU seizing the tree, injecting its parasite,
// dumping) fail or succeed, and either way leave the sandbox running
// with its agent listening and its counter counting; a checkpoint with
// time enough then succeeds. CRIU killed at the deadline while its
// parasite was in PID 1 killed the sandbox (CI, and here beside two busy
// loops in 3 runs of 3 with cuts every 2 ms).
func TestCheckpointTimeoutLeavesSandboxRunning(t *testing.T) {
	requireSandbox(t)
	requireCRIU(t)
	d := newDriver(t, testOptions(t))
	inst := create(t, d, "cktimeout", driver.Limits{})
	defer inst.Destroy(context.Background())
	startCounter(t, inst)
	failed := 0
	limits := []time.Duration{time.Millisecond}
	for ms := 10; ms <= 200; ms += 6 {
		limits = append(limits, time.Duration(ms)*time.Millisecond)
	}
	for _, limit := range limits {
		d.opts.CheckpointTimeout = limit
		err := inst.Checkpoint(testCtx(t), t.TempDir())
		if err != nil {
			failed++
		}
		t.Logf("checkpoint within %v: %v", limit, err)
		if err := inst.Resume(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		n0 := readN(t, inst)
		time.Sleep(300 * time.Millisecond)
		if n1 := readN(t, inst); n1 <= n0 {
			t.Fatalf("after a checkpoint within %v (%v): counter %d then %d", limit, err, n0, n1)
		}
	}
	if failed == 0 {
		t.Log("every short checkpoint succeeded: nothing was cut (a fast machine)")
	}
	d.opts.CheckpointTimeout = time.Minute
	if err := inst.Checkpoint(testCtx(t), t.TempDir()); err != nil {
		t.Fatalf("checkpoint after the cut ones: %v", err)
	}
	if err := inst.Resume(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, inst, "echo alive"); got != "alive" {
		t.Errorf("at the end: %q", got)
	}
}

// TestCheckpointRestoreNetwork: a sandbox with a network (a veth whose
// peer is on the host, as --egress makes) checkpoints and keeps its
// network; a fork of it restores without the image's veth and with the
// network hook's new one in its place (one eth0, with the hook's
// address), its counter going on.
func TestCheckpointRestoreNetwork(t *testing.T) {
	requireSandbox(t)
	requireCRIU(t)
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("needs ip (iproute2)")
	}
	o := testOptions(t)
	var mu sync.Mutex
	hooked := map[string]int{}
	o.Network = func(ctx context.Context, id string, pid int) error {
		mu.Lock()
		hooked[id]++
		mu.Unlock()
		// The host end: down and without an address, so this test
		// touches nothing of the host's network.
		h := fnv.New32a()
		h.Write([]byte(id))
		host := fmt.Sprintf("ckn%08x", h.Sum32())
		for _, args := range [][]string{
			{ip, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(pid)},
			{"nsenter", "-t", strconv.Itoa(pid), "-n", ip, "addr", "add", "10.250.0.2/30", "dev", "eth0"},
			{"nsenter", "-t", strconv.Itoa(pid), "-n", ip, "link", "set", "eth0", "up"},
		} {
			if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
				return fmt.Errorf("%v: %v: %s", args, err, out)
			}
		}
		return nil
	}
	d := newDriver(t, o)
	inst := create(t, d, "cknet", driver.Limits{})
	defer inst.Destroy(context.Background())
	startCounter(t, inst)
	time.Sleep(500 * time.Millisecond)
	img := t.TempDir()
	if err := inst.Checkpoint(testCtx(t), img); err != nil {
		t.Fatalf("checkpoint of a sandbox with a network: %v", err)
	}
	l, _ := inst.WritableLayer()
	saved := t.TempDir()
	if err := drivertest.CopyLayer(l.Dir, 0)(testCtx(t), driver.Layer{Dir: saved}); err != nil {
		t.Fatal(err)
	}
	if err := inst.Resume(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, inst, "grep -c eth0: /proc/net/dev"); got != "1" {
		t.Errorf("the checkpointed sandbox's interfaces after the checkpoint: eth0 %q times", got)
	}
	nCk := readN(t, inst)
	re, err := d.Restore(testCtx(t), driver.Spec{ID: "cknet-re", RootfsDir: rootfs, InitLayer: drivertest.CopyLayer(saved, l.UIDBase)}, img)
	if err != nil {
		t.Fatalf("restore of a sandbox with a network: %v", err)
	}
	defer re.Destroy(context.Background())
	mu.Lock()
	n := hooked["cknet-re"]
	mu.Unlock()
	if n != 1 {
		t.Errorf("network hook ran %d times for the restored sandbox", n)
	}
	if got := mustSh(t, re, "grep -c eth0: /proc/net/dev"); got != "1" {
		t.Errorf("restored sandbox: eth0 %q times", got)
	}
	if got := mustSh(t, re, "grep -c '10.250.0.2$' /proc/net/fib_trie"); got == "0" {
		t.Errorf("restored sandbox has not the hook's address")
	}
	if got := mustSh(t, re, "grep -c '127.0.0.1$' /proc/net/fib_trie"); got == "0" {
		t.Errorf("restored sandbox's loopback has no address")
	}
	n1 := readN(t, re)
	time.Sleep(300 * time.Millisecond)
	if n2 := readN(t, re); n1 < nCk || n2 <= n1 {
		t.Errorf("restored counter %d then %d (%d at the checkpoint): restarted or stopped", n1, n2, nCk)
	}
}
