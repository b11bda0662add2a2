package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/doctor"
	"golang.org/x/sys/unix"
)

// Config says what Run measures. Zero counts skip a phase.
type Config struct {
	N               int   `json:"n"`                // sequential cold creates, and as many warm creates
	Idle            int   `json:"idle"`             // sandboxes alive at once for the memory measurement
	IdleConcurrency int   `json:"idle_concurrency"` // concurrent creates while filling the idle set
	ExecRuns        int   `json:"exec_runs"`        // `true` round trips
	StdoutBytes     int64 `json:"stdout_bytes"`     // bytes per stdout run
	StdoutRuns      int   `json:"stdout_runs"`
	WarmPool        int   `json:"warm_pool"` // warm pool size for WarmTemplate
	CrunRuns        int   `json:"crun_runs"` // crun baseline runs
	// PortRequests is how many small requests each phase of the port
	// benchmark sends (1 MiB ones: a tenth, at least 50); 0 skips it.
	// PortClients is its concurrent keep-alive clients.
	PortRequests int `json:"port_requests"`
	PortClients  int `json:"port_clients"`
	// Clients are the concurrency levels of the full-cycle phase (create
	// → first command → delete with that many concurrent clients); none
	// skips it. ClientCycles is the cycles each client runs per level
	// (a level runs at least 24).
	Clients      []int `json:"clients,omitempty"`
	ClientCycles int   `json:"cycles_per_client,omitempty"`
	// PortServer is the `space` binary the port benchmark runs as its HTTP
	// server (`space bench serve-http`); default: this executable.
	PortServer string `json:"-"`

	AgentPath   string `json:"-"` // see EnvOptions
	TemplateDir string `json:"template_dir"`
	// Driver is the server's isolation driver ("" = namespace; see
	// EnvOptions), Runsc the runsc binary for gvisor.
	Driver string `json:"driver,omitempty"`
	Runsc  string `json:"runsc,omitempty"`
	// FavorDynMods is the server's --cgroup-favordynmods (on in
	// DefaultConfig, as on `space server`).
	FavorDynMods bool `json:"favordynmods"`
	// SnapshotRuns is how many snapshot+fork pairs RunDrivers measures per
	// driver (0 skips).
	SnapshotRuns int `json:"snapshot_runs,omitempty"`
	// MemSnap sizes the memory-snapshot part of RunDrivers (Runs 0
	// skips it).
	MemSnap MemSnapConfig `json:"mem_snapshot,omitzero"`
	// Progress receives one line per phase step (default: dropped).
	Progress func(format string, args ...any) `json:"-"`
	// ServerLog receives the server's log (default: dropped).
	ServerLog func(format string, args ...any) `json:"-"`
}

// DefaultConfig is what `space bench` runs with no flags.
func DefaultConfig() Config {
	return Config{N: 100, Idle: 500, IdleConcurrency: 4, ExecRuns: 200, StdoutBytes: 256 << 20,
		StdoutRuns: 3, WarmPool: 4, CrunRuns: 50, PortRequests: defaultPortRequests, PortClients: 8,
		Clients: []int{1, 4, 16, 32}, ClientCycles: defaultClientCycles, FavorDynMods: true}
}

// defaultClientCycles is the cycles each client runs per level. A level's
// rate is its cycles over its wall time, and that time ends with the last
// cycles running beside fewer than n others. At 3 a client a level was
// three cycles long (48 cycles in half a second at 16 clients), so that
// end weighed on the rate (about 5 % at 16 clients in interleaved runs)
// and its p99 rested on 48 cycles; 12 costs a few seconds more a run.
const defaultClientCycles = 12

// MaxSandboxes bounds how many sandboxes one run may have alive at once.
const MaxSandboxes = 600

// Machine describes the host.
type Machine struct {
	Kernel   string `json:"kernel"`
	OS       string `json:"os"`
	CPUModel string `json:"cpu_model"`
	CPUs     int    `json:"cpus"`
	MemTotal string `json:"mem_total"`
	Cgroups  string `json:"cgroups"`
	Go       string `json:"go"`
	LoadAvg  string `json:"loadavg_at_start"` // other work on the host skews the numbers
	// DataFS is the filesystem under the server's data dir: ext4 without
	// a journal makes creates slower the more was deleted lately
	// (docs/operations.md).
	DataFS string `json:"data_fs,omitempty"`
}

// Breakdown is the driver's create timing, p50 of each step in ms.
type Breakdown struct {
	Namespaces float64 `json:"namespaces_p50_ms"`
	Overlay    float64 `json:"overlay_p50_ms"`
	Cgroups    float64 `json:"cgroups_p50_ms"`
	Network    float64 `json:"network_p50_ms"`
	AgentReady float64 `json:"agent_ready_p50_ms"`
	Hardening  float64 `json:"hardening_p50_ms,omitempty"` // part of AgentReady: the agent's hardening and seccomp install
	Total      float64 `json:"driver_total_p50_ms"`
}

// ColdResult is the sequential create→exec→delete loop without a pool.
type ColdResult struct {
	Create    Summary   `json:"create"`
	ServerOp  Summary   `json:"create_operation_server_side"`
	Breakdown Breakdown `json:"breakdown"`
	FirstExec Summary   `json:"first_exec"`
	Delete    Summary   `json:"delete"`
	Cycle     Summary   `json:"cycle"`
}

// WarmResult is sequential creates claiming warm sandboxes.
type WarmResult struct {
	Pool     int     `json:"pool"`
	Mode     string  `json:"mode"`
	Create   Summary `json:"create"`
	ServerOp Summary `json:"create_operation_server_side"`
}

// StdoutResult is output streamed over SSE and decoded by the client.
type StdoutResult struct {
	Bytes  int64     `json:"bytes_per_run"`
	Argv   []string  `json:"argv"`
	MBps   []float64 `json:"mb_per_s"` // decimal MB (1e6 bytes) per second, per run
	Median float64   `json:"median_mb_per_s"`
	// The two halves of the path, measured apart on one more run: the
	// command writing into the node's output log with no client reading
	// (polled for its exit), then the finished log replayed to the client
	// over SSE.
	ProduceMBps float64 `json:"produce_to_node_log_mb_per_s"`
	ReplayMBps  float64 `json:"replay_log_to_client_mb_per_s"`
	AvgEvent    int64   `json:"avg_event_bytes"` // decoded bytes per stdout event
	CPU         CPUUse  `json:"cpu_per_run"`     // averaged over the runs
	// The same bytes written 1 MiB at a time (busybox head writes 4 KiB at
	// a time, which makes many small events): dd's rate and event size.
	LargeWritesArgv     []string `json:"large_writes_argv"`
	LargeWritesMBps     float64  `json:"large_writes_mb_per_s"`
	LargeWritesAvgEvent int64    `json:"large_writes_avg_event_bytes"`
	LargeWritesCPU      CPUUse   `json:"large_writes_cpu"`
	// The same runs over the binary frame stream (no base64): head's
	// small writes, and dd's large ones.
	FramesMBps            []float64 `json:"frames_mb_per_s"`
	FramesMedian          float64   `json:"frames_median_mb_per_s"`
	FramesLargeWritesMBps []float64 `json:"frames_large_writes_mb_per_s"`
	FramesLargeMedian     float64   `json:"frames_large_writes_median_mb_per_s"`
}

// CPUUse is the CPU time spent while a command ran: the command itself (the
// agent's waited-for children), the sandbox's agent, and this process
// (server and client together), next to the wall time.
type CPUUse struct {
	Command float64 `json:"command_s"`
	Agent   float64 `json:"agent_s"`
	Host    float64 `json:"server_and_client_s"`
	Wall    float64 `json:"wall_s"`
}

// Total is all CPU seconds.
func (c CPUUse) Total() float64 { return c.Command + c.Agent + c.Host }

// IdleResult is the memory cost of idle sandboxes.
type IdleResult struct {
	Wanted          int     `json:"wanted"`
	Created         int     `json:"created"`
	Alive           int     `json:"alive"` // answered `true` with exit 0 at the end
	MemAvailBefore  int64   `json:"mem_available_before_kib"`
	MemAvailAfter   int64   `json:"mem_available_after_kib"`
	PerSandboxMiB   float64 `json:"per_sandbox_mib"`
	CgroupPerMiB    float64 `json:"cgroup_per_sandbox_mib"`        // memory.usage_in_bytes of the sandboxes' cgroups
	ParentPerMiB    float64 `json:"server_cgroup_per_sandbox_mib"` // charged to the server's own cgroup instead
	ServerRSSPerMiB float64 `json:"server_rss_per_sandbox_mib"`    // growth of this process's RSS
	CreateSeconds   float64 `json:"create_s"`
	DeleteSeconds   float64 `json:"delete_s"`
	// Where the memory went: /proc/meminfo deltas per sandbox (KiB), and
	// the agents (PID 1) of up to 20 sandboxes, averaged.
	MeminfoKiB   map[string]float64 `json:"meminfo_delta_kib_per_sandbox"`
	AgentRSSKiB  int64              `json:"agent_rss_kib"`
	AgentPSSKiB  int64              `json:"agent_pss_kib"`
	AgentThreads float64            `json:"agent_threads"`
}

// meminfoKeys are the /proc/meminfo fields the idle breakdown reports.
var meminfoKeys = []string{"AnonPages", "Shmem", "Cached", "Slab", "SUnreclaim", "KernelStack", "PageTables"}

// CrunResult is the crun baseline.
type CrunResult struct {
	Skipped string  `json:"skipped,omitempty"`
	Version string  `json:"version,omitempty"`
	Cgroups string  `json:"cgroups,omitempty"`
	Notes   string  `json:"notes,omitempty"`
	Run     Summary `json:"run"`
}

// Check is one target and whether it was met.
type Check struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Value  string `json:"value"`
	Pass   bool   `json:"pass"`
}

// Result is everything one run measured.
type Result struct {
	Date    time.Time   `json:"date"`
	Machine Machine     `json:"machine"`
	Driver  string      `json:"driver"`
	Config  Config      `json:"config"`
	Cold    *ColdResult `json:"cold,omitempty"`
	Warm    *WarmResult `json:"warm,omitempty"`
	Exec    *Summary    `json:"exec_true,omitempty"`
	// ExecHost is the same /bin/true run on the host (RunHostTrue).
	ExecHost *Summary      `json:"exec_true_host,omitempty"`
	Stdout   *StdoutResult `json:"stdout,omitempty"`
	Idle     *IdleResult   `json:"idle,omitempty"`
	Crun     *CrunResult   `json:"crun,omitempty"`
	Ports    *PortsResult  `json:"ports,omitempty"`
	// Concurrency is the full-cycle phase, one entry per client count.
	Concurrency []ConcurrencyLevel `json:"concurrency,omitempty"`
	Checks      []Check            `json:"checks"`
	Errors      []string           `json:"errors,omitempty"`
	Duration    float64            `json:"duration_s"`
}

// Run starts an in-process server and measures it. It returns the result
// even when a phase failed (the failure is in Result.Errors and in err).
// Everything it created is removed before it returns, also on cancellation.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	if cfg.Idle > MaxSandboxes {
		return nil, fmt.Errorf("bench: --idle %d is more than the %d sandboxes a run may start", cfg.Idle, MaxSandboxes)
	}
	start := time.Now()
	res := &Result{Date: start.UTC(), Machine: describeMachine(), Config: cfg}
	res.Config.Progress, res.Config.ServerLog = nil, nil
	cfg.Progress("starting an in-process server (warm pool %d)", cfg.WarmPool)
	env, err := Start(ctx, EnvOptions{AgentPath: cfg.AgentPath, TemplateDir: cfg.TemplateDir, WarmPool: cfg.WarmPool, Logf: cfg.ServerLog,
		Driver: cfg.Driver, Runsc: cfg.Runsc, MaxOutputBytes: outputRoom(cfg), FavorDynMods: cfg.FavorDynMods})
	if err != nil {
		return res, err
	}
	res.Machine.noteDynMods()
	if f, err := doctor.FSOf(filepath.Join(env.Dir(), "data")); err == nil {
		res.Machine.DataFS = f.String()
	}
	res.Driver = env.Server.Node().DriverName()
	var errs []error
	phase := func(name string, skip bool, f func() error) {
		if skip || ctx.Err() != nil {
			return
		}
		cfg.Progress("%s", name)
		if err := f(); err != nil {
			err = fmt.Errorf("%s: %w", name, err)
			errs = append(errs, err)
			res.Errors = append(res.Errors, err.Error())
		}
	}
	phase("cold create→exec→delete", cfg.N <= 0, func() (err error) { res.Cold, err = runCold(ctx, env, cfg.N); return })
	phase("warm-pool create", cfg.N <= 0 || cfg.WarmPool <= 0, func() (err error) { res.Warm, err = runWarm(ctx, env, cfg.N); return })
	phase("exec round trips and stdout", cfg.ExecRuns <= 0 && cfg.StdoutRuns <= 0, func() (err error) {
		res.Exec, res.Stdout, err = runExec(ctx, env, cfg)
		return
	})
	phase("the same `true` on the host", cfg.ExecRuns <= 0, func() (err error) {
		res.ExecHost, err = RunHostTrue(ctx, env.RootfsDir, min(cfg.ExecRuns, 500))
		return
	})
	phase("concurrent full cycles", len(cfg.Clients) == 0, func() (err error) {
		res.Concurrency, err = runConcurrency(ctx, env, cfg.Clients, cfg.ClientCycles, cfg.Progress)
		return
	})
	phase("idle sandboxes", cfg.Idle <= 0, func() (err error) {
		res.Idle, err = runIdle(ctx, env, cfg.Idle, cfg.IdleConcurrency, cfg.Progress)
		return
	})
	phase("forwarded port vs direct", cfg.PortRequests <= 0, func() (err error) {
		bin := cfg.PortServer
		if bin == "" {
			if bin, err = os.Executable(); err != nil {
				return err
			}
		}
		res.Ports, err = RunPorts(ctx, env, bin, cfg.PortRequests, cfg.PortClients)
		return
	})
	phase("crun baseline", cfg.CrunRuns <= 0, func() (err error) {
		res.Crun, err = RunCrun(ctx, env.RootfsDir, env.Dir(), cfg.CrunRuns)
		return
	})
	cfg.Progress("cleaning up")
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	if err := env.Close(cctx); err != nil {
		err = fmt.Errorf("cleanup: %w", err)
		errs = append(errs, err)
		res.Errors = append(res.Errors, err.Error())
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	res.Checks = checks(res)
	res.Duration = time.Since(start).Round(time.Millisecond).Seconds()
	return res, errors.Join(errs...)
}

func exec1(ctx context.Context, env *Env, sb Sandbox, argv []string) (ExecResult, error) {
	r, err := env.Client.Exec(ctx, sb, argv, nil)
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("%v exited %d: %s", argv, r.ExitCode, r.Stderr)
	}
	return r, err
}

var trueArgv = []string{"/bin/true"}

func runCold(ctx context.Context, env *Env, n int) (*ColdResult, error) {
	var create, serverOp, first, del, cycle, tNS, tOv, tCg, tNet, tReady, tHard, tTotal []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		sb, err := env.Client.Create(ctx, ColdTemplate)
		t1 := time.Now()
		if err != nil {
			return nil, fmt.Errorf("create %d: %w", i, err)
		}
		tm, err := env.Timing(sb.ID)
		if err != nil {
			return nil, err
		}
		if _, err := exec1(ctx, env, sb, trueArgv); err != nil {
			return nil, err
		}
		t2 := time.Now()
		if err := env.Client.Delete(ctx, sb.ID); err != nil {
			return nil, fmt.Errorf("delete: %w", err)
		}
		t3 := time.Now()
		serverOp = append(serverOp, sb.CreateOp)
		create, first, del, cycle = append(create, t1.Sub(t0)), append(first, t2.Sub(t1)), append(del, t3.Sub(t2)), append(cycle, t3.Sub(t0))
		tNS, tOv, tCg = append(tNS, tm.Namespaces), append(tOv, tm.Overlay), append(tCg, tm.Cgroups)
		tNet, tReady, tTotal = append(tNet, tm.Network), append(tReady, tm.AgentReady), append(tTotal, tm.Total)
		tHard = append(tHard, tm.Hardening)
	}
	return &ColdResult{
		Create: Summarize(create), ServerOp: Summarize(serverOp), FirstExec: Summarize(first), Delete: Summarize(del), Cycle: Summarize(cycle),
		Breakdown: Breakdown{Namespaces: P50(tNS), Overlay: P50(tOv), Cgroups: P50(tCg), Network: P50(tNet),
			AgentReady: P50(tReady), Hardening: P50(tHard), Total: P50(tTotal)},
	}, nil
}

func runWarm(ctx context.Context, env *Env, n int) (*WarmResult, error) {
	var create, serverOp []time.Duration
	for i := 0; i < n; i++ {
		if err := env.WaitPool(ctx, 60*time.Second); err != nil {
			return nil, err
		}
		t0 := time.Now()
		sb, err := env.Client.Create(ctx, WarmTemplate)
		d := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("create %d: %w", i, err)
		}
		create, serverOp = append(create, d), append(serverOp, sb.CreateOp)
		if err := env.Client.Delete(ctx, sb.ID); err != nil {
			return nil, fmt.Errorf("delete: %w", err)
		}
	}
	return &WarmResult{Pool: env.WarmPool, Create: Summarize(create), ServerOp: Summarize(serverOp),
		Mode: fmt.Sprintf("sequential; the pool of %d was refilled to full before each create (a rate the pool sustains)", env.WarmPool)}, nil
}

func runExec(ctx context.Context, env *Env, cfg Config) (_ *Summary, _ *StdoutResult, err error) {
	sb, err := env.Client.Create(ctx, ColdTemplate)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if derr := env.Client.Delete(context.WithoutCancel(ctx), sb.ID); derr != nil && err == nil {
			err = derr
		}
	}()
	var execSum *Summary
	if cfg.ExecRuns > 0 {
		for i := 0; i < 10; i++ { // warm up connections and the agent
			if _, err := exec1(ctx, env, sb, trueArgv); err != nil {
				return nil, nil, err
			}
		}
		var rt []time.Duration
		for i := 0; i < cfg.ExecRuns; i++ {
			t0 := time.Now()
			if _, err := exec1(ctx, env, sb, trueArgv); err != nil {
				return nil, nil, err
			}
			rt = append(rt, time.Since(t0))
		}
		s := Summarize(rt)
		execSum = &s
	}
	if cfg.StdoutRuns <= 0 || cfg.StdoutBytes <= 0 {
		return execSum, nil, nil
	}
	out := &StdoutResult{Bytes: cfg.StdoutBytes, Argv: []string{"head", "-c", strconv.FormatInt(cfg.StdoutBytes, 10), "/dev/zero"}}
	pid := env.AgentPID(sb.ID)
	// stream runs argv, checks its output and returns MB/s, bytes per
	// event and the CPU it took.
	stream := func(argv []string) (float64, int64, CPUUse, error) {
		a0, c0 := procCPU(pid)
		h0 := selfCPU()
		t0 := time.Now()
		r, err := exec1(ctx, env, sb, argv)
		d := time.Since(t0)
		a1, c1 := procCPU(pid)
		use := CPUUse{Command: c1 - c0, Agent: a1 - a0, Host: selfCPU() - h0, Wall: d.Seconds()}
		if err != nil {
			return 0, 0, use, err
		}
		if r.Stdout != cfg.StdoutBytes {
			return 0, 0, use, fmt.Errorf("stdout: got %d bytes, want %d", r.Stdout, cfg.StdoutBytes)
		}
		return round1(float64(r.Stdout) / 1e6 / d.Seconds()), r.Stdout / int64(max(r.Events, 1)), use, nil
	}
	for i := 0; i < cfg.StdoutRuns; i++ {
		mbps, avg, use, err := stream(out.Argv)
		if err != nil {
			return execSum, nil, err
		}
		out.MBps = append(out.MBps, mbps)
		out.AvgEvent = avg
		n := float64(cfg.StdoutRuns)
		out.CPU.Command += use.Command / n
		out.CPU.Agent += use.Agent / n
		out.CPU.Host += use.Host / n
		out.CPU.Wall += use.Wall / n
	}
	out.CPU = roundCPU(out.CPU)
	out.Median = medianFloat(out.MBps)
	// The halves apart: no reader while the command runs, then a replay.
	t0 := time.Now()
	cid, err := env.Client.StartCommand(ctx, sb, out.Argv)
	if err != nil {
		return execSum, out, err
	}
	if err := env.Client.WaitCommand(ctx, sb, cid, 2*time.Millisecond); err != nil {
		return execSum, out, err
	}
	out.ProduceMBps = round1(float64(cfg.StdoutBytes) / 1e6 / time.Since(t0).Seconds())
	t0 = time.Now()
	r, err := env.Client.Follow(ctx, sb, cid, nil)
	if err != nil {
		return execSum, out, err
	}
	if r.Stdout != cfg.StdoutBytes {
		return execSum, out, fmt.Errorf("stdout replay: got %d bytes, want %d", r.Stdout, cfg.StdoutBytes)
	}
	out.ReplayMBps = round1(float64(r.Stdout) / 1e6 / time.Since(t0).Seconds())
	if cfg.StdoutBytes%(1<<20) == 0 {
		out.LargeWritesArgv = []string{"dd", "if=/dev/zero", "bs=1048576", "count=" + strconv.FormatInt(cfg.StdoutBytes>>20, 10)}
		if out.LargeWritesMBps, out.LargeWritesAvgEvent, out.LargeWritesCPU, err = stream(out.LargeWritesArgv); err != nil {
			return execSum, out, err
		}
		out.LargeWritesCPU = roundCPU(out.LargeWritesCPU)
	}
	frames := func(argv []string) (float64, error) {
		t0 := time.Now()
		cid, err := env.Client.StartCommand(ctx, sb, argv)
		if err != nil {
			return 0, err
		}
		r, err := env.Client.FollowFrames(ctx, sb, cid)
		if err != nil {
			return 0, err
		}
		if r.Stdout != cfg.StdoutBytes {
			return 0, fmt.Errorf("frames: got %d bytes, want %d", r.Stdout, cfg.StdoutBytes)
		}
		return round1(float64(r.Stdout) / 1e6 / time.Since(t0).Seconds()), nil
	}
	for i := 0; i < cfg.StdoutRuns; i++ {
		v, err := frames(out.Argv)
		if err != nil {
			return execSum, out, err
		}
		out.FramesMBps = append(out.FramesMBps, v)
		if len(out.LargeWritesArgv) > 0 {
			if v, err = frames(out.LargeWritesArgv); err != nil {
				return execSum, out, err
			}
			out.FramesLargeWritesMBps = append(out.FramesLargeWritesMBps, v)
		}
	}
	out.FramesMedian = medianFloat(out.FramesMBps)
	out.FramesLargeMedian = medianFloat(out.FramesLargeWritesMBps)
	return execSum, out, nil
}

func roundCPU(c CPUUse) CPUUse {
	return CPUUse{Command: round2(c.Command), Agent: round2(c.Agent), Host: round2(c.Host), Wall: round2(c.Wall)}
}

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }

func runIdle(ctx context.Context, env *Env, n, conc int, progress func(string, ...any)) (*IdleResult, error) {
	if conc <= 0 {
		conc = 1
	}
	res := &IdleResult{Wanted: n}
	settle(time.Second)
	res.MemAvailBefore = memAvailable()
	miBefore := meminfoAll()
	cgBefore, scopeBefore := env.SandboxMemory(), env.ScopeMemory()
	rssBefore := selfRSS()

	var (
		mu  sync.Mutex
		sbs []Sandbox
	)
	t0 := time.Now()
	errs := forEach(ctx, n, conc, func(ctx context.Context, i int) error {
		sb, err := env.Client.Create(ctx, ColdTemplate)
		if err != nil {
			return err
		}
		mu.Lock()
		sbs = append(sbs, sb)
		if len(sbs)%100 == 0 {
			progress("  %d idle sandboxes alive", len(sbs))
		}
		mu.Unlock()
		return nil
	})
	res.CreateSeconds = round1(time.Since(t0).Seconds())
	res.Created = len(sbs)
	settle(2 * time.Second)
	res.MemAvailAfter = memAvailable()
	miAfter := meminfoAll()
	cgAfter, scopeAfter := env.SandboxMemory(), env.ScopeMemory()
	rssAfter := selfRSS()
	if c := float64(res.Created); c > 0 {
		res.PerSandboxMiB = round2(float64(res.MemAvailBefore-res.MemAvailAfter) / 1024 / c)
		if cgBefore >= 0 && cgAfter >= 0 {
			res.CgroupPerMiB = round2(float64(cgAfter-cgBefore) / (1 << 20) / c)
			if scopeBefore >= 0 && scopeAfter >= 0 {
				res.ParentPerMiB = round2(float64((scopeAfter-scopeBefore)-(cgAfter-cgBefore)) / (1 << 20) / c)
			}
		}
		res.ServerRSSPerMiB = round2(float64(rssAfter-rssBefore) / 1024 / c)
		res.MeminfoKiB = map[string]float64{}
		for _, k := range meminfoKeys {
			res.MeminfoKiB[k] = round1(float64(miAfter[k]-miBefore[k]) / c)
		}
	}
	var sampled int64
	for _, sb := range sbs[:min(20, len(sbs))] {
		pid := env.AgentPID(sb.ID)
		if pid <= 0 {
			continue
		}
		rollup := "/proc/" + strconv.Itoa(pid) + "/smaps_rollup"
		rss, pss := kibField(rollup, "Rss:"), kibField(rollup, "Pss:")
		threads := kibField("/proc/"+strconv.Itoa(pid)+"/status", "Threads:")
		if rss < 0 || pss < 0 || threads < 0 {
			continue
		}
		res.AgentRSSKiB += rss
		res.AgentPSSKiB += pss
		res.AgentThreads += float64(threads)
		sampled++
	}
	if sampled > 0 {
		res.AgentRSSKiB /= sampled
		res.AgentPSSKiB /= sampled
		res.AgentThreads = round1(res.AgentThreads / float64(sampled))
	}
	var aliveN int
	forEach(ctx, len(sbs), 8, func(ctx context.Context, i int) error {
		if _, err := exec1(ctx, env, sbs[i], trueArgv); err != nil {
			return err
		}
		mu.Lock()
		aliveN++
		mu.Unlock()
		return nil
	})
	res.Alive = aliveN
	progress("  %d of %d answered a command; deleting them", res.Alive, res.Created)
	t1 := time.Now()
	dctx := context.WithoutCancel(ctx)
	derrs := forEach(dctx, len(sbs), 8, func(ctx context.Context, i int) error {
		return env.Client.Delete(ctx, sbs[i].ID)
	})
	res.DeleteSeconds = round1(time.Since(t1).Seconds())
	if len(errs) > 0 {
		return res, fmt.Errorf("%d of %d creates failed, first: %w", len(errs), n, errs[0])
	}
	if len(derrs) > 0 {
		return res, fmt.Errorf("%d deletes failed, first: %w", len(derrs), derrs[0])
	}
	return res, ctx.Err()
}

// selfCPU is this process's user+system CPU seconds.
func selfCPU() float64 {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }

// settle returns freed Go heap to the OS and lets the kernel catch up, so
// memory readings see live memory only.
func settle(d time.Duration) {
	runtime.GC()
	debug.FreeOSMemory()
	time.Sleep(d)
}

// memAvailable is MemAvailable in KiB, the median of five readings.
func memAvailable() int64 {
	var xs []float64
	for i := 0; i < 5; i++ {
		xs = append(xs, float64(meminfo("MemAvailable:")))
		time.Sleep(100 * time.Millisecond)
	}
	return int64(medianFloat(xs))
}

// meminfoAll reads every kB field of /proc/meminfo.
func meminfoAll() map[string]int64 {
	out := map[string]int64{}
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if f := strings.Fields(rest); len(f) > 0 {
			if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				out[k] = v
			}
		}
	}
	return out
}

func meminfo(key string) int64 {
	return kibField("/proc/meminfo", key)
}

func selfRSS() int64 { return kibField("/proc/self/status", "VmRSS:") }

// kibField reads "Key:   123 kB" from a /proc file.
func kibField(path, key string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				v, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return v
				}
			}
		}
	}
	return -1
}

// cgroupUsage is memory.usage_in_bytes of a v1 memory cgroup (-1 if none).
func cgroupUsage(dir string) int64 {
	if dir == "" {
		return -1
	}
	data, err := os.ReadFile(dir + "/memory.usage_in_bytes")
	if err != nil {
		return -1
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return -1
	}
	return v
}

func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if data, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if kib := meminfo("MemTotal:"); kib > 0 {
		m.MemTotal = fmt.Sprintf("%.1f GiB", float64(kib)/(1<<20))
	}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	m.Cgroups = describeCgroups()
	if _, err := os.Stat("/dev/kvm"); err != nil {
		m.Cgroups += "; no /dev/kvm"
	}
	return m
}

// noteDynMods adds the host's favordynmods state (read after the server
// started, which may have turned it on) to the cgroup line.
func (m *Machine) noteDynMods() {
	if d, err := cgroups.ReadDynMods(); err == nil && d.Mount != "" {
		m.Cgroups += ", " + d.String()
	}
}

func describeCgroups() string {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "unknown"
	}
	var v1 []string
	v2 := false
	for _, m := range parseCgroupMounts(mi) {
		if m.v2 {
			v2 = true
			continue
		}
		for _, c := range m.ctls {
			for _, w := range scopeControllers {
				if c == w {
					v1 = append(v1, c)
				}
			}
		}
	}
	switch {
	case len(v1) > 0 && v2:
		return "hybrid (v1 " + strings.Join(v1, ",") + "; v2 unified)"
	case v2:
		return "v2"
	case len(v1) > 0:
		return "v1 " + strings.Join(v1, ",")
	}
	return "none"
}

// outputRoom is the output bound the benchmark's server needs: the stdout
// replay reads a whole run back from the log (the default 64 MiB bound
// would drop most of a 256 MiB run), plus room for the exec runs' output.
func outputRoom(cfg Config) int64 {
	if cfg.StdoutRuns <= 0 || cfg.StdoutBytes <= 0 {
		return 0
	}
	return cfg.StdoutBytes + 16<<20
}
