package snapshot_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func counterValue(t *testing.T, sb *sandbox) int {
	t.Helper()
	// The loop rewrites the file (truncate, then write): a read can land
	// in between and see it empty, so read again.
	// On a loaded host the loop may sit between the two for a while (CI
	// once read it empty 20 times in 100 ms): keep trying for 3 s.
	var err error
	for deadline := time.Now().Add(3 * time.Second); ; {
		var n int
		if n, err = strconv.Atoi(strings.TrimSpace(sb.ok(t, "cat /tmp/counter"))); err == nil {
			return n
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("counter: %v", err)
	return 0
}

// A paused sandbox runs nothing, keeps its files byte for byte, stops its
// timeout clock and refuses the data plane; resume continues it.
func TestPauseResume(t *testing.T) {
	e := need(t)
	sb := e.create(t, map[string]any{"timeout_seconds": 600})
	defer sb.delete(t)
	sb.ok(t, `mkdir -p /work && echo small > /work/small && dd if=/dev/urandom of=/work/big bs=1M count=200 2>/dev/null`)
	before := sb.ok(t, "sha256sum /work/small /work/big")
	sb.start(t, `i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.02; done`)
	time.Sleep(200 * time.Millisecond)

	c0 := counterValue(t, sb)
	t0 := time.Now()
	_, done := e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil)
	pauseLat := time.Since(t0)
	res := done["result"].(map[string]any)
	if res["state"] != "paused" || res["expires_at"] != nil || num(res, "paused_remaining_ms") < 590000 {
		t.Fatalf("paused sandbox: %v", res)
	}
	// The data plane refuses a paused sandbox (it never hangs on it).
	if st, m, err := sb.dp("POST", "/commands", map[string]any{"shell": "true"}); err != nil || st != 409 || str(m, "error", "code") != "sandbox_paused" {
		t.Fatalf("command on a paused sandbox: %d %v %v, want 409 sandbox_paused", st, m, err)
	}
	// Pausing again is a no-op; its timeout can change while paused.
	e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil)
	time.Sleep(time.Second)
	t1 := time.Now()
	_, done = e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil)
	resumeLat := time.Since(t1)
	res = done["result"].(map[string]any)
	exp, _ := time.Parse(time.RFC3339Nano, str(res, "expires_at"))
	if res["state"] != "running" || time.Until(exp) < 590*time.Second {
		t.Fatalf("resumed sandbox (the clock must have stopped): %v", res)
	}
	c1 := counterValue(t, sb)
	// 1 s paused at a 20 ms tick would be ~50 ticks.
	if c1-c0 > 15 {
		t.Fatalf("counter advanced by %d while paused", c1-c0)
	}
	time.Sleep(300 * time.Millisecond)
	if c2 := counterValue(t, sb); c2 <= c1 {
		t.Fatalf("counter did not continue after resume: %d then %d", c1, c2)
	}
	if after := sb.ok(t, "sha256sum /work/small /work/big"); after != before {
		t.Fatalf("files changed across pause:\n%s\n%s", before, after)
	}
	if st, _, _ := e.call("POST", "/v1/sandboxes/"+sb.ID+"/resume", nil); st != 202 {
		t.Fatalf("resume of a running sandbox: %d", st)
	}
	t.Logf("pause %v, resume %v (API round trip incl. operation wait); counter %d → %d across 1 s paused", pauseLat, resumeLat, c0, c1)
}

// Three snapshots with small changes in between store roughly only the
// change; each restores exactly its state; forks are independent; a
// snapshot with children is retained when deleted until they go; GC
// reclaims unreferenced data.
func TestSnapshotChainForkRetention(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	sb.ok(t, `mkdir -p /work/d && dd if=/dev/urandom of=/work/base.bin bs=1M count=20 2>/dev/null &&
		echo hello > /work/d/a && ln -s d/a /work/link && ln /work/d/a /work/hard && chmod 4750 /work/d/a && chown 1000:1000 /work/hard &&
		rm /etc/hostname && rm -rf /root && mkdir /root && echo only > /root/only && mkfifo /work/fifo`)
	snap := func(label string) (string, map[string]any) {
		m, done := e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", nil)
		id := str(m, "snapshot", "id")
		st := done["result"].(map[string]any)
		t.Logf("%s: %s parent=%q bytes_stored=%.0f (chunks %.0f B + manifest %.0f B) logical=%.0f read=%.0f changed=%.0f frozen=%.0fms",
			label, id, str(st, "parent_id"), num(st, "stats", "bytes_stored"), num(st, "stats", "chunk_bytes"), num(st, "stats", "manifest_bytes"),
			num(st, "stats", "logical_bytes"), num(st, "stats", "bytes_read"), num(st, "stats", "changed"), num(st, "stats", "frozen_ms"))
		return id, st
	}
	tree1 := sb.tree(t)
	s1, st1 := snap("snapshot 1")
	sb.ok(t, `echo more >> /work/d/a && echo new > /work/d/b && rm /work/link && mkdir /work/e`)
	tree2 := sb.tree(t)
	s2, st2 := snap("snapshot 2")
	sb.ok(t, `dd if=/dev/urandom of=/work/base.bin bs=1k count=1 seek=5000 conv=notrunc 2>/dev/null && rm -rf /work/e && echo x > /etc/extra`)
	tree3 := sb.tree(t)
	s3, st3 := snap("snapshot 3")
	if num(st1, "stats", "bytes_stored") < 20<<20 {
		t.Fatalf("first snapshot stored %v bytes, want ≥ 20 MiB", num(st1, "stats", "bytes_stored"))
	}
	for i, st := range []map[string]any{st2, st3} {
		// The files' part: a process image (the namespace driver with
		// CRIU) is stored whole for now (issue #27).
		if b := num(st, "stats", "bytes_stored") - num(st, "stats", "process_chunk_bytes"); b > 1.1*(1<<20) {
			t.Fatalf("snapshot %d stored %.0f bytes for a change of ~1 KiB", i+2, b)
		}
	}
	if str(st2, "parent_id") != s1 || str(st3, "parent_id") != s2 {
		t.Fatalf("chain: %s ← %s ← %s: %q %q", s1, s2, s3, str(st2, "parent_id"), str(st3, "parent_id"))
	}
	// The source keeps running (and was only frozen while captured).
	sb.ok(t, "true")

	fork := func(snapID string, count int) []*sandbox {
		m := e.must(t, 202, "POST", "/v1/snapshots/"+snapID+"/fork", map[string]any{"count": count})
		// Processes come back only from a process snapshot (the
		// namespace driver with CRIU).
		process := str(e.must(t, 200, "GET", "/v1/snapshots/"+snapID, nil), "kind") == "process"
		if p := str(m, "processes"); strings.Contains(p, "not restored") == process || (process && !strings.Contains(p, "restored")) {
			t.Fatalf("fork answer (process snapshot: %v) says %q: %v", process, p, m)
		}
		var out []*sandbox
		for _, raw := range m["sandboxes"].([]any) {
			item := raw.(map[string]any)
			if done := e.waitOp(t, str(item, "operation", "id")); done["state"] != "succeeded" {
				t.Fatalf("fork: %v", done)
			}
			out = append(out, sessionSandbox(e, item))
		}
		return out
	}
	for i, c := range []struct {
		id, want string
	}{{s1, tree1}, {s2, tree2}, {s3, tree3}} {
		r := fork(c.id, 1)[0]
		if got := r.tree(t); got != c.want {
			t.Fatalf("restore of snapshot %d differs:\n got:\n%s\nwant:\n%s", i+1, got, c.want)
		}
		r.delete(t)
	}

	t0 := time.Now()
	forks := fork(s3, 10)
	t.Logf("fork ×10 from %s: all running in %v", s3, time.Since(t0))
	var wg sync.WaitGroup
	for i, f := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := f.tree(t); got != tree3 {
				t.Errorf("fork %d does not see the snapshot:\n got:\n%s\nwant:\n%s", i, got, tree3)
			}
			f.ok(t, fmt.Sprintf("echo %d > /work/mine-%d", i, i))
		}()
	}
	wg.Wait()
	for i, f := range forks {
		if out := f.ok(t, "ls /work"); strings.Count(out, "mine-") != 1 || !strings.Contains(out, fmt.Sprintf("mine-%d", i)) {
			t.Fatalf("fork %d sees others' writes: %s", i, out)
		}
	}
	if out := sb.ok(t, "ls /work"); strings.Contains(out, "mine-") {
		t.Fatalf("the source sees a fork's write: %s", out)
	}
	for _, f := range forks {
		f.delete(t)
	}

	// Retention: a parent may go before its child; it is retained
	// (hidden, its data kept) until the child goes; GC reclaims then.
	_, g2 := e.op(t, "DELETE", "/v1/snapshots/"+s2, nil)
	if st, _, _ := e.call("GET", "/v1/snapshots/"+s2, nil); st != 404 {
		t.Fatalf("deleted snapshot with a child answers %d", st)
	}
	list := e.must(t, 200, "GET", "/v1/snapshots?sandbox_id="+sb.ID, nil)
	if n := len(list["snapshots"].([]any)); n != 2 {
		t.Fatalf("list: %d snapshots, want 2", n)
	}
	if got := fork(s3, 1)[0]; got.tree(t) != tree3 {
		t.Fatal("snapshot 3 broken by deleting its parent")
	} else {
		got.delete(t)
	}
	_, g3 := e.op(t, "DELETE", "/v1/snapshots/"+s3, nil)
	t.Logf("gc after deleting snapshot 2: %v; after 3 (and with it 2): %v", g2["result"], g3["result"])
	if num(g3, "result", "chunks_removed") < 1 {
		t.Fatalf("deleting snapshot 3 freed no chunk: %v", g3["result"])
	}
	for _, id := range []string{s2, s3} {
		if st, _, _ := e.call("GET", "/v1/snapshots/"+id, nil); st != 404 {
			t.Fatalf("deleted snapshot answers %d", st)
		}
	}
	if got := fork(s1, 1)[0]; got.tree(t) != tree1 {
		t.Fatal("snapshot 1 broken by deleting its descendants")
	} else {
		got.delete(t)
	}
	e.op(t, "DELETE", "/v1/snapshots/"+s1, nil)
}

// chunkFiles lists the store's chunks.
func chunkFiles(t *testing.T, e *env) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	matches, _ := filepath.Glob(filepath.Join(e.DataDir, "snapshots", "chunks", "*", "*"))
	for _, m := range matches {
		out[filepath.Base(m)] = true
	}
	return out
}

// kill -9 during a snapshot and during a fork: after restart each operation
// is failed or completed, never half-done; no chunk of a ready snapshot is
// lost and none of the interrupted one is left; the source sandbox runs.
func TestCrashDuringSnapshotAndFork(t *testing.T) {
	e := need(t)
	// Other tests of the package may keep snapshots in the same store:
	// what this test must leave is what was there before it.
	before := chunkFiles(t, e)
	sb := e.create(t, nil)
	sb.ok(t, `mkdir -p /work && dd if=/dev/urandom of=/work/big bs=1M count=200 2>/dev/null`)
	m, _ := e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", nil)
	good := str(m, "snapshot", "id")
	sb.ok(t, `dd if=/dev/urandom of=/work/big2 bs=1M count=200 2>/dev/null`)
	// Deleting nothing runs a GC: the store then holds exactly the chunks
	// of the ready snapshot.
	baseline := chunkFiles(t, e)

	m = e.must(t, 202, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", nil)
	crashed, opID := str(m, "snapshot", "id"), str(m, "operation", "id")
	time.Sleep(300 * time.Millisecond)
	e.Kill9()
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	op := e.must(t, 200, "GET", "/v1/operations/"+opID, nil)
	snap := e.must(t, 200, "GET", "/v1/snapshots/"+crashed, nil)
	switch {
	case op["state"] == "failed" && snap["state"] == "failed":
		after := chunkFiles(t, e)
		for c := range baseline {
			if !after[c] {
				t.Fatalf("chunk %s of the ready snapshot lost", c)
			}
		}
		if len(after) != len(baseline) {
			t.Fatalf("interrupted snapshot leaked chunks: %d after, %d before", len(after), len(baseline))
		}
		t.Logf("snapshot interrupted by kill -9: operation and snapshot failed, %d chunks kept, none leaked", len(after))
	case op["state"] == "succeeded" && snap["state"] == "ready":
		t.Logf("snapshot finished before the kill")
	default:
		t.Fatalf("after a crash: operation %v, snapshot %v", op["state"], snap["state"])
	}
	// The source was frozen mid-capture: it was thawed and re-adopted.
	if got := e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil); got["state"] != "running" {
		t.Fatalf("source after restart: %v", got)
	}
	sb.ok(t, "test -s /work/big2")

	// A fork interrupted by kill -9 fails and leaves nothing behind.
	m = e.must(t, 202, "POST", "/v1/snapshots/"+good+"/fork", map[string]any{"count": 1})
	item := m["sandboxes"].([]any)[0].(map[string]any)
	forkID, forkOp := str(item, "sandbox", "id"), str(item, "operation", "id")
	time.Sleep(150 * time.Millisecond)
	e.Kill9()
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	op = e.must(t, 200, "GET", "/v1/operations/"+forkOp, nil)
	fsb := e.must(t, 200, "GET", "/v1/sandboxes/"+forkID, nil)
	switch {
	case op["state"] == "failed" && fsb["state"] == "failed":
		if _, err := os.Stat(filepath.Join(e.DataDir, "sandboxes", forkID)); !os.IsNotExist(err) {
			t.Fatalf("interrupted fork left its state dir: %v", err)
		}
		t.Logf("fork interrupted by kill -9: operation and sandbox failed, nothing left")
	case op["state"] == "succeeded" && fsb["state"] == "running":
		t.Logf("fork finished before the kill")
		(&sandbox{e: e, ID: forkID}).delete(t)
	default:
		t.Fatalf("fork after a crash: operation %v, sandbox %v", op["state"], fsb["state"])
	}
	if got := chunkFiles(t, e); len(got) < len(baseline) {
		t.Fatalf("chunks lost: %d < %d", len(got), len(baseline))
	}
	sb.delete(t)
	e.op(t, "DELETE", "/v1/snapshots/"+good, nil)
	got := chunkFiles(t, e)
	for c := range got {
		if !before[c] {
			t.Fatalf("%d chunks left after deleting every snapshot of this test (%d before it), %s among them", len(got), len(before), c)
		}
	}
}
