// Package bench measures SPACE end to end: an in-process server (control
// API, data plane, node with the namespace driver) on temporary directories
// and loopback ports, driven through its real HTTP API by a plain net/http
// client. `space bench` and the Go benchmarks in this package use it.
package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/internal/driver/namespace"
	"github.com/space-sandbox/space/internal/server"
	"github.com/space-sandbox/space/internal/store/sqlite"
	"github.com/space-sandbox/space/internal/template"
)

// Template names. Both point at the same busybox rootfs; only WarmTemplate
// has a warm pool, so creates of ColdTemplate always start a sandbox.
const (
	WarmTemplate = template.BuiltinMinimal
	ColdTemplate = "bench-cold"
	// DefaultTemplateDir caches the built template between runs.
	DefaultTemplateDir = "/var/cache/space/bench-templates"
	project            = "bench"
)

// EnvOptions configure an in-process server for benchmarks.
type EnvOptions struct {
	// AgentPath is the `space` binary each sandbox runs as its PID 1;
	// default: this executable.
	AgentPath string
	// TemplateDir caches templates; default DefaultTemplateDir. When another
	// process holds it, a fresh dir under the run's temp dir is used.
	TemplateDir string
	// WarmPool is how many warm sandboxes the node keeps for WarmTemplate.
	WarmPool int
	// Logf receives the server's log; default: dropped.
	Logf func(format string, args ...any)
	// Driver is the server's isolation driver: "namespace" (default) or
	// "gvisor".
	Driver string
	// Runsc is the runsc binary for the gvisor driver (default: the
	// server's search: the pinned build, then PATH).
	Runsc string
	// MaxOutputBytes is the server's per-sandbox output bound (0: the
	// server's default). The stdout benchmark replays its whole output
	// from the log, so it needs room for it.
	MaxOutputBytes int64
	// FavorDynMods is the server's --cgroup-favordynmods.
	FavorDynMods bool
}

// Env is a running in-process server with an API key and a client.
type Env struct {
	Server    *server.Server
	Client    *Client
	RootfsDir string // the template's read-only root filesystem
	WarmPool  int

	dir       string // temp root: data/, run/, templates/ (fallback)
	shortRun  string // gvisor: a short run dir outside dir (unix socket path limits), removed by Close
	agentPath string
	logf      func(string, ...any)
	scope     *cgroupScope
}

// Start starts a server on fresh temporary directories and random loopback
// ports. It moves the process into a cgroup of its own until Close, so a
// process runs one Env at a time. The caller must Close it.
func Start(ctx context.Context, o EnvOptions) (_ *Env, err error) {
	if o.Driver == "" {
		o.Driver = namespace.Name
	}
	if o.Driver != namespace.Name && o.Driver != gvisor.Name {
		return nil, fmt.Errorf("bench: driver %q: only %s and %s are measured: %w", o.Driver, namespace.Name, gvisor.Name, driver.ErrUnsupported)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("bench: the %s driver needs root: %w", o.Driver, driver.ErrUnsupported)
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.AgentPath == "" {
		if o.AgentPath, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("bench: find own binary: %w", err)
		}
		// Measure what a server runs: the slim space-agent when it sits
		// next to this binary (see server.installAgent).
		if slim := filepath.Join(filepath.Dir(o.AgentPath), "space-agent"); fileExecutable(slim) {
			o.AgentPath = slim
		}
	}
	if o.TemplateDir == "" {
		o.TemplateDir = DefaultTemplateDir
	}
	dir, err := os.MkdirTemp("", "space-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	e := &Env{dir: dir, agentPath: o.AgentPath, logf: o.Logf, WarmPool: o.WarmPool}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			if cerr := e.Close(cctx); cerr != nil {
				err = fmt.Errorf("%w (cleanup: %v)", err, cerr)
			}
		}
	}()
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if e.scope, err = enterCgroupScope(filepath.Base(dir)); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	cfg := server.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.RunDir = filepath.Join(dir, "run")
	if o.Driver == gvisor.Name {
		// runsc's sockets live below RunDir/gvisor and must fit a unix
		// socket path with a 64-byte id.
		if e.shortRun, err = os.MkdirTemp("/tmp", "spb"); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		cfg.RunDir = e.shortRun
	}
	cfg.Listen, cfg.DataListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Driver = o.Driver
	cfg.Runsc = o.Runsc
	cfg.CgroupFavorDynMods = o.FavorDynMods
	// The memory-snapshot part measures the namespace driver's CRIU
	// checkpoints where CRIU works (opt-in on a server).
	cfg.NamespaceCRIU = true
	cfg.NamespaceLazyRestore = true
	cfg.AgentPath = o.AgentPath
	cfg.Builtins = []string{WarmTemplate}
	cfg.WarmPool = o.WarmPool
	if o.WarmPool > 0 {
		cfg.WarmTemplates = []string{WarmTemplate}
	}
	cfg.Logf = o.Logf
	if o.MaxOutputBytes > cfg.MaxOutputBytes {
		cfg.MaxOutputBytes = o.MaxOutputBytes
	}
	if cfg.TemplateDir, e.RootfsDir, err = prepareTemplates(ctx, o.TemplateDir, filepath.Join(dir, "templates"), cfg.UIDBase, o.Logf); err != nil {
		return nil, err
	}
	key, err := createKey(ctx, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if e.Server, err = server.Start(ctx, cfg); err != nil {
		return nil, fmt.Errorf("bench: start server: %w", err)
	}
	e.Client = NewClient("http://"+e.Server.Addr(), key)
	if err := e.WaitPool(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	return e, nil
}

// prepareTemplates builds (or finds cached) the minimal template and names
// the same rootfs ColdTemplate, before the server takes the directory's lock.
func prepareTemplates(ctx context.Context, dir, fallback string, uidBase uint32, logf func(string, ...any)) (string, string, error) {
	m, err := template.NewManager(dir, template.Options{UIDBase: uidBase, UIDCount: 65536, Logf: logf})
	if errors.Is(err, template.ErrLocked) {
		logf("bench: template dir %s is in use; building into %s", dir, fallback)
		dir = fallback
		m, err = template.NewManager(dir, template.Options{UIDBase: uidBase, UIDCount: 65536, Logf: logf, NoSync: true})
	}
	if err != nil {
		return "", "", fmt.Errorf("bench: templates: %w", err)
	}
	defer m.Close()
	t, err := m.EnsureBuiltin(ctx, WarmTemplate, nil)
	if err != nil {
		return "", "", fmt.Errorf("bench: build template %s: %w", WarmTemplate, err)
	}
	if _, err := m.Build(ctx, template.BuildRequest{Name: ColdTemplate, Source: t.Source, Defaults: t.Defaults}, nil); err != nil {
		return "", "", fmt.Errorf("bench: name template %s: %w", ColdTemplate, err)
	}
	return dir, t.RootfsDir, nil
}

func createKey(ctx context.Context, dataDir string) (string, error) {
	if err := os.MkdirAll(dataDir, 0o711); err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(dataDir, "space.db"))
	if err != nil {
		return "", fmt.Errorf("bench: open store: %w", err)
	}
	defer st.Close()
	_, key, err := auth.NewKeys(st, time.Now).Create(ctx, project, "bench")
	if err != nil {
		return "", fmt.Errorf("bench: create API key: %w", err)
	}
	return key, nil
}

// WaitPool waits until the warm pool is full (no-op without a pool).
func (e *Env) WaitPool(ctx context.Context, timeout time.Duration) error {
	if e.WarmPool <= 0 {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for e.Server.Node().PoolSize(WarmTemplate) < e.WarmPool {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: warm pool has %d of %d sandboxes after %v", e.Server.Node().PoolSize(WarmTemplate), e.WarmPool, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// Timing returns the driver's create breakdown of a running sandbox.
func (e *Env) Timing(id string) (driver.Timing, error) {
	sb, err := e.Server.Node().Sandbox(id)
	if err != nil {
		return driver.Timing{}, err
	}
	return sb.Timing(), nil
}

// SandboxMemory is the memory charged to the run's sandbox cgroups
// (memory.usage_in_bytes of the driver's base dirs in the v1 memory
// hierarchy), or -1 where there is no such hierarchy.
func (e *Env) SandboxMemory() int64 {
	dir := e.scope.memoryDir()
	if dir == "" {
		return -1
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1
	}
	var sum int64
	for _, ent := range ents {
		if ent.IsDir() {
			if v := cgroupUsage(filepath.Join(dir, ent.Name())); v > 0 {
				sum += v
			}
		}
	}
	return sum
}

// ScopeMemory is memory.usage_in_bytes of the run's whole cgroup scope
// (this process and, hierarchically, every sandbox), or -1.
func (e *Env) ScopeMemory() int64 { return cgroupUsage(e.scope.memoryDir()) }

// Dir is the run's temporary directory (removed by Close).
func (e *Env) Dir() string { return e.dir }

// Close deletes every sandbox of the run through the API, stops the server,
// sweeps whatever the driver still finds in the run's directories and
// cgroups, and removes the temporary directories.
func (e *Env) Close(ctx context.Context) error {
	var errs []error
	if e.Client != nil {
		ids, err := e.Client.List(ctx, "creating,running")
		if err != nil {
			errs = append(errs, fmt.Errorf("list sandboxes: %w", err))
		}
		if len(ids) > 0 {
			e.logf("bench: deleting %d remaining sandboxes", len(ids))
		}
		errs = append(errs, forEach(ctx, len(ids), 8, func(ctx context.Context, i int) error {
			return e.Client.Delete(ctx, ids[i])
		})...)
		e.Client.Close()
		e.Client = nil
	}
	if e.Server != nil {
		if err := e.Server.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shutdown: %w", err))
		}
		// Safety net: a server leaves running sandboxes alone on shutdown
		// (they outlive it by design). Everything in this run's dirs and
		// cgroup scope is ours: sweep it with the driver, whatever base dir
		// the server chose below the scope.
		for _, base := range e.scope.bases() {
			d, err := namespace.New(namespace.Options{
				StateDir: filepath.Join(e.dir, "data", "sandboxes"), RunDir: filepath.Join(e.dir, "run"),
				AgentPath: e.agentPath, CgroupBase: base, Logf: e.logf,
			})
			if err != nil {
				errs = append(errs, fmt.Errorf("sweep: %w", err))
				continue
			}
			if err := d.Sweep(ctx, nil); err != nil {
				errs = append(errs, fmt.Errorf("sweep: %w", err))
			}
			d.Cgroups().RemoveBase()
		}
		e.Server = nil
	}
	if err := e.scope.Close(); err != nil {
		errs = append(errs, err)
	}
	e.scope = nil
	if e.shortRun != "" {
		if err := os.RemoveAll(e.shortRun); err != nil {
			errs = append(errs, err)
		}
		e.shortRun = ""
	}
	if e.dir != "" {
		if err := os.RemoveAll(e.dir); err != nil {
			errs = append(errs, err)
		}
		e.dir = ""
	}
	return errors.Join(errs...)
}

// forEach runs f(0..n-1) on up to conc goroutines and returns the errors.
func forEach(ctx context.Context, n, conc int, f func(ctx context.Context, i int) error) []error {
	var (
		mu   sync.Mutex
		errs []error
		next int
		wg   sync.WaitGroup
	)
	if conc > n {
		conc = n
	}
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return errs
}

// AgentPID returns the host pid of a sandbox's PID 1 (its agent), found
// in the sandbox's cgroup below the run's scope; 0 if not found. id is the
// driver's instance id (the sandbox id for sandboxes not from the pool).
func (e *Env) AgentPID(id string) int {
	for _, p := range e.scope.dirs {
		for _, base := range e.scope.bases() {
			data, err := os.ReadFile(filepath.Join(p.dir, base, id, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(data)) {
				pid, err := strconv.Atoi(f)
				if err == nil && nsPID(pid) == 1 {
					return pid
				}
			}
		}
	}
	return 0
}

// nsPID is a process's pid in its own (innermost) pid namespace.
func nsPID(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[len(f)-1])
				return n
			}
		}
	}
	return 0
}

// procCPU returns a process's own CPU seconds and those of its waited-for
// children (a sandbox's commands are children of its agent).
func procCPU(pid int) (self, children float64) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 15 {
		return 0, 0
	}
	tick := func(s string) float64 {
		v, _ := strconv.ParseFloat(s, 64)
		return v / 100 // USER_HZ
	}
	return tick(f[11]) + tick(f[12]), tick(f[13]) + tick(f[14])
}

func fileExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
