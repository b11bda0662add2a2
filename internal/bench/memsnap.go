package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// MemSnapConfig sizes the memory-snapshot part (RunDrivers, for a driver
// whose snapshots hold processes and memory).
type MemSnapConfig struct {
	Runs       int   `json:"runs"`        // idle snapshots and hibernate→resume cycles
	DirtyBytes int64 `json:"dirty_bytes"` // memory dirtied before the "dirty" snapshot
	Forks      []int `json:"forks"`       // fork counts from one snapshot
}

// DefaultMemSnap is what `space bench --drivers` runs.
func DefaultMemSnap() MemSnapConfig {
	return MemSnapConfig{Runs: 5, DirtyBytes: 100 << 20, Forks: []int{20, 100}}
}

// MemSnapResult is the memory-snapshot part: every time is the API call
// until its operation succeeded (ms), with the server-side checkpoint and
// frozen times the snapshot reports, and the 1-minute load average of the
// host when the figure was taken (the machine may be shared).
type MemSnapResult struct {
	Kind string `json:"snapshot_kind"` // "process" when memory is captured
	// Idle: snapshots of an idle sandbox (a sleeping shell), each after
	// the previous one (so incremental).
	Idle           Summary `json:"snapshot_idle"`
	IdleCheckpoint Summary `json:"snapshot_idle_checkpoint_server_side"`
	IdleFrozen     Summary `json:"snapshot_idle_frozen_server_side"`
	IdleLoad       string  `json:"snapshot_idle_load"`
	// Dirty: one snapshot after a process read DirtyBytes of random
	// base64 text into its heap (the snapshot after the idle ones).
	DirtyMS     float64 `json:"snapshot_dirty_ms"`
	DirtyStored int64   `json:"snapshot_dirty_bytes_stored"`
	DirtyLoad   string  `json:"snapshot_dirty_load"`
	// Resume: hibernate (pause to disk: snapshot, release everything) then
	// resume, until the sandbox runs again.
	Resume     Summary `json:"resume_from_disk"`
	Hibernate  Summary `json:"hibernate"`
	ResumeLoad string  `json:"resume_load"`
	// Forks: POST /v1/snapshots/{id}/fork {"count": n} until every fork
	// runs, per n.
	Forks []ForkResult `json:"forks"`
	// Incremental storage: a sandbox holding DirtyBytes/2 (8..48 MiB) of
	// random data in /dev/shm (the sandbox's memory) is snapshotted, 5 % of its image is then rewritten in place,
	// and it is snapshotted again.
	ImageBytes   int64   `json:"image_bytes"`
	FirstStored  int64   `json:"first_snapshot_bytes_stored"`
	SecondStored int64   `json:"second_snapshot_bytes_stored"`
	SecondShare  float64 `json:"second_over_first"`
	ChangedBytes int64   `json:"changed_bytes"`
	StorageLoad  string  `json:"storage_load"`
}

// ForkResult is one fork count.
type ForkResult struct {
	Count  int     `json:"count"`
	MS     float64 `json:"ms"`
	Failed int     `json:"failed"`
	Load   string  `json:"load"`
}

func load1() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) > 0 {
		return f[0]
	}
	return ""
}

// lifecycle posts a lifecycle call that answers 202 with an operation and
// waits for it.
func (c *Client) lifecycle(ctx context.Context, path string, body any) (operation, error) {
	var ans struct {
		Operation operation `json:"operation"`
	}
	if err := c.do(ctx, http.MethodPost, c.base+path, c.key, body, http.StatusAccepted, &ans); err != nil {
		return operation{}, err
	}
	return c.waitOp(ctx, ans.Operation.ID)
}

// maxForkCount is the most forks one POST /v1/snapshots/{id}/fork asks.
const maxForkCount = 20

// ForkN starts n sandboxes from a snapshot (in requests of at most 20,
// all sent before waiting) and waits for them all; it returns their ids
// (to delete) and how many failed.
func (c *Client) ForkN(ctx context.Context, snapshotID string, n int) ([]string, int, error) {
	var all []sandboxAnswer
	for left := n; left > 0; left -= maxForkCount {
		var ans struct {
			Sandboxes []sandboxAnswer `json:"sandboxes"`
		}
		err := c.do(ctx, http.MethodPost, c.base+"/v1/snapshots/"+url.PathEscape(snapshotID)+"/fork", c.key,
			map[string]any{"count": min(left, maxForkCount)}, http.StatusAccepted, &ans)
		all = append(all, ans.Sandboxes...)
		if err != nil {
			ids := make([]string, len(all))
			for i, f := range all {
				ids[i] = f.Sandbox.ID
			}
			return ids, n - len(all), err
		}
	}
	ids := make([]string, len(all))
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, it := range all {
		ids[i] = it.Sandbox.ID
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.waitOp(ctx, it.Operation.ID)
		}()
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	return ids, failed, errors.Join(errs...)
}

// runMemSnap measures process snapshots: idle and dirty snapshot time,
// resume from disk, forks from one snapshot and the bytes a second
// snapshot stores. A driver whose snapshots hold files only is reported
// with its kind and nothing else.
func runMemSnap(ctx context.Context, env *Env, cfg MemSnapConfig) (_ *MemSnapResult, err error) {
	res := &MemSnapResult{}
	c := env.Client
	mem := cfg.DirtyBytes*2 + 256<<20
	sb, err := c.CreateWith(ctx, map[string]any{"template": ColdTemplate, "timeout_seconds": 3600, "limits": map[string]any{"memory_bytes": mem}})
	if err != nil {
		return res, err
	}
	defer func() {
		if derr := c.Delete(context.WithoutCancel(ctx), sb.ID); derr != nil && err == nil {
			err = derr
		}
	}()
	if _, err := c.StartCommand(ctx, sb, []string{"sh", "-c", "while true; do sleep 1; done"}); err != nil {
		return res, err
	}
	first, err := c.Snapshot(ctx, sb.ID)
	if err != nil {
		return res, fmt.Errorf("snapshot: %w", err)
	}
	if res.Kind = first.Kind; first.Kind != "process" {
		return res, nil
	}

	var idle, ck, frozen []time.Duration
	res.IdleLoad = load1()
	for i := 0; i < cfg.Runs; i++ {
		t0 := time.Now()
		info, err := c.Snapshot(ctx, sb.ID)
		if err != nil {
			return res, fmt.Errorf("idle snapshot: %w", err)
		}
		idle = append(idle, time.Since(t0))
		ck = append(ck, time.Duration(info.Stats.CheckpointMS*float64(time.Millisecond)))
		frozen = append(frozen, time.Duration(info.Stats.FrozenMS*float64(time.Millisecond)))
	}
	res.Idle, res.IdleCheckpoint, res.IdleFrozen = Summarize(idle), Summarize(ck), Summarize(frozen)

	if cfg.DirtyBytes > 0 {
		// A process (busybox awk) that reads DirtyBytes of base64 text
		// into its heap and holds it; /dev/shm is too small for 100 MB.
		holder := fmt.Sprintf(`echo $$ > /tmp/holder; exec awk 'BEGIN { c = "head -c %d /dev/urandom | base64"; while ((c | getline l) > 0) a[n++] = l; close(c); print n > "/tmp/held"; close("/tmp/held"); system("sleep 100000") }'`, cfg.DirtyBytes*3/4)
		if _, err := c.StartCommand(ctx, sb, []string{"sh", "-c", holder}); err != nil {
			return res, err
		}
		if _, err := exec1(ctx, env, sb, []string{"sh", "-c", "for i in $(seq 1200); do [ -s /tmp/held ] && exit 0; sleep 0.1; done; exit 1"}); err != nil {
			return res, fmt.Errorf("dirtying memory: %w", err)
		}
		res.DirtyLoad = load1()
		t0 := time.Now()
		info, err := c.Snapshot(ctx, sb.ID)
		if err != nil {
			return res, fmt.Errorf("dirty snapshot: %w", err)
		}
		res.DirtyMS, res.DirtyStored = ms(time.Since(t0)), info.Stats.BytesStored
		if _, err := exec1(ctx, env, sb, []string{"sh", "-c", "kill $(cat /tmp/holder); rm -f /tmp/held"}); err != nil {
			return res, err
		}
	}

	var hib, resume []time.Duration
	res.ResumeLoad = load1()
	for i := 0; i < cfg.Runs; i++ {
		t0 := time.Now()
		if _, err := c.lifecycle(ctx, "/v1/sandboxes/"+url.PathEscape(sb.ID)+"/hibernate", nil); err != nil {
			return res, fmt.Errorf("hibernate: %w", err)
		}
		t1 := time.Now()
		if _, err := c.lifecycle(ctx, "/v1/sandboxes/"+url.PathEscape(sb.ID)+"/resume", nil); err != nil {
			return res, fmt.Errorf("resume: %w", err)
		}
		hib, resume = append(hib, t1.Sub(t0)), append(resume, time.Since(t1))
	}
	res.Hibernate, res.Resume = Summarize(hib), Summarize(resume)
	if _, err := exec1(ctx, env, sb, trueArgv); err != nil {
		return res, fmt.Errorf("after resume: %w", err)
	}

	// Storage: data in memory, a snapshot, 5 % of the image rewritten in
	// place (scattered 64 KiB blocks), a second snapshot.
	hold := min(max(cfg.DirtyBytes/2, 8<<20), 48<<20) >> 20 // /dev/shm holds 64 MiB
	if _, err := exec1(ctx, env, sb, []string{"sh", "-c", fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/hold bs=1M count=%d 2>/dev/null", hold)}); err != nil {
		return res, err
	}
	res.StorageLoad = load1()
	s1, err := c.Snapshot(ctx, sb.ID)
	if err != nil {
		return res, err
	}
	res.ImageBytes, res.FirstStored = s1.Stats.ProcessImageBytes, s1.Stats.BytesStored
	blocks := max(s1.Stats.ProcessImageBytes/20>>16, 1)
	res.ChangedBytes = blocks << 16
	script := fmt.Sprintf(`n=%d; i=0; while [ $i -lt %d ]; do dd if=/dev/urandom of=/dev/shm/hold bs=64k count=1 seek=$(( (i * 7919) %% n )) conv=notrunc 2>/dev/null; i=$((i+1)); done`, hold*16, blocks)
	if _, err := exec1(ctx, env, sb, []string{"sh", "-c", script}); err != nil {
		return res, err
	}
	s2, err := c.Snapshot(ctx, sb.ID)
	if err != nil {
		return res, err
	}
	res.SecondStored = s2.Stats.BytesStored
	if res.FirstStored > 0 {
		res.SecondShare = float64(res.SecondStored) / float64(res.FirstStored)
	}

	// Forks of the idle sandbox.
	if _, err := exec1(ctx, env, sb, []string{"rm", "-f", "/dev/shm/hold"}); err != nil {
		return res, err
	}
	base, err := c.Snapshot(ctx, sb.ID)
	if err != nil {
		return res, err
	}
	for _, n := range cfg.Forks {
		fr := ForkResult{Count: n, Load: load1()}
		t0 := time.Now()
		ids, failed, ferr := c.ForkN(ctx, base.ID, n)
		fr.MS, fr.Failed = ms(time.Since(t0)), failed
		for _, id := range ids {
			if id != "" {
				if derr := c.Delete(context.WithoutCancel(ctx), id); derr != nil && ferr == nil {
					ferr = derr
				}
			}
		}
		res.Forks = append(res.Forks, fr)
		if ferr != nil {
			return res, fmt.Errorf("fork %d: %w", n, ferr)
		}
	}
	return res, nil
}

// writeMemSnapRows adds the memory-snapshot part to the comparison
// table, with the goals of issue 27 and CubeSandbox's published figures
// beside them.
func writeMemSnapRows(row func(string, func(DriverResult) string), sum func(*Summary) string) {
	m := func(f func(*MemSnapResult) string) func(DriverResult) string {
		return func(d DriverResult) string {
			if d.MemSnap == nil || d.MemSnap.Kind != "process" {
				return "—"
			}
			return f(d.MemSnap)
		}
	}
	row("memory snapshots: kind", func(d DriverResult) string {
		if d.MemSnap == nil {
			return "—"
		}
		return d.MemSnap.Kind
	})
	row("  snapshot idle (goal ≤ 50; CubeSandbox 46 with 7 MB dirty)", m(func(r *MemSnapResult) string {
		return sum(&r.Idle) + ", load " + r.IdleLoad
	}))
	row("    checkpoint / frozen (server stats)", m(func(r *MemSnapResult) string {
		return fmt.Sprintf("p50 %s / %s", fmtNum(r.IdleCheckpoint.P50), fmtNum(r.IdleFrozen.P50))
	}))
	row("  snapshot after dirtying (CubeSandbox +≈40 per 100 MB)", m(func(r *MemSnapResult) string {
		return fmt.Sprintf("%s, stored %.1f MiB, load %s", fmtNum(r.DirtyMS), float64(r.DirtyStored)/(1<<20), r.DirtyLoad)
	}))
	row("  resume from disk (goal p50 ≤ 40; CubeSandbox 42)", m(func(r *MemSnapResult) string {
		return sum(&r.Resume) + ", load " + r.ResumeLoad
	}))
	row("    hibernate", m(func(r *MemSnapResult) string { return sum(&r.Hibernate) }))
	row("  forks from one snapshot (goal 100 ≤ 1 s; CubeSandbox clone 220)", m(func(r *MemSnapResult) string {
		var parts []string
		for _, f := range r.Forks {
			p := fmt.Sprintf("%d: %s", f.Count, fmtNum(f.MS))
			if f.Failed > 0 {
				p += fmt.Sprintf(" (%d failed)", f.Failed)
			}
			parts = append(parts, p+", load "+f.Load)
		}
		return orDash(strings.Join(parts, "; "))
	}))
	row("  second snapshot after 5 % changed (goal ≤ 10 % of first)", m(func(r *MemSnapResult) string {
		return fmt.Sprintf("%.2f of %.2f MiB = %.1f %% (image %.1f MiB, load %s)", float64(r.SecondStored)/(1<<20),
			float64(r.FirstStored)/(1<<20), 100*r.SecondShare, float64(r.ImageBytes)/(1<<20), r.StorageLoad)
	}))
}
