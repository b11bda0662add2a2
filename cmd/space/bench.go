package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/bench"
)

// runBench measures a driver (namespace by default, --driver gvisor)
// through the real HTTP API of an in-process server, or, with --drivers
// a,b, several drivers side by side in one run (see docs/PERFORMANCE.md).
func runBench(args []string) error {
	if len(args) > 0 && args[0] == "serve-http" {
		return benchServeHTTP(args[1:])
	}
	cfg := bench.DefaultConfig()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&cfg.N, "n", cfg.N, "sequential cold creates (and as many warm-pool creates); 0 skips both")
	fs.IntVar(&cfg.Idle, "idle", cfg.Idle, fmt.Sprintf("idle sandboxes alive at once for the memory measurement (at most %d; 0 skips)", bench.MaxSandboxes))
	fs.IntVar(&cfg.IdleConcurrency, "idle-concurrency", cfg.IdleConcurrency, "concurrent creates while filling the idle set")
	fs.IntVar(&cfg.ExecRuns, "exec-runs", cfg.ExecRuns, "`true` round trips")
	fs.Int64Var(&cfg.StdoutBytes, "stdout-bytes", cfg.StdoutBytes, "bytes per stdout throughput run")
	fs.IntVar(&cfg.StdoutRuns, "stdout-runs", cfg.StdoutRuns, "stdout throughput runs (0 skips)")
	fs.IntVar(&cfg.WarmPool, "warm-pool", cfg.WarmPool, "warm pool size (0 skips the warm measurement)")
	fs.IntVar(&cfg.CrunRuns, "crun-runs", cfg.CrunRuns, "crun baseline runs (0 skips)")
	fs.IntVar(&cfg.PortRequests, "port-requests", cfg.PortRequests, "small HTTP requests per phase of the forwarded-port benchmark (1 MiB ones: a tenth, at least 50; 0 skips)")
	fs.IntVar(&cfg.PortClients, "port-clients", cfg.PortClients, "concurrent keep-alive clients of the forwarded-port benchmark")
	fs.StringVar(&cfg.TemplateDir, "template-dir", bench.DefaultTemplateDir, "template cache reused between runs")
	fs.StringVar(&cfg.Driver, "driver", "namespace", "isolation driver to measure: namespace or gvisor")
	drivers := fs.String("drivers", "", "comma-separated drivers measured side by side in one run (e.g. namespace,gvisor): cold and warm-pool create, exec round trip, and for gvisor snapshot+fork; replaces --driver")
	fs.BoolVar(&cfg.FavorDynMods, "cgroup-favordynmods", cfg.FavorDynMods, "the server's --cgroup-favordynmods (host-wide; see space server -h)")
	fs.StringVar(&cfg.Runsc, "runsc", "", "runsc binary for the gvisor driver (default: the pinned build, then PATH)")
	fs.IntVar(&cfg.SnapshotRuns, "snapshot-runs", 10, "with --drivers: snapshot+fork pairs per driver that has process snapshots (gvisor; 0 skips)")
	cfg.MemSnap = bench.DefaultMemSnap()
	fs.IntVar(&cfg.MemSnap.Runs, "mem-snapshot-runs", cfg.MemSnap.Runs, "with --drivers: idle snapshots and hibernate→resume cycles of the memory-snapshot part, for a driver whose snapshots hold processes (0 skips the part)")
	memDirty := fs.Int64("mem-dirty-mb", cfg.MemSnap.DirtyBytes>>20, "with --drivers: MiB of memory dirtied before the memory-snapshot part's dirty snapshot")
	memForks := fs.String("mem-forks", joinInts(cfg.MemSnap.Forks), "with --drivers: comma-separated fork counts from one snapshot in the memory-snapshot part")
	fleet := fs.Bool("fleet", false, "fleet benchmark: a private PostgreSQL, --fleet-replicas replicas and --fleet-nodes nodes as separate processes, next to one single server, full cycles (create → first command → delete) at each --fleet-clients level")
	fc := bench.FleetConfig{Nodes: 2, Replicas: 2, Cycles: 6, MinCycles: 24, MemoryBytes: 64 << 20}
	fs.IntVar(&fc.Nodes, "fleet-nodes", fc.Nodes, "with --fleet: space node processes")
	fs.IntVar(&fc.Replicas, "fleet-replicas", fc.Replicas, "with --fleet: space server --remote-nodes replicas")
	fleetClients := fs.String("fleet-clients", "1,8,16,32", "with --fleet: comma-separated client counts")
	fs.IntVar(&fc.Cycles, "fleet-cycles", fc.Cycles, "with --fleet: cycles per client at each level (at least 24)")
	fs.StringVar(&fc.Bin, "fleet-bin", "", "with --fleet: the space binary the servers and nodes run (default: this one; another build, to compare builds under the same benchmark)")
	fs.IntVar(&fc.Rounds, "fleet-rounds", 1, "with --fleet: run every level this many times, single and fleet in alternating order, and report the median of the paired shares")
	fs.Int64Var(&fc.MemoryBytes, "fleet-memory", fc.MemoryBytes, "with --fleet: each sandbox's memory limit in bytes")
	fs.BoolVar(&fc.SkipSingle, "fleet-no-single", false, "with --fleet: skip the single-server baseline")
	fs.StringVar(&fc.ProfileDir, "fleet-profile", "", "with --fleet: write a CPU profile of each server and node process into this directory (<name>.pprof)")
	clients := fs.String("clients", joinInts(cfg.Clients), "comma-separated concurrent client counts of the full-cycle phase (create → first command → delete); \"\" or 0 skips it")
	fs.IntVar(&cfg.ClientCycles, "client-cycles", cfg.ClientCycles, "full cycles per client at each --clients level (a level runs at least 24)")
	compare := fs.String("compare", "", "an earlier JSON report (--out); prints each figure's change against it after the run")
	asJSON := fs.Bool("json", false, "print the result as JSON instead of a table")
	out := fs.String("out", "", "also write the JSON result to this file")
	verbose := fs.Bool("v", false, "print the server's log to stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}
	if cfg.N < 0 || cfg.Idle < 0 || cfg.ExecRuns < 0 || cfg.StdoutRuns < 0 || cfg.CrunRuns < 0 || cfg.WarmPool < 0 || cfg.StdoutBytes < 0 || cfg.SnapshotRuns < 0 ||
		cfg.PortRequests < 0 || cfg.PortClients < 0 {
		return errors.New("bench: counts must not be negative")
	}
	if *memDirty < 0 || *memDirty > 4096 || cfg.MemSnap.Runs < 0 {
		return errors.New("bench: --mem-dirty-mb is 0..4096, --mem-snapshot-runs not negative")
	}
	cfg.MemSnap.DirtyBytes = *memDirty << 20
	forks, ferr := parseClients(*memForks)
	if ferr != nil {
		return fmt.Errorf("bench: --mem-forks %q: counts from 1 to 256", *memForks)
	}
	cfg.MemSnap.Forks = forks
	if cfg.Idle > bench.MaxSandboxes {
		return fmt.Errorf("bench: --idle is at most %d", bench.MaxSandboxes)
	}
	var err error
	if cfg.Clients, err = parseClients(*clients); err != nil {
		return err
	}
	if cfg.ClientCycles < 1 {
		return errors.New("bench: --client-cycles must be at least 1")
	}
	var earlier *bench.Result
	if *compare != "" {
		if *fleet || *drivers != "" {
			return errors.New("bench: --compare works with a plain run, not --fleet or --drivers")
		}
		if earlier, err = bench.ReadResult(*compare); err != nil {
			return err
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			stop() // a second signal kills the process the usual way
			fmt.Fprintln(os.Stderr, "space bench: interrupted; removing everything it created (interrupt again to abort)")
		case <-done:
		}
	}()
	start := time.Now()
	cfg.Progress = func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	tail := &logTail{max: 40}
	cfg.ServerLog = tail.logf
	if *verbose {
		cfg.ServerLog = func(format string, a ...any) {
			fmt.Fprintf(os.Stderr, "server: "+format+"\n", a...)
		}
	}

	if *fleet {
		for _, f := range strings.Split(*fleetClients, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 256 {
				return fmt.Errorf("bench: --fleet-clients: %q is not a count from 1 to 256", f)
			}
			fc.Clients = append(fc.Clients, n)
		}
		if fc.Nodes < 1 || fc.Nodes > 16 || fc.Replicas < 1 || fc.Replicas > 8 || fc.Cycles < 1 || fc.MemoryBytes < 16<<20 || fc.Rounds < 1 || fc.Rounds > 20 {
			return errors.New("bench: --fleet-nodes 1..16, --fleet-replicas 1..8, --fleet-cycles ≥ 1, --fleet-rounds 1..20, --fleet-memory ≥ 16 MiB")
		}
		fc.Progress = cfg.Progress
		res, runErr := bench.RunFleet(ctx, fc)
		if res != nil {
			if err := emit(res, *out, *asJSON, func() error { return bench.WriteFleet(os.Stdout, res) }); err != nil {
				return err
			}
		}
		return benchErr(ctx, runErr, tail, *verbose)
	}
	if *drivers != "" {
		var list []string
		for _, d := range strings.Split(*drivers, ",") {
			if d = strings.TrimSpace(d); d != "" {
				list = append(list, d)
			}
		}
		res, runErr := bench.RunDrivers(ctx, cfg, list)
		if res != nil {
			if err := emit(res, *out, *asJSON, func() error { return bench.WriteComparison(os.Stdout, res) }); err != nil {
				return err
			}
		}
		return benchErr(ctx, runErr, tail, *verbose)
	}
	if cfg.Driver == "namespace" {
		cfg.Driver = "" // the default result stays as it was
	}

	res, runErr := bench.Run(ctx, cfg)
	if res != nil {
		raw, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if *out != "" {
			if err := os.WriteFile(*out, append(raw, '\n'), 0o644); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
		}
		if *asJSON {
			fmt.Println(string(raw))
		} else if err := bench.WriteText(os.Stdout, res); err != nil {
			return err
		}
		if earlier != nil {
			w := os.Stdout
			if *asJSON {
				w = os.Stderr // stdout stays one JSON document
			} else {
				fmt.Println()
			}
			if err := bench.WriteCompare(w, earlier, res); err != nil {
				return err
			}
		}
	}
	if runErr != nil {
		if ctx.Err() != nil {
			return errors.New("bench: interrupted")
		}
		if lines := tail.lines(); len(lines) > 0 && !*verbose {
			fmt.Fprintf(os.Stderr, "last server log lines:\n  %s\n", strings.Join(lines, "\n  "))
		}
		return fmt.Errorf("bench: %w", runErr)
	}
	return nil
}

// parseClients reads --clients: counts from 1 to bench.MaxSandboxes; ""
// or "0" is none.
func parseClients(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" || f == "0" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("bench: --clients: %q is not a count from 1 to 256", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, strconv.Itoa(x))
	}
	return strings.Join(s, ",")
}

// benchServeHTTP is `space bench serve-http ADDR`: the forwarded-port
// benchmark's HTTP server, which it runs inside a sandbox and on the host.
func benchServeHTTP(args []string) error {
	if len(args) != 1 {
		return usagef("usage: space bench serve-http ADDR   (the port benchmark's HTTP server: GET /small, GET /1mib)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return bench.ServePorts(ctx, args[0], os.Stdout)
}

// logTail keeps the last lines of the server's log for error reports.
type logTail struct {
	max int
	mu  sync.Mutex
	buf []string
}

func (t *logTail) logf(format string, a ...any) {
	line := fmt.Sprintf(format, a...)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, line)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
}

func (t *logTail) lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.buf...)
}

// emit writes a result as JSON to path (if set) and prints it as JSON or
// with table.
func emit(res any, path string, asJSON bool, table func() error) error {
	raw, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if path != "" {
		if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	if asJSON {
		fmt.Println(string(raw))
		return nil
	}
	return table()
}

// benchErr reports a run's error with the server's last log lines.
func benchErr(ctx context.Context, runErr error, tail *logTail, verbose bool) error {
	if runErr == nil {
		return nil
	}
	if ctx.Err() != nil {
		return errors.New("bench: interrupted")
	}
	if lines := tail.lines(); len(lines) > 0 && !verbose {
		fmt.Fprintf(os.Stderr, "last server log lines:\n  %s\n", strings.Join(lines, "\n  "))
	}
	return fmt.Errorf("bench: %w", runErr)
}
