package snapshot_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/criu"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/test/testenv"
)

// gvEnv is a second `space server`, with --driver gvisor, started on
// first use and stopped by TestMain when the package's tests end.
var (
	gvOnce sync.Once
	gvEnv  *env
	gvErr  error
	gvSkip string
)

func needGvisor(t testing.TB) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	gvOnce.Do(func() {
		runsc, err := gvisor.FindRunsc(os.Getenv("SPACE_RUNSC"))
		if err != nil {
			gvSkip = "runsc unavailable (build it with scripts/runsc.sh or set SPACE_RUNSC): " + err.Error()
			return
		}
		srv, err := testenv.New("space-gv-")
		if srv != nil {
			gvEnv = &env{Server: srv} // TestMain stops and removes it
		}
		if err != nil {
			gvErr = err
			return
		}
		srv.Driver = "gvisor"
		srv.Args = []string{"--builtins", "minimal", "--runsc", runsc}
		if gvErr = gvEnv.Start(); gvErr != nil {
			return
		}
		if gvEnv.key, gvErr = gvEnv.CreateKey("p1"); gvErr != nil {
			return
		}
		gvErr = gvEnv.WaitTemplate(gvEnv.key, "minimal", 2*time.Minute)
	})
	if gvSkip != "" {
		t.Skip(gvSkip)
	}
	if gvErr != nil {
		if gvEnv != nil {
			t.Logf("server log:\n%s", gvEnv.LogTail(20000))
		}
		t.Fatalf("gvisor server: %v", gvErr)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- gvisor server log (tail) ----\n%s", gvEnv.LogTail(20000))
		}
	})
	return gvEnv
}

// stopGvisor deletes what the gvisor server still runs, stops it and
// removes its directories.
func stopGvisor() {
	if gvEnv == nil {
		return
	}
	if gvEnv.Ctrl != "" && gvEnv.key != "" {
		_, m, _ := gvEnv.call("GET", "/v1/sandboxes", nil)
		items, _ := m["sandboxes"].([]any)
		for _, it := range items {
			id := str(it.(map[string]any), "id")
			if _, m, _ := gvEnv.call("DELETE", "/v1/sandboxes/"+id, nil); m != nil {
				if op := str(m, "operation", "id"); op != "" {
					gvEnv.call("GET", "/v1/operations/"+op+"?wait=30s", nil)
				}
			}
		}
	}
	gvEnv.Stop()
	gvEnv.Remove()
}

// counterScript starts a shell that counts ten times a second into
// /root/count; it records its own pid in /root/pid.
const counterScript = `sh -c 'echo $$ > /root/pid; i=0; while true; do i=$((i+1)); echo $i > /root/count; sleep 0.1; done' >/dev/null 2>&1 &
sleep 0.3; cat /root/pid`

// workTree describes /work exactly (treeScript also covers /root, where
// the counter writes).
const workTree = `cd / && find work | sort | while read -r f; do stat -c '%n %F %a %u %g %s %Y %N' "$f"; done; find work -type f | sort | xargs sha256sum`

// count reads the counter and the counting process's state: its pid (from
// /root/pid) and whether that pid is alive and a shell.
func (sb *sandbox) count(t *testing.T) (n int, pid string) {
	t.Helper()
	var out string
	var f []string
	// The counter truncates before it writes: a read may catch it empty.
	for range 20 {
		out = sb.ok(t, `p=$(cat /root/pid); c=$(cat /root/count); if kill -0 $p 2>/dev/null && grep -q sh /proc/$p/cmdline; then echo "$c $p"; else echo "$c dead"; fi`)
		if f = strings.Fields(out); len(f) == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(f) != 2 {
		t.Fatalf("count: %q", out)
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatalf("count: %q", out)
	}
	return n, f[1]
}

// waitAdvance checks the same process keeps counting.
func (sb *sandbox) waitAdvance(t *testing.T, label string, from int, pid string) int {
	t.Helper()
	for i := 0; i < 50; i++ {
		n, p := sb.count(t)
		if p != pid {
			t.Fatalf("%s: the counting process is %s, want pid %s", label, p, pid)
		}
		if n > from {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: the count stays at %d", label, from)
	return 0
}

// TestGvisorProcessSnapshot: a process snapshot of a gVisor sandbox: a
// counting process is
// snapshotted (the source keeps counting), the source is deleted and the
// server restarted on the same data dir; a restore (fork of one) and two
// more forks each continue the count from where the snapshot stopped it,
// in the same process (same pid), with the files intact and each in its
// own sandbox. Hibernate and resume keep the process too.
func TestGvisorProcessSnapshot(t *testing.T) { testProcessSnapshot(t, needGvisor(t), "gvisor") }

// TestNamespaceProcessSnapshot is the same on the namespace driver, whose
// checkpoints are CRIU's (skipped without scripts/criu.sh's build).
func TestNamespaceProcessSnapshot(t *testing.T) {
	e := need(t)
	if _, _, err := criu.ProbeSandboxes(context.Background(), ""); err != nil {
		t.Skipf("no CRIU for the namespace driver: %v", err)
	}
	testProcessSnapshot(t, e, "namespace")
}

// testProcessSnapshot: a process snapshot of a sandbox running a counter
// keeps the source going; after a server restart, a restore and two forks
// continue the snapshot's process (same pid inside) with its files, each
// its own sandbox; hibernate and resume continue it in the same id.
func testProcessSnapshot(t *testing.T, e *env, drv string) {
	sb := e.create(t, map[string]any{"timeout_seconds": 600})
	sb.ok(t, `mkdir -p /work/d && echo small > /work/small && dd if=/dev/urandom of=/work/big bs=1M count=3 2>/dev/null && ln -s small /work/link && echo x > /work/d/x`)
	before := sb.ok(t, workTree)
	pid := strings.TrimSpace(sb.ok(t, counterScript))
	c0 := sb.waitAdvance(t, "source", 0, pid)

	_, done := e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", nil)
	res := done["result"].(map[string]any)
	snapID := str(res, "id")
	if res["kind"] != "process" || !strings.HasPrefix(str(res, "processes"), "captured") ||
		num(res, "stats", "process_image_bytes") <= 0 || str(res, "stats", "process_driver") != drv {
		t.Fatalf("snapshot: %v", res)
	}
	// The source continues at once, same process, its agent answering.
	c1, _ := sb.count(t)
	c1 = sb.waitAdvance(t, "source after snapshot", c1, pid)
	if c1 < c0 {
		t.Fatalf("source went back from %d to %d", c0, c1)
	}
	// Let the source run well past the snapshot: a restore that continued
	// from the source's latest count instead would show.
	time.Sleep(4 * time.Second)
	cLate, _ := sb.count(t)
	sb.delete(t)

	e.Stop()
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	if got := e.must(t, 200, "GET", "/v1/snapshots/"+snapID, nil); got["kind"] != "process" {
		t.Fatalf("snapshot after restart: %v", got)
	}

	var forks []*sandbox
	for _, n := range []int{1, 2} { // a restore, then two forks at once
		m := e.must(t, 202, "POST", "/v1/snapshots/"+snapID+"/fork", map[string]any{"count": n})
		if !strings.HasPrefix(str(m, "processes"), "restored") {
			t.Fatalf("fork answer: %v", m)
		}
		for _, it := range m["sandboxes"].([]any) {
			item := it.(map[string]any)
			if done := e.waitOp(t, str(item, "operation", "id")); done["state"] != "succeeded" {
				t.Fatalf("fork: %v", done)
			}
			forks = append(forks, sessionSandbox(e, item))
		}
	}
	ids := map[string]bool{}
	for i, f := range forks {
		t.Cleanup(func() { f.delete(t) })
		ids[f.ID] = true
		n, p := f.count(t)
		if p != pid || n < c0 || n >= cLate {
			t.Fatalf("fork %d: count %d in process %s; want the snapshot's process %s at %d..%d", i, n, p, pid, c0, cLate-1)
		}
		f.waitAdvance(t, "fork", n, pid)
		if after := f.ok(t, workTree); after != before {
			t.Fatalf("fork %d: files differ:\n%s\n----\n%s", i, before, after)
		}
	}
	if len(ids) != 3 {
		t.Fatalf("forks share sandboxes: %v", ids)
	}
	// Each fork is its own sandbox: a file one writes is not in another.
	forks[1].ok(t, "echo mine > /work/only1")
	if out, code := forks[2].sh(t, "cat /work/only1"); code == 0 {
		t.Fatalf("fork 2 sees fork 1's file: %q", out)
	}

	// Hibernate and resume: the process continues in the same id.
	h := forks[0]
	hc, _ := h.count(t)
	_, done = e.op(t, "POST", "/v1/sandboxes/"+h.ID+"/hibernate", nil)
	if p := str(done, "result", "processes"); !strings.HasPrefix(p, "captured") {
		t.Fatalf("hibernate: %v", done)
	}
	_, done = e.op(t, "POST", "/v1/sandboxes/"+h.ID+"/resume", nil)
	if p := str(done, "result", "processes"); !strings.HasPrefix(p, "captured") {
		t.Fatalf("resume: %v", done)
	}
	n, p := h.count(t)
	if p != pid || n < hc {
		t.Fatalf("after hibernate: count %d (was %d) in process %s", n, hc, p)
	}
	h.waitAdvance(t, "after hibernate", n, pid)
	t.Logf("count at snapshot %d..%d, source later %d; forks continued from there", c0, c1, cLate)
}

// BenchmarkGvisorProcessSnapshot measures process snapshots through the
// API of a real server (--driver gvisor): the snapshot operation
// (checkpoint, layer and image chunked into the store) and a fork of it
// (image and layer materialised, runsc restore, agent configured), for a
// sandbox holding 64 MiB of random data in memory (/dev/shm) and a
// counting process. The first snapshot stores the whole image; the later
// ones only chunks that changed (stored-MiB is their average).
func BenchmarkGvisorProcessSnapshot(b *testing.B) {
	e := needGvisor(b)
	sb := e.create(b, map[string]any{"timeout_seconds": 600, "limits": map[string]any{"memory_bytes": 512 << 20}})
	defer sb.delete(b)
	sb.ok(b, `dd if=/dev/urandom of=/dev/shm/m bs=1M count=64 2>/dev/null`)
	sb.ok(b, counterScript)
	var snap, fork time.Duration
	var ckMS, frozenMS, image, stored, firstStored float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		_, done := e.op(b, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", nil)
		snap += time.Since(t0)
		res := done["result"].(map[string]any)
		if res["kind"] != "process" {
			b.Fatalf("snapshot: %v", res)
		}
		ckMS += num(res, "stats", "checkpoint_ms")
		frozenMS += num(res, "stats", "frozen_ms")
		image = num(res, "stats", "process_image_bytes")
		if i == 0 {
			firstStored = num(res, "stats", "bytes_stored")
		} else {
			stored += num(res, "stats", "bytes_stored")
		}
		t1 := time.Now()
		m := e.must(b, 202, "POST", "/v1/snapshots/"+str(res, "id")+"/fork", map[string]any{"count": 1})
		item := m["sandboxes"].([]any)[0].(map[string]any)
		if done := e.waitOp(b, str(item, "operation", "id")); done["state"] != "succeeded" {
			b.Fatalf("fork: %v", done)
		}
		fork += time.Since(t1)
		b.StopTimer()
		sessionSandbox(e, item).delete(b)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(snap.Milliseconds())/n, "snapshot-ms")
	b.ReportMetric(ckMS/n, "checkpoint-ms")
	b.ReportMetric(frozenMS/n, "frozen-ms")
	b.ReportMetric(float64(fork.Milliseconds())/n, "fork-ms")
	b.ReportMetric(image/(1<<20), "image-MiB")
	b.ReportMetric(firstStored/(1<<20), "first-stored-MiB")
	if b.N > 1 {
		b.ReportMetric(stored/(n-1)/(1<<20), "stored-MiB")
	}
}

// commandState returns whether a command runs and its last event id.
func (sb *sandbox) commandState(t *testing.T, cid string) (bool, float64) {
	t.Helper()
	st, m, err := sb.dp("GET", "/commands/"+cid, nil)
	if err != nil || st != 200 {
		t.Fatalf("get command %s: %d %v %v", cid, st, m, err)
	}
	return m["running"] == true, num(m, "last_event_id")
}

// TestGvisorSnapshotKeepsCommands: a process snapshot of a paused sandbox
// leaves it paused; a command that ran through it is still followed (its
// output recorded) after resume; a fork runs the command on and records
// its output too.
func TestGvisorSnapshotKeepsCommands(t *testing.T) { testSnapshotKeepsCommands(t, needGvisor(t)) }

// TestNamespaceSnapshotKeepsCommands is the same on the namespace driver
// with CRIU: the agent owns the commands' output, and the node follows
// them again once the agent listens after the checkpoint or the restore.
func TestNamespaceSnapshotKeepsCommands(t *testing.T) {
	e := need(t)
	if _, _, err := criu.ProbeSandboxes(context.Background(), ""); err != nil {
		t.Skipf("no CRIU for the namespace driver: %v", err)
	}
	testSnapshotKeepsCommands(t, e)
}

func testSnapshotKeepsCommands(t *testing.T, e *env) {
	sb := e.create(t, map[string]any{"timeout_seconds": 600})
	defer sb.delete(t)
	cid := sb.start(t, `i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.1; done`)
	time.Sleep(500 * time.Millisecond)
	_, seq0 := sb.commandState(t, cid)
	e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil)
	_, done := e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", nil)
	snapID := str(done, "result", "id")
	if str(done, "result", "kind") != "process" {
		t.Fatalf("snapshot: %v", done)
	}
	// Longer than the node's readers retry a lost agent connection.
	time.Sleep(2 * time.Second)
	if got := e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil); got["state"] != "paused" {
		t.Fatalf("after a snapshot of a paused sandbox: %v", got)
	}
	e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil)
	var running bool
	var seq float64
	for i := 0; i < 50; i++ {
		if running, seq = sb.commandState(t, cid); !running || seq > seq0+2 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !running || seq <= seq0+2 {
		t.Fatalf("command after snapshot and resume: running %v, last event %v (was %v)", running, seq, seq0)
	}

	m := e.must(t, 202, "POST", "/v1/snapshots/"+snapID+"/fork", map[string]any{"count": 1})
	item := m["sandboxes"].([]any)[0].(map[string]any)
	if done := e.waitOp(t, str(item, "operation", "id")); done["state"] != "succeeded" {
		t.Fatalf("fork: %v", done)
	}
	f := sessionSandbox(e, item)
	defer f.delete(t)
	running, first := f.commandState(t, cid)
	for i := 0; i < 50 && running; i++ {
		if running, seq = f.commandState(t, cid); seq > first+2 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !running || seq <= first+2 {
		t.Fatalf("the fork's copy of the command: running %v, last event %v then %v", running, first, seq)
	}
}

// A sandbox whose state gVisor cannot save (here a second agent that a
// process in it started, listening on a host-backed socket) still gets a
// snapshot, of its files, that says why the processes are not in it; the
// sandbox runs on and its agent answers.
func TestGvisorCheckpointFailureFallsBack(t *testing.T) {
	e := needGvisor(t)
	sb := e.create(t, map[string]any{"timeout_seconds": 600})
	defer sb.delete(t)
	sb.ok(t, `echo kept > /root/f; /.space/agent agent --listen /.space/run/extra.sock >/dev/null 2>&1 & sleep 0.5`)
	_, done := e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", nil)
	res := done["result"].(map[string]any)
	if res["kind"] != "filesystem" || !strings.Contains(str(res, "processes"), "checkpoint failed") || str(res, "stats", "process_not_captured") == "" {
		t.Fatalf("snapshot of an uncheckpointable sandbox: %v", res)
	}
	t.Logf("processes: %s", str(res, "processes"))
	if out := sb.ok(t, "cat /root/f"); out != "kept\n" {
		t.Fatalf("after the failed checkpoint: %q", out)
	}
	m := e.must(t, 202, "POST", "/v1/snapshots/"+str(res, "id")+"/fork", map[string]any{"count": 1})
	item := m["sandboxes"].([]any)[0].(map[string]any)
	if done := e.waitOp(t, str(item, "operation", "id")); done["state"] != "succeeded" {
		t.Fatalf("fork: %v", done)
	}
	f := sessionSandbox(e, item)
	defer f.delete(t)
	if out := f.ok(t, "cat /root/f; ls /.space/run"); out != "kept\nagent.sock\n" {
		t.Fatalf("fork of the filesystem snapshot: %q", out)
	}
}
