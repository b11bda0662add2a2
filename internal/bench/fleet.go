package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/store/postgres"
)

// FleetConfig configures `space bench --fleet`: full cycles (create →
// first command → delete) through the HTTP API of a fleet (a private
// PostgreSQL, replicas and nodes, each a separate `space` process) and of
// one single `space server` (SQLite) in the same run.
type FleetConfig struct {
	Nodes, Replicas int
	Clients         []int // concurrency levels, e.g. 1, 8, 16, 32
	// Rounds runs every level this many times, the setups' order
	// alternating, each fleet run compared with the single run beside it
	// (at least 1).
	Rounds int
	// Cycles per client at each level (at least MinCycles per level).
	Cycles, MinCycles int
	// MemoryBytes is each sandbox's memory limit.
	MemoryBytes int64
	// Bin is the space binary (default: this executable).
	Bin string
	// TemplateDir caches each process's uid-shifted template between
	// runs (one subdirectory per process).
	TemplateDir string
	// SkipSingle leaves out the single-server baseline.
	SkipSingle bool
	// ProfileDir, when set, receives a CPU profile of each server and
	// node process (<name>.pprof, written when it stops).
	ProfileDir string
	Progress   func(format string, a ...any)
}

// FleetLevel is one concurrency level on one setup.
type FleetLevel struct {
	Clients        int     `json:"clients"`
	Cycles         int     `json:"cycles"`
	Seconds        float64 `json:"seconds"`
	CyclesPerSec   float64 `json:"cycles_per_s"`
	FirstCommand   Summary `json:"first_command"` // create POST → first command's exit
	Refused429     int     `json:"refused_429"`
	Errors         int     `json:"errors"`
	FirstError     string  `json:"first_error,omitempty"`
	CPUPerCycleMS  float64 `json:"cpu_ms_per_cycle"`              // all processes of the setup
	ReplicaCPUMS   float64 `json:"replica_cpu_ms_per_cycle"`      // fleet: all replicas
	NodeCPUMS      float64 `json:"node_cpu_ms_per_cycle"`         // fleet: all nodes; single: the server
	PostgresCPUMS  float64 `json:"postgres_cpu_ms_per_cycle"`     // fleet: the whole PostgreSQL cluster
	PerNode        []int   `json:"per_node,omitempty"`            // fleet: cycles placed on each node
	ShareOfSingleP float64 `json:"share_of_single_pct,omitempty"` // fleet: cycles/s as % of the single server's
}

// FleetResult is the outcome of RunFleet.
type FleetResult struct {
	Machine  Machine      `json:"machine"`
	Nodes    int          `json:"nodes"`
	Replicas int          `json:"replicas"`
	Memory   int64        `json:"sandbox_memory_bytes"`
	Single   []FleetLevel `json:"single,omitempty"`
	Fleet    []FleetLevel `json:"fleet"`
	// Shares summarises, per client count, the fleet's cycles/s as % of
	// the single server's run beside it over the rounds.
	Shares []FleetShare `json:"shares,omitempty"`
}

// FleetShare is the fleet's rate as a share of the single server's at one
// client count: the median, lowest and highest of the paired rounds.
type FleetShare struct {
	Clients int     `json:"clients"`
	Rounds  int     `json:"rounds"`
	Median  float64 `json:"median_pct"`
	Min     float64 `json:"min_pct"`
	Max     float64 `json:"max_pct"`
}

// fleetProc is one `space` process of a setup.
type fleetProc struct {
	name, role string
	cmd        *exec.Cmd
	done       chan struct{}
	addr       map[string]string
	log        string
}

// RunFleet runs the fleet benchmark. It needs root (sandboxes) and a
// PostgreSQL installation (initdb, pg_ctl under /usr/lib/postgresql).
func RunFleet(ctx context.Context, cfg FleetConfig) (*FleetResult, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("bench --fleet: needs root")
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	if cfg.Bin == "" {
		var err error
		if cfg.Bin, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if cfg.ProfileDir != "" {
		var err error
		if cfg.ProfileDir, err = filepath.Abs(cfg.ProfileDir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return nil, err
		}
	}
	if cfg.TemplateDir == "" {
		cfg.TemplateDir = filepath.Join(filepath.Dir(DefaultTemplateDir), "bench-fleet-templates")
	}
	dir, err := os.MkdirTemp("", "space-fleet-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	res := &FleetResult{Machine: describeMachine(), Nodes: cfg.Nodes, Replicas: cfg.Replicas, Memory: cfg.MemoryBytes}
	// Both setups run for the whole benchmark and each level runs on one,
	// then at once on the other: on a shared machine both see the same
	// load. The idle setup's own background work (heartbeats) is small.
	var setups []*setup
	defer func() {
		for _, st := range setups {
			st.stop()
		}
	}()
	if !cfg.SkipSingle {
		cfg.Progress("single server: starting")
		st, err := startSingle(ctx, cfg, filepath.Join(dir, "single"))
		if err != nil {
			return res, fmt.Errorf("single server: %w", err)
		}
		setups = append(setups, st)
	}
	cfg.Progress("fleet: starting PostgreSQL, %d replicas, %d nodes", cfg.Replicas, cfg.Nodes)
	st, err := startFleet(ctx, cfg, filepath.Join(dir, "fleet"))
	if err != nil {
		return res, fmt.Errorf("fleet: %w", err)
	}
	setups = append(setups, st)
	for _, st := range setups {
		// A short warm-up: first sandboxes pay one-time costs.
		if _, err := runLevel(ctx, cfg, st, 2, 4); err != nil {
			return res, fmt.Errorf("%s: warm-up: %w", st.name, err)
		}
	}
	shares := map[int][]float64{}
	for r := 0; r < max(cfg.Rounds, 1); r++ {
		for _, n := range cfg.Clients {
			cycles := max(cfg.Cycles*n, cfg.MinCycles)
			order := setups
			if r%2 == 1 && len(setups) == 2 {
				// Every other round the fleet runs first: a machine
				// whose load drifts favours neither setup.
				order = []*setup{setups[1], setups[0]}
			}
			var single, fleet *FleetLevel
			for _, st := range order {
				cfg.Progress("%s: %d clients, %d cycles", st.name, n, cycles)
				l, err := runLevel(ctx, cfg, st, n, cycles)
				if err != nil {
					return res, fmt.Errorf("%s: %w", st.name, err)
				}
				cfg.Progress("%s: %d clients: %.1f cycles/s, first command p50 %.0f ms p99 %.0f ms, 429: %d, errors: %d, CPU %.1f ms/cycle",
					st.name, n, l.CyclesPerSec, l.FirstCommand.P50, l.FirstCommand.P99, l.Refused429, l.Errors, l.CPUPerCycleMS)
				if st.name == "single" {
					l.PerNode = nil // one node
					res.Single = append(res.Single, l)
					single = &res.Single[len(res.Single)-1]
				} else {
					res.Fleet = append(res.Fleet, l)
					fleet = &res.Fleet[len(res.Fleet)-1]
				}
			}
			if single != nil && fleet != nil && single.CyclesPerSec > 0 {
				fleet.ShareOfSingleP = round1(100 * fleet.CyclesPerSec / single.CyclesPerSec)
				shares[n] = append(shares[n], fleet.ShareOfSingleP)
			}
		}
	}
	res.Shares = summarizeShares(cfg.Clients, shares)
	return res, nil
}

// summarizeShares is the median, lowest and highest share per client
// count, in the order of clients (each count once).
func summarizeShares(clients []int, shares map[int][]float64) []FleetShare {
	var out []FleetShare
	for _, n := range clients {
		v := shares[n]
		if len(v) == 0 {
			continue
		}
		delete(shares, n)
		sort.Float64s(v)
		med := v[len(v)/2]
		if len(v)%2 == 0 {
			med = (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		out = append(out, FleetShare{Clients: n, Rounds: len(v), Median: round1(med), Min: v[0], Max: v[len(v)-1]})
	}
	return out
}

// setup is one system under test: its processes and API clients.
type setup struct {
	name    string
	clients []*Client
	procs   []*fleetProc // stopped in order
	pgPID   int
	cleanup []func()
}

func (st *setup) stop() {
	for _, c := range st.clients {
		c.Close()
	}
	for _, p := range st.procs {
		p.stop()
	}
	for i := len(st.cleanup) - 1; i >= 0; i-- {
		st.cleanup[i]()
	}
}

func startSingle(ctx context.Context, cfg FleetConfig, dir string) (_ *setup, err error) {
	st := &setup{name: "single"}
	defer func() {
		if err != nil {
			st.stop()
		}
	}()
	runDir, err := os.MkdirTemp("/tmp", "spfs")
	if err != nil {
		return nil, err
	}
	st.cleanup = append(st.cleanup, func() { os.RemoveAll(runDir) })
	data := filepath.Join(dir, "data")
	key, err := createKey(ctx, data)
	if err != nil {
		return nil, err
	}
	p := &fleetProc{name: "single", role: "node"}
	st.procs = append(st.procs, p)
	if err := p.start(ctx, cfg, dir, "server", "--data-dir", data, "--run-dir", runDir, "--driver", "namespace",
		"--template-dir", filepath.Join(cfg.TemplateDir, "single"), "--builtins", WarmTemplate,
		"--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	c := NewClient(p.addr["control"], key)
	st.clients = append(st.clients, c)
	return st, waitTemplate(ctx, c)
}

func startFleet(ctx context.Context, cfg FleetConfig, dir string) (_ *setup, err error) {
	st := &setup{name: "fleet"}
	defer func() {
		if err != nil {
			st.stop()
		}
	}()
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	pg, err := startPostgres(ctx, dir)
	if err != nil {
		return nil, err
	}
	st.cleanup = append(st.cleanup, pg.stop)
	st.pgPID = pg.pid
	secret := filepath.Join(dir, "cluster-secret")
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	if err := os.WriteFile(secret, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		return nil, err
	}
	// The node links run over mutual TLS, as deployed: a CA and a
	// certificate per process (what `space certs` writes).
	link, err := newLinkCA(dir)
	if err != nil {
		return nil, err
	}
	var nodes []*fleetProc
	for i := 0; i < cfg.Nodes; i++ {
		name := fmt.Sprintf("n%d", i+1)
		tlsDir, err := link.issue(cluster.RoleNode, name)
		if err != nil {
			return nil, err
		}
		runDir, err := os.MkdirTemp("/tmp", "spfn")
		if err != nil {
			return nil, err
		}
		st.cleanup = append(st.cleanup, func() { os.RemoveAll(runDir) })
		p := &fleetProc{name: name, role: "node"}
		nodes = append(nodes, p)
		if err := p.start(ctx, cfg, dir, "node", "--name", name, "--store", pg.dsn, "--driver", "namespace",
			"--data-dir", filepath.Join(dir, name), "--run-dir", runDir,
			"--template-dir", filepath.Join(cfg.TemplateDir, name), "--uid-base", fmt.Sprint(2000000+i*262144),
			"--builtins", WarmTemplate, "--cluster-secret-file", secret, "--cluster-tls-dir", tlsDir,
			"--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"); err != nil {
			st.procs = nodes
			return nil, err
		}
	}
	store, err := postgres.Open(ctx, pg.dsn, postgres.Options{})
	if err != nil {
		st.procs = nodes
		return nil, err
	}
	_, key, err := auth.NewKeys(store, time.Now).Create(ctx, project, "bench")
	store.Close()
	if err != nil {
		st.procs = nodes
		return nil, err
	}
	var replicas []*fleetProc
	defer func() { st.procs = append(replicas, nodes...) }() // replicas stop first
	for i := 0; i < cfg.Replicas; i++ {
		name := fmt.Sprintf("r%d", i+1)
		p := &fleetProc{name: name, role: "replica"}
		replicas = append(replicas, p)
		tlsDir, err := link.issue(cluster.RoleServer, name)
		if err != nil {
			return nil, err
		}
		if err := p.start(ctx, cfg, dir, "server", "--remote-nodes", "--node-name", name, "--store", pg.dsn,
			"--data-dir", filepath.Join(dir, name), "--listen", "127.0.0.1:0", "--cluster-secret-file", secret, "--cluster-tls-dir", tlsDir); err != nil {
			return nil, err
		}
		st.clients = append(st.clients, NewClient(p.addr["control"], key))
	}
	return st, waitNodesTemplate(ctx, st.clients[0], cfg.Nodes)
}

func runLevel(ctx context.Context, cfg FleetConfig, st *setup, conc, cycles int) (FleetLevel, error) {
	clients, procs, pgPID := st.clients, st.procs, st.pgPID
	l := FleetLevel{Clients: conc, Cycles: cycles}
	var mu sync.Mutex
	var firsts []time.Duration
	perNode := map[string]int{}
	cpu0 := cpuOf(procs, pgPID)
	t0 := time.Now()
	errs := forEach(ctx, cycles, conc, func(ctx context.Context, i int) error {
		c := clients[i%len(clients)]
		start := time.Now()
		// minimal: no warm pool on either setup, so every create starts a sandbox.
		body := map[string]any{"template": WarmTemplate, "limits": map[string]any{"memory_bytes": cfg.MemoryBytes}}
		sb, opID, err := c.startCreate(ctx, body)
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == 429 {
			mu.Lock()
			l.Refused429++
			mu.Unlock()
			return nil
		}
		if err != nil {
			return err
		}
		op, err := c.waitOp(ctx, opID)
		if err == nil {
			var r ExecResult
			if r, err = c.Exec(ctx, sb, []string{"true"}, nil); err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("true exited %d", r.ExitCode)
			}
		}
		first := time.Since(start)
		if derr := c.Delete(context.WithoutCancel(ctx), sb.ID); err == nil {
			err = derr
		}
		if err != nil {
			return err
		}
		mu.Lock()
		firsts = append(firsts, first)
		perNode[op.node()]++
		mu.Unlock()
		return nil
	})
	l.Seconds = time.Since(t0).Seconds()
	cpu1 := cpuOf(procs, pgPID)
	for _, err := range errs {
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return l, ctx.Err()
		}
		l.Errors++
		if l.FirstError == "" {
			l.FirstError = err.Error()
		}
	}
	done := len(firsts)
	l.FirstCommand = Summarize(firsts)
	if l.Seconds > 0 {
		l.CyclesPerSec = round1(float64(done) / l.Seconds)
	}
	if done > 0 {
		per := func(a, b float64) float64 { return round1(1000 * (b - a) / float64(done)) }
		l.ReplicaCPUMS, l.NodeCPUMS, l.PostgresCPUMS = per(cpu0.replica, cpu1.replica), per(cpu0.node, cpu1.node), per(cpu0.pg, cpu1.pg)
		l.CPUPerCycleMS = round1(l.ReplicaCPUMS + l.NodeCPUMS + l.PostgresCPUMS)
	}
	names := make([]string, 0, len(perNode))
	for n := range perNode {
		if n != "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		l.PerNode = append(l.PerNode, perNode[n])
	}
	return l, nil
}

// node is the node a create operation's sandbox was placed on.
func (o operation) node() string {
	var sb struct {
		Node string `json:"node"`
	}
	_ = json.Unmarshal(o.Result, &sb)
	return sb.Node
}

type cpuSplit struct{ replica, node, pg float64 }

// cpuOf reads the CPU seconds of a setup's processes from /proc.
func cpuOf(procs []*fleetProc, pgPID int) cpuSplit {
	var s cpuSplit
	for _, p := range procs {
		if p.cmd == nil || p.cmd.Process == nil {
			continue
		}
		self, _ := procCPU(p.cmd.Process.Pid)
		if p.role == "replica" {
			s.replica += self
		} else {
			s.node += self
		}
	}
	if pgPID > 0 {
		s.pg = treeCPU(pgPID)
	}
	return s
}

// treeCPU is the CPU of pid, its exited children, and its live children
// (PostgreSQL's backends and workers).
func treeCPU(pid int) float64 {
	self, kids := procCPU(pid)
	total := self + kids
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid(child) == pid {
			s, _ := procCPU(child)
			total += s
		}
	}
	return total
}

func ppid(pid int) int {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// start runs `space args…` with an addr file and waits until it serves.
func (p *fleetProc) start(ctx context.Context, cfg FleetConfig, dir string, args ...string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	addrFile := filepath.Join(dir, p.name+".addr")
	p.log = filepath.Join(dir, p.name+".log")
	f, err := os.Create(p.log)
	if err != nil {
		return err
	}
	p.cmd = exec.Command(cfg.Bin, append(args, "--addr-file", addrFile)...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if cfg.ProfileDir != "" {
		p.cmd.Env = append(os.Environ(), "SPACE_CPU_PROFILE="+filepath.Join(cfg.ProfileDir, p.name+".pprof"))
	}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return err
	}
	p.done = make(chan struct{})
	go func() { p.cmd.Wait(); f.Close(); close(p.done) }()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if raw, err := os.ReadFile(addrFile); err == nil && json.Unmarshal(raw, &p.addr) == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited at start:\n%s", p.name, tailFile(p.log))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not start:\n%s", p.name, tailFile(p.log))
}

// stop sends SIGTERM and waits (SIGKILL after 30 s).
func (p *fleetProc) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

func tailFile(path string) string {
	raw, _ := os.ReadFile(path)
	if len(raw) > 3000 {
		raw = raw[len(raw)-3000:]
	}
	return string(raw)
}

// waitTemplate waits until the server lists the template.
func waitTemplate(ctx context.Context, c *Client) error {
	return waitNodesTemplate(ctx, c, 0)
}

// waitNodesTemplate waits until GET /v1/templates lists the template and,
// for a fleet, until nodes nodes are ready (GET /v1/info's per-node view
// is not needed: a create on a node without it would fail).
func waitNodesTemplate(ctx context.Context, c *Client, nodes int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var ans struct {
			Templates []struct {
				Name string `json:"name"`
			} `json:"templates"`
		}
		if err := c.do(ctx, "GET", c.base+"/v1/templates", c.key, nil, 200, &ans); err == nil {
			for _, t := range ans.Templates {
				if t.Name == WarmTemplate {
					if nodes > 0 {
						// Every node registers before its builtins are
						// built; give the slowest a moment by creating
						// through placement (which only picks nodes with it).
						return waitEveryNode(ctx, c, nodes)
					}
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return errors.New("template minimal never appeared")
}

// waitEveryNode creates sandboxes until each of nodes nodes took one.
func waitEveryNode(ctx context.Context, c *Client, nodes int) error {
	seen := map[string]bool{}
	for i := 0; i < 200 && len(seen) < nodes; i++ {
		sb, opID, err := c.startCreate(ctx, map[string]any{"template": WarmTemplate})
		if err != nil {
			return err
		}
		op, err := c.waitOp(ctx, opID)
		if derr := c.Delete(ctx, sb.ID); err == nil {
			err = derr
		}
		if err != nil {
			return err
		}
		seen[op.node()] = true
		if len(seen) < nodes {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if len(seen) < nodes {
		return fmt.Errorf("only %d of %d nodes took sandboxes", len(seen), nodes)
	}
	return nil
}

// pgCluster is a private PostgreSQL cluster for the run.
type pgCluster struct {
	bin, dir, dsn string
	pid           int
}

func startPostgres(ctx context.Context, work string) (*pgCluster, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	pg := &pgCluster{}
	for _, d := range dirs {
		if fileExecutable(filepath.Join(d, "initdb")) && fileExecutable(filepath.Join(d, "pg_ctl")) {
			pg.bin = d
			break
		}
	}
	if pg.bin == "" {
		return nil, errors.New("no PostgreSQL installation (apt-get install postgresql; scripts/deps.sh)")
	}
	var err error
	// A short dir: the unix socket lives in it.
	if pg.dir, err = os.MkdirTemp("/tmp", "spbpg"); err != nil {
		return nil, err
	}
	if err := os.Chmod(pg.dir, 0o755); err != nil {
		return nil, err
	}
	if err := exec.CommandContext(ctx, "chown", "postgres:", pg.dir).Run(); err != nil {
		return nil, fmt.Errorf("chown %s to postgres: %w", pg.dir, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	data := filepath.Join(pg.dir, "data")
	as := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--"}, args...)...)
	}
	if out, err := as(filepath.Join(pg.bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	// The settings of scripts/postgres.sh (a benchmark, not a durable store).
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", port, pg.dir)
	if out, err := as(filepath.Join(pg.bin, "pg_ctl"), "-D", data, "-w", "-t", "60", "-l", filepath.Join(pg.dir, "server.log"), "-o", opts, "start").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pg_ctl start: %w: %s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		pg.stop()
		return nil, err
	}
	pg.pid, _ = strconv.Atoi(strings.SplitN(string(raw), "\n", 2)[0])
	pg.dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return pg, nil
}

func (pg *pgCluster) stop() {
	if pg.dir == "" {
		return
	}
	if pg.pid > 0 {
		exec.Command("runuser", "-u", "postgres", "--", filepath.Join(pg.bin, "pg_ctl"), "-D", filepath.Join(pg.dir, "data"), "-m", "immediate", "-w", "stop").Run()
	}
	os.RemoveAll(pg.dir)
}

// WriteFleet prints a FleetResult as tables.
func WriteFleet(w io.Writer, r *FleetResult) error {
	fmt.Fprintf(w, "Fleet benchmark: full cycles (create → first command `true` → delete), minimal, namespace driver, %d MiB sandboxes\n", r.Memory>>20)
	fmt.Fprintf(w, "machine: %d CPUs, kernel %s\n\n", r.Machine.CPUs, r.Machine.Kernel)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "setup\tclients\tcycles\tcycles/s\tvs single\tfirst cmd p50 ms\tp99 ms\t429\terrors\tCPU ms/cycle\treplicas\tnodes\tpostgres\tper node\t")
	row := func(setup string, l FleetLevel) {
		share := "-"
		if l.ShareOfSingleP > 0 {
			share = fmt.Sprintf("%.0f %%", l.ShareOfSingleP)
		}
		per := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(l.PerNode)), "/"), "[]")
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%s\t%.0f\t%.0f\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t\n", setup, l.Clients, l.Cycles, l.CyclesPerSec, share,
			l.FirstCommand.P50, l.FirstCommand.P99, l.Refused429, l.Errors, l.CPUPerCycleMS, l.ReplicaCPUMS, l.NodeCPUMS, l.PostgresCPUMS, per)
	}
	for _, l := range r.Single {
		row("single", l)
	}
	for _, l := range r.Fleet {
		row(fmt.Sprintf("fleet %dr/%dn", r.Replicas, r.Nodes), l)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Shares) > 0 {
		fmt.Fprintln(w, "\nfleet cycles/s as % of the single server's, paired runs:")
		for _, s := range r.Shares {
			fmt.Fprintf(w, "  %d clients: median %.0f %% over %d rounds (%.0f–%.0f %%)\n", s.Clients, s.Median, s.Rounds, s.Min, s.Max)
		}
	}
	for _, l := range append(append([]FleetLevel{}, r.Single...), r.Fleet...) {
		if l.FirstError != "" {
			fmt.Fprintf(w, "\nfirst error at %d clients: %s\n", l.Clients, l.FirstError)
		}
	}
	return nil
}

// linkCA issues the node link certificates of a benchmark fleet.
type linkCA struct {
	dir       string
	cert, key []byte
}

func newLinkCA(dir string) (*linkCA, error) {
	c, k, err := cluster.NewCA("bench node link CA", 24*time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	return &linkCA{dir: dir, cert: c, key: k}, nil
}

// issue writes tls.crt, tls.key and ca.crt for one process and returns
// the directory (its --cluster-tls-dir).
func (l *linkCA) issue(role cluster.CertRole, name string) (string, error) {
	var hosts []string
	if role == cluster.RoleNode {
		hosts = []string{"127.0.0.1"}
	}
	c, k, err := cluster.IssueCert(l.cert, l.key, cluster.CertRequest{Role: role, Name: name, Hosts: hosts, Validity: 24 * time.Hour}, time.Now())
	if err != nil {
		return "", err
	}
	out := filepath.Join(l.dir, "link-"+name)
	if err := os.MkdirAll(out, 0o700); err != nil {
		return "", err
	}
	for f, b := range map[string][]byte{cluster.TLSCertFile: c, cluster.TLSKeyFile: k, cluster.TLSCAFile: l.cert} {
		if err := os.WriteFile(filepath.Join(out, f), b, 0o600); err != nil {
			return "", err
		}
	}
	return out, nil
}
