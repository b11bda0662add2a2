package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/space-sandbox/space/internal/driver/gvisor"
)

// DriverResult is one driver's column of a comparison: everything through
// the HTTP API of an in-process server running that driver.
type DriverResult struct {
	Driver string      `json:"driver"`
	Cold   *ColdResult `json:"cold,omitempty"`
	Warm   *WarmResult `json:"warm,omitempty"`
	Exec   *Summary    `json:"exec_true,omitempty"`
	// Snapshot is POST /v1/sandboxes/{id}/snapshots until its operation
	// succeeded; Fork is POST /v1/snapshots/{id}/fork {"count":1} until
	// the new sandbox runs (for gvisor: runsc restore of the process
	// image); ForkExec is the first `true` in the fork.
	Snapshot     *Summary `json:"snapshot,omitempty"`
	Checkpoint   *Summary `json:"checkpoint_server_side,omitempty"` // stats.checkpoint_ms
	Frozen       *Summary `json:"frozen_server_side,omitempty"`     // stats.frozen_ms
	Fork         *Summary `json:"fork,omitempty"`
	ForkExec     *Summary `json:"fork_first_exec,omitempty"`
	SnapshotKind string   `json:"snapshot_kind,omitempty"`
	ImageBytes   int64    `json:"process_image_bytes,omitempty"`
	StoredBytes  int64    `json:"first_snapshot_bytes_stored,omitempty"`
	// MemSnap is the memory-snapshot part (cfg.MemSnap).
	MemSnap *MemSnapResult `json:"memory_snapshots,omitempty"`
	// Concurrency is the full-cycle phase at each of cfg.Clients.
	Concurrency []ConcurrencyLevel `json:"concurrency,omitempty"`
	Errors      []string           `json:"errors,omitempty"`
	Duration    float64            `json:"duration_s"`
}

// Comparison is RunDrivers' result.
type Comparison struct {
	Date     time.Time      `json:"date"`
	Machine  Machine        `json:"machine"`
	Config   Config         `json:"config"`
	Drivers  []DriverResult `json:"drivers"`
	Duration float64        `json:"duration_s"`
}

// RunDrivers measures each driver in turn, on its own in-process server:
// cold create (cfg.N creates, each then `true` and delete), warm-pool
// create (cfg.N, when cfg.WarmPool > 0), the exec round trip
// (cfg.ExecRuns), full cycles at each of cfg.Clients concurrent clients
// and, for gvisor, cfg.SnapshotRuns snapshot+fork pairs
// through the snapshot API with the process image's size, and the
// memory-snapshot part (cfg.MemSnap, for a driver whose snapshots hold
// processes). Idle memory,
// stdout throughput and crun are not part of it (`space bench` alone).
// It returns what it measured even when a driver failed.
func RunDrivers(ctx context.Context, cfg Config, drivers []string) (*Comparison, error) {
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	if len(drivers) == 0 {
		return nil, errors.New("bench: no driver to measure")
	}
	start := time.Now()
	res := &Comparison{Date: start.UTC(), Machine: describeMachine(), Config: cfg}
	res.Config.Progress, res.Config.ServerLog = nil, nil
	var errs []error
	for _, d := range drivers {
		if ctx.Err() != nil {
			break
		}
		dr, err := runDriver(ctx, cfg, d)
		if len(res.Drivers) == 0 {
			res.Machine.noteDynMods()
		}
		res.Drivers = append(res.Drivers, dr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d, err))
		}
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	res.Duration = time.Since(start).Round(time.Millisecond).Seconds()
	return res, errors.Join(errs...)
}

func runDriver(ctx context.Context, cfg Config, drv string) (DriverResult, error) {
	start := time.Now()
	dr := DriverResult{Driver: drv}
	cfg.Progress("%s: starting an in-process server (warm pool %d)", drv, cfg.WarmPool)
	env, err := Start(ctx, EnvOptions{AgentPath: cfg.AgentPath, TemplateDir: cfg.TemplateDir, WarmPool: cfg.WarmPool,
		Logf: cfg.ServerLog, Driver: drv, Runsc: cfg.Runsc, MaxOutputBytes: outputRoom(cfg), FavorDynMods: cfg.FavorDynMods})
	if err != nil {
		dr.Errors = append(dr.Errors, err.Error())
		return dr, err
	}
	var errs []error
	phase := func(name string, skip bool, f func() error) {
		if skip || ctx.Err() != nil {
			return
		}
		cfg.Progress("%s: %s", drv, name)
		if err := f(); err != nil {
			err = fmt.Errorf("%s: %w", name, err)
			errs = append(errs, err)
			dr.Errors = append(dr.Errors, err.Error())
		}
	}
	phase("cold create→exec→delete", cfg.N <= 0, func() (err error) { dr.Cold, err = runCold(ctx, env, cfg.N); return })
	phase("warm-pool create", cfg.N <= 0 || cfg.WarmPool <= 0, func() (err error) { dr.Warm, err = runWarm(ctx, env, cfg.N); return })
	phase("exec round trips", cfg.ExecRuns <= 0, func() (err error) {
		c := cfg
		c.StdoutRuns = 0
		dr.Exec, _, err = runExec(ctx, env, c)
		return
	})
	phase("concurrent full cycles", len(cfg.Clients) == 0, func() (err error) {
		dr.Concurrency, err = runConcurrency(ctx, env, cfg.Clients, cfg.ClientCycles, cfg.Progress)
		return
	})
	phase("snapshot + fork", cfg.SnapshotRuns <= 0 || drv != gvisor.Name, func() error { return runSnapshots(ctx, env, cfg.SnapshotRuns, &dr) })
	phase("memory snapshots", cfg.MemSnap.Runs <= 0, func() (err error) { dr.MemSnap, err = runMemSnap(ctx, env, cfg.MemSnap); return })
	cfg.Progress("%s: cleaning up", drv)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	if err := env.Close(cctx); err != nil {
		err = fmt.Errorf("cleanup: %w", err)
		errs = append(errs, err)
		dr.Errors = append(dr.Errors, err.Error())
	}
	dr.Duration = time.Since(start).Round(time.Millisecond).Seconds()
	return dr, errors.Join(errs...)
}

// runSnapshots snapshots one running sandbox (a shell loop running, a
// file written) n times and forks each snapshot once; the fork must hold
// the file and answer `true`.
func runSnapshots(ctx context.Context, env *Env, n int, dr *DriverResult) (err error) {
	sb, err := env.Client.Create(ctx, ColdTemplate)
	if err != nil {
		return err
	}
	defer func() {
		if derr := env.Client.Delete(context.WithoutCancel(ctx), sb.ID); derr != nil && err == nil {
			err = derr
		}
	}()
	if _, err := exec1(ctx, env, sb, []string{"sh", "-c", "echo bench > /tmp/state"}); err != nil {
		return err
	}
	if _, err := env.Client.StartCommand(ctx, sb, []string{"sh", "-c", "while true; do sleep 1; done"}); err != nil {
		return err
	}
	var snap, ck, frozen, fork, forkExec []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		info, err := env.Client.Snapshot(ctx, sb.ID)
		if err != nil {
			return fmt.Errorf("snapshot %d: %w", i, err)
		}
		snap = append(snap, time.Since(t0))
		ck = append(ck, time.Duration(info.Stats.CheckpointMS*float64(time.Millisecond)))
		frozen = append(frozen, time.Duration(info.Stats.FrozenMS*float64(time.Millisecond)))
		dr.SnapshotKind, dr.ImageBytes = info.Kind, info.Stats.ProcessImageBytes
		if i == 0 {
			dr.StoredBytes = info.Stats.BytesStored
		}
		t1 := time.Now()
		f, err := env.Client.Fork(ctx, info.ID)
		if err != nil {
			if f.ID != "" {
				env.Client.Delete(context.WithoutCancel(ctx), f.ID)
			}
			return fmt.Errorf("fork %d: %w", i, err)
		}
		fork = append(fork, time.Since(t1))
		t2 := time.Now()
		r, err := env.Client.Exec(ctx, f, []string{"cat", "/tmp/state"}, nil)
		forkExec = append(forkExec, time.Since(t2))
		if derr := env.Client.Delete(ctx, f.ID); derr != nil && err == nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("fork %d: %w", i, err)
		}
		if r.ExitCode != 0 || r.Stdout != int64(len("bench\n")) {
			return fmt.Errorf("fork %d: cat /tmp/state: exit %d, %d bytes, want the file", i, r.ExitCode, r.Stdout)
		}
	}
	s, c, fz, f, fe := Summarize(snap), Summarize(ck), Summarize(frozen), Summarize(fork), Summarize(forkExec)
	dr.Snapshot, dr.Checkpoint, dr.Frozen, dr.Fork, dr.ForkExec = &s, &c, &fz, &f, &fe
	return nil
}

// WriteComparison prints the side-by-side table.
func WriteComparison(w io.Writer, c *Comparison) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "space bench --drivers %s\t%s\n", driverNames(c), c.Date.Format(time.RFC3339))
	fmt.Fprintf(tw, "machine\t%s, %d CPUs, %s, load %s\n", c.Machine.CPUModel, c.Machine.CPUs, c.Machine.Kernel, c.Machine.LoadAvg)
	fmt.Fprintf(tw, "runs\tcold/warm %d each, exec %d, snapshot+fork %d\n\n", c.Config.N, c.Config.ExecRuns, c.Config.SnapshotRuns)
	header := "metric (ms unless noted)"
	for _, d := range c.Drivers {
		header += "\t" + d.Driver
	}
	fmt.Fprintln(tw, header)
	row := func(name string, f func(d DriverResult) string) {
		line := name
		for _, d := range c.Drivers {
			line += "\t" + f(d)
		}
		fmt.Fprintln(tw, line)
	}
	sum := func(s *Summary) string {
		if s == nil || s.N == 0 {
			return "—"
		}
		return fmt.Sprintf("p50 %s, p95 %s", fmtNum(s.P50), fmtNum(s.P95))
	}
	row("cold create→ready (client)", func(d DriverResult) string {
		if d.Cold == nil {
			return "—"
		}
		return sum(&d.Cold.Create)
	})
	row("  create operation (server clock)", func(d DriverResult) string {
		if d.Cold == nil {
			return "—"
		}
		return sum(&d.Cold.ServerOp)
	})
	row("  first exec after create", func(d DriverResult) string {
		if d.Cold == nil {
			return "—"
		}
		return sum(&d.Cold.FirstExec)
	})
	row("  delete", func(d DriverResult) string {
		if d.Cold == nil {
			return "—"
		}
		return sum(&d.Cold.Delete)
	})
	row("warm-pool create→ready", func(d DriverResult) string {
		if d.Warm == nil {
			return "—"
		}
		return sum(&d.Warm.Create)
	})
	row("exec `true` round trip", func(d DriverResult) string { return sum(d.Exec) })
	row("snapshot (API, until succeeded)", func(d DriverResult) string { return sum(d.Snapshot) })
	row("  checkpoint (server stats)", func(d DriverResult) string { return sum(d.Checkpoint) })
	row("  sandbox frozen (server stats)", func(d DriverResult) string { return sum(d.Frozen) })
	row("fork = restore (API, until running)", func(d DriverResult) string { return sum(d.Fork) })
	row("  first exec in the fork", func(d DriverResult) string { return sum(d.ForkExec) })
	row("snapshot kind", func(d DriverResult) string { return orDash(d.SnapshotKind) })
	row("process image (MiB)", func(d DriverResult) string {
		if d.ImageBytes == 0 {
			return "—"
		}
		return fmt.Sprintf("%.1f", float64(d.ImageBytes)/(1<<20))
	})
	row("first snapshot stored (MiB)", func(d DriverResult) string {
		if d.StoredBytes == 0 {
			return "—"
		}
		return fmt.Sprintf("%.1f", float64(d.StoredBytes)/(1<<20))
	})
	writeMemSnapRows(row, sum)
	row("errors", func(d DriverResult) string {
		if len(d.Errors) == 0 {
			return "none"
		}
		return strings.Join(d.Errors, "; ")
	})
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for _, d := range c.Drivers {
		if len(d.Concurrency) > 0 {
			fmt.Fprintf(&b, "\n%s:", d.Driver)
			writeConcurrency(&b, d.Concurrency, 0)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func driverNames(c *Comparison) string {
	var n []string
	for _, d := range c.Drivers {
		n = append(n, d.Driver)
	}
	return strings.Join(n, ",")
}

func fmtNum(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
