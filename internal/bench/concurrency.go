package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// concurrencyMemory is each sandbox's memory limit in the concurrency
// phase: 32 sandboxes at the default 512 MiB would ask the node for more
// than a small host admits, and a cycle's `true` needs a few MiB.
const concurrencyMemory = 64 << 20

// minLevelCycles is the fewest cycles a level runs, so the p99 of the
// lower levels rests on more than a handful of samples.
const minLevelCycles = 24

// ConcurrencyLevel is one client count's full cycles (create → first
// command → delete) through the HTTP API.
type ConcurrencyLevel struct {
	Clients      int     `json:"clients"`
	Cycles       int     `json:"cycles"` // completed
	Seconds      float64 `json:"seconds"`
	CyclesPerSec float64 `json:"cycles_per_s"`
	// Running is POST /v1/sandboxes until its operation succeeded (the
	// sandbox runs); FirstCommand adds the first `true` to its exit.
	Running      Summary `json:"create_to_running"`
	FirstCommand Summary `json:"time_to_first_command"`
	// CPUPerCycleMS is this process's CPU (server and clients) per cycle.
	CPUPerCycleMS float64 `json:"process_cpu_ms_per_cycle"`
	Refused429    int     `json:"refused_429"`
	Errors        int     `json:"errors"`
	FirstError    string  `json:"first_error,omitempty"`
}

// runConcurrency runs, for each client count n, max(perClient·n, 24) full
// cycles on n concurrent clients against a template without a warm pool,
// so every create starts a sandbox.
func runConcurrency(ctx context.Context, env *Env, levels []int, perClient int, progress func(string, ...any)) ([]ConcurrencyLevel, error) {
	var out []ConcurrencyLevel
	var errs []error
	for _, n := range levels {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		l := runLevelInProcess(ctx, env, n, max(perClient*n, minLevelCycles))
		progress("  %d clients: %.1f cycles/s, create→running p50 %.0f ms, first command p50 %.0f ms p99 %.0f ms, CPU %.1f ms/cycle, errors %d",
			n, l.CyclesPerSec, l.Running.P50, l.FirstCommand.P50, l.FirstCommand.P99, l.CPUPerCycleMS, l.Errors)
		out = append(out, l)
		if l.Errors > 0 {
			errs = append(errs, fmt.Errorf("%d clients: %d of %d cycles failed, first: %s", n, l.Errors, l.Cycles+l.Errors, l.FirstError))
		}
	}
	return out, errors.Join(errs...)
}

func runLevelInProcess(ctx context.Context, env *Env, conc, cycles int) ConcurrencyLevel {
	l := ConcurrencyLevel{Clients: conc}
	var (
		mu             sync.Mutex
		running, first []time.Duration
	)
	cpu0 := selfCPU()
	t0 := time.Now()
	errs := forEach(ctx, cycles, conc, func(ctx context.Context, i int) error {
		start := time.Now()
		body := map[string]any{"template": ColdTemplate, "limits": map[string]any{"memory_bytes": concurrencyMemory}}
		sb, opID, err := env.Client.startCreate(ctx, body)
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == 429 {
			mu.Lock()
			l.Refused429++
			mu.Unlock()
			return nil
		}
		if err != nil {
			if sb.ID != "" {
				env.Client.Delete(context.WithoutCancel(ctx), sb.ID)
			}
			return err
		}
		_, err = env.Client.waitOp(ctx, opID)
		up := time.Since(start)
		if err == nil {
			_, err = exec1(ctx, env, sb, trueArgv)
		}
		ready := time.Since(start)
		if derr := env.Client.Delete(context.WithoutCancel(ctx), sb.ID); err == nil {
			err = derr
		}
		if err != nil {
			return err
		}
		mu.Lock()
		running, first = append(running, up), append(first, ready)
		mu.Unlock()
		return nil
	})
	l.Seconds = round2(time.Since(t0).Seconds())
	cpu := selfCPU() - cpu0
	for _, err := range errs {
		l.Errors++
		if l.FirstError == "" {
			l.FirstError = err.Error()
		}
	}
	l.Cycles = len(first)
	l.Running, l.FirstCommand = Summarize(running), Summarize(first)
	if l.Seconds > 0 {
		l.CyclesPerSec = round1(float64(l.Cycles) / l.Seconds)
	}
	if l.Cycles > 0 {
		l.CPUPerCycleMS = round1(1000 * cpu / float64(l.Cycles))
	}
	return l
}

// writeConcurrency prints the concurrency table.
// crun is the crun baseline's p50 in ms (0: none), which the latencies
// are also given as a multiple of.
func writeConcurrency(b *strings.Builder, levels []ConcurrencyLevel, crun float64) {
	fmt.Fprintln(b, "\nconcurrent full cycles (create → first `true` → delete; 64 MiB sandboxes, no warm pool):")
	tw := tabwriter.NewWriter(b, 2, 8, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "clients\tcycles\tcycles/s\tcreate→running p50 ms\tp99\t/ crun\tfirst command p50 ms\tp99\t/ crun\tCPU ms/cycle\t429\terrors\t")
	for _, l := range levels {
		fmt.Fprintf(tw, "%d\t%d\t%.1f\t%.1f\t%.1f\t%s\t%.1f\t%.1f\t%s\t%.1f\t%d\t%d\t\n", l.Clients, l.Cycles, l.CyclesPerSec,
			l.Running.P50, l.Running.P99, ratio(l.Running.P50, crun), l.FirstCommand.P50, l.FirstCommand.P99, ratio(l.FirstCommand.P50, crun),
			l.CPUPerCycleMS, l.Refused429, l.Errors)
	}
	tw.Flush()
	for _, l := range levels {
		if l.FirstError != "" {
			fmt.Fprintf(b, "  first error at %d clients: %s\n", l.Clients, l.FirstError)
		}
	}
}

// levelAt is the level with n clients, or nil.
func levelAt(levels []ConcurrencyLevel, n int) *ConcurrencyLevel {
	for i := range levels {
		if levels[i].Clients == n {
			return &levels[i]
		}
	}
	return nil
}
