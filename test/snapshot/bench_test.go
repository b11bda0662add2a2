package snapshot_test

import (
	"fmt"
	"os"
	"sort"
	"testing"
	"time"
)

func pct(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p * float64(len(s)-1))
	return s[i]
}

// TestBenchSnapshots measures pause/resume latency, snapshot time and
// bytes stored against bytes changed on a 1 GiB tree, and fork latency.
// Opt in with SPACE_SNAPSHOT_BENCH=1 (it writes ~2 GiB and takes minutes).
func TestBenchSnapshots(t *testing.T) {
	if os.Getenv("SPACE_SNAPSHOT_BENCH") != "1" {
		t.Skip("set SPACE_SNAPSHOT_BENCH=1")
	}
	e := need(t)
	sb := e.create(t, map[string]any{"limits": map[string]any{"memory_bytes": 2 << 30}})
	defer sb.delete(t)

	var pause, resume []time.Duration
	for i := 0; i < 20; i++ {
		t0 := time.Now()
		e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil)
		pause = append(pause, time.Since(t0))
		t0 = time.Now()
		e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil)
		resume = append(resume, time.Since(t0))
	}
	fmt.Printf("pause  p50 %v p99 %v (API: POST + operation wait)\n", pct(pause, .5), pct(pause, .99))
	fmt.Printf("resume p50 %v p99 %v\n", pct(resume, .5), pct(resume, .99))

	// 1 GiB tree: 1024 files of 1 MiB in 32 dirs.
	sb.ok(t, `for d in $(seq 1 32); do mkdir -p /work/$d; for f in $(seq 1 32); do head -c 1048576 /dev/urandom > /work/$d/$f; done; done`)
	snap := func(label string) string {
		t0 := time.Now()
		m, done := e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", nil)
		took := time.Since(t0)
		st := done["result"].(map[string]any)
		fmt.Printf("%-22s %8.0f ms  stored %12.0f B  read %12.0f B  frozen %6.0f ms  changed %5.0f entries\n", label, float64(took.Milliseconds()),
			num(st, "stats", "bytes_stored"), num(st, "stats", "bytes_read"), num(st, "stats", "frozen_ms"), num(st, "stats", "changed"))
		return str(m, "snapshot", "id")
	}
	base := snap("initial (1 GiB tree)")
	snap("no change")
	for _, mb := range []int{1, 10, 100} {
		sb.ok(t, fmt.Sprintf(`for i in $(seq 1 %d); do head -c 1048576 /dev/urandom > /work/$(( (i %% 32) + 1 ))/$(( (i / 32) + 1 )); done`, mb))
		snap(fmt.Sprintf("%d MiB changed", mb))
	}

	var fork []time.Duration
	for i := 0; i < 10; i++ {
		t0 := time.Now()
		m := e.must(t, 202, "POST", "/v1/snapshots/"+base+"/fork", map[string]any{"count": 1})
		item := m["sandboxes"].([]any)[0].(map[string]any)
		if done := e.waitOp(t, str(item, "operation", "id")); done["state"] != "succeeded" {
			t.Fatalf("fork: %v", done)
		}
		fork = append(fork, time.Since(t0))
		sessionSandbox(e, item).delete(t)
	}
	fmt.Printf("fork of the 1 GiB snapshot (restore 1 GiB + start): p50 %v p99 %v\n", pct(fork, .5), pct(fork, .99))

	small := e.create(t, nil)
	small.ok(t, "mkdir /work && echo hi > /work/f")
	m, _ := e.op(t, "POST", "/v1/sandboxes/"+small.ID+"/snapshots", nil)
	sid := str(m, "snapshot", "id")
	fork = fork[:0]
	for i := 0; i < 20; i++ {
		t0 := time.Now()
		m := e.must(t, 202, "POST", "/v1/snapshots/"+sid+"/fork", map[string]any{"count": 1})
		item := m["sandboxes"].([]any)[0].(map[string]any)
		e.waitOp(t, str(item, "operation", "id"))
		fork = append(fork, time.Since(t0))
		sessionSandbox(e, item).delete(t)
	}
	fmt.Printf("fork of a small snapshot: p50 %v p99 %v\n", pct(fork, .5), pct(fork, .99))
	small.delete(t)
}
