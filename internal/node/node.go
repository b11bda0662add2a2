// Package node is the host side of SPACE: it owns the isolation driver, the
// template cache, the warm pool and every running sandbox's agent
// connection, and it records each command's output on the host so that
// clients can follow and resume it. In a single-machine server it runs in the
// server process.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/egress/policy"
	"github.com/space-sandbox/space/internal/execlog"
	"github.com/space-sandbox/space/internal/logx"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/template"
)

// refillDelay is how long the warm pool waits after a claim before it
// starts replacing the claimed sandbox.
const refillDelay = 20 * time.Millisecond

// Bounds of a sandbox's kept command output (Options.MaxLogBytes).
const (
	DefaultMaxLogBytes = 64 << 20
	MinMaxLogBytes     = 4 << 20
)

// Options configure a node.
type Options struct {
	Driver    driver.Driver
	Templates *template.Manager
	// LogDir holds per-command output logs: LogDir/<sandbox>/<command>.log.
	LogDir string
	// MaxLogBytes bounds the command output a sandbox keeps on the host,
	// all its commands together (default 64 MiB): past it the oldest
	// output is dropped and readers from there get a "dropped" marker
	// (execlog.Budget).
	MaxLogBytes int64
	// MaxCommands bounds the commands a sandbox may have recorded at once.
	MaxCommands int
	// WarmPool is the number of pre-created, never-used sandboxes kept per
	// template named in WarmTemplates.
	WarmPool      int
	WarmTemplates []string
	DefaultLimits driver.Limits
	// MaxDiskBytes, if set, is the largest disk limit this node gives a
	// sandbox (space node --max-disk-bytes); a larger one is refused.
	MaxDiskBytes int64
	// Network, if set, is the egress gateway of this node's sandboxes (the
	// driver must set their networks up through it); nil = no network.
	Network *egress.Network
	// OnLost is told when a running sandbox dies on its own (its PID 1
	// exited), so the lifecycle can report it lost with the reason.
	OnLost func(id, reason string)
	Logf   func(string, ...any)
	// Logger, if set, receives the node's structured records (a command
	// killed by the OOM killer); default: rendered into Logf.
	Logger *slog.Logger
	// Observer, if set, is told of starts, stops, commands and snapshots
	// (metrics).
	Observer Observer

	// SnapshotDir holds the snapshot store (chunks and manifests); default
	// <parent of LogDir>/snapshots.
	SnapshotDir string
	// SnapshotShared, if set, is the snapshot store shared with other
	// nodes (SnapshotDir is then this node's cache of it).
	SnapshotShared snapshot.Backend
}

// Node runs sandboxes on this host.
type Node struct {
	o Options

	mu        sync.Mutex
	sandboxes map[string]*Sandbox // by sandbox id
	pool      map[string][]driver.Instance
	poolWant  chan struct{}
	snaps     *snapshot.Store
	metrics   *metricsState

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a node. Call Close to stop its background work.
func New(o Options) (*Node, error) {
	if o.MaxLogBytes <= 0 {
		o.MaxLogBytes = DefaultMaxLogBytes
	}
	// An agent event may carry up to 1 MiB: the bound must hold a few.
	o.MaxLogBytes = max(o.MaxLogBytes, MinMaxLogBytes)
	if o.MaxCommands <= 0 {
		o.MaxCommands = 1024
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Logger == nil {
		o.Logger = logx.FromLogf(o.Logf)
	}
	if err := os.MkdirAll(o.LogDir, 0o700); err != nil {
		return nil, fmt.Errorf("node log dir: %w", err)
	}
	if o.SnapshotDir == "" {
		o.SnapshotDir = filepath.Join(filepath.Dir(filepath.Clean(o.LogDir)), "snapshots")
	}
	snaps, err := snapshot.Open(o.SnapshotDir, o.Logf)
	if err != nil {
		return nil, err
	}
	if o.SnapshotShared != nil {
		snaps.SetShared(o.SnapshotShared)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{o: o, sandboxes: map[string]*Sandbox{}, pool: map[string][]driver.Instance{},
		poolWant: make(chan struct{}, 1), snaps: snaps, ctx: ctx, cancel: cancel}
	n.startSampler()
	return n, nil
}

// Snapshots returns the node's snapshot store.
func (n *Node) Snapshots() *snapshot.Store { return n.snaps }

// DriverName names the isolation back end.
func (n *Node) DriverName() string { return n.o.Driver.Name() }

// StartPool begins filling the warm pool in the background.
func (n *Node) StartPool() {
	if n.o.WarmPool <= 0 || len(n.o.WarmTemplates) == 0 {
		return
	}
	n.wg.Add(1)
	go n.fillPool()
	n.kickPool()
}

func (n *Node) kickPool() {
	select {
	case n.poolWant <- struct{}{}:
	default:
	}
}

func (n *Node) fillPool() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.poolWant:
		}
		// Let the claim that asked for a refill finish first: on a small
		// host a new sandbox competes with it for the same CPUs.
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(refillDelay):
		}
		for _, name := range n.o.WarmTemplates {
			for {
				n.mu.Lock()
				have := len(n.pool[name])
				n.mu.Unlock()
				if have >= n.o.WarmPool || n.ctx.Err() != nil {
					break
				}
				tpl, err := n.o.Templates.Get(name)
				if err != nil {
					n.o.Logf("warm pool: template %s: %v", name, err)
					break
				}
				inst, err := n.o.Driver.Create(n.ctx, driver.Spec{
					ID: core.NewID("sbx-"), Hostname: "sandbox", RootfsDir: tpl.RootfsDir, Limits: n.o.DefaultLimits,
				})
				if err != nil {
					n.o.Logf("warm pool: create: %v", err)
					break
				}
				n.mu.Lock()
				n.pool[name] = append(n.pool[name], inst)
				n.mu.Unlock()
			}
		}
	}
}

func (n *Node) claim(template string) driver.Instance {
	n.mu.Lock()
	defer n.mu.Unlock()
	list := n.pool[template]
	if len(list) == 0 {
		return nil
	}
	inst := list[len(list)-1]
	n.pool[template] = list[:len(list)-1]
	return inst
}

// PoolSize returns how many warm sandboxes wait for a template.
func (n *Node) PoolSize(template string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.pool[template])
}

func driverLimits(l core.Limits) driver.Limits {
	return driver.Limits{MemoryBytes: l.MemoryBytes, CPUMillis: l.CPUMillis, Pids: l.Pids, DiskBytes: l.DiskBytes}
}

// HasTemplate implements core.Runtime.
func (n *Node) HasTemplate(ctx context.Context, name string) error {
	if _, err := n.o.Templates.Get(name); err != nil {
		if errors.Is(err, template.ErrNotFound) {
			return fmt.Errorf("template %q: %w", name, core.ErrNotFound)
		}
		return err
	}
	return nil
}

// StartSandbox implements core.Runtime.
func (n *Node) StartSandbox(ctx context.Context, sb core.Sandbox, progress core.Progress) (core.Placement, error) {
	return n.startSandbox(ctx, sb, progress, nil, nil)
}

// startSandbox starts sb; initLayer, if set, fills its writable layer
// first (a restore), which rules out a warm-pool instance. restore, if
// set, replaces the driver's Create (a process snapshot's restore).
func (n *Node) startSandbox(ctx context.Context, sb core.Sandbox, progress core.Progress, initLayer func(context.Context, driver.Layer) error,
	restore func(context.Context, driver.Spec) (driver.Instance, error)) (_ core.Placement, err error) {
	t0, source := time.Now(), "cold"
	if initLayer != nil || restore != nil {
		source = "restore"
	}
	defer func() { n.observer().SandboxStarted(n.o.Driver.Name(), source, time.Since(t0), err) }()
	if mx := n.o.MaxDiskBytes; mx > 0 && sb.Limits.DiskBytes > mx {
		return core.Placement{}, fmt.Errorf("disk_bytes %d above this node's maximum %d: %w", sb.Limits.DiskBytes, mx, core.ErrInvalid)
	}
	tpl, err := n.o.Templates.Get(sb.TemplateKey())
	if err != nil {
		return core.Placement{}, fmt.Errorf("template %q: %w", sb.Template, core.ErrNotFound)
	}
	var inst driver.Instance
	// Warm sandboxes have the default disk, whose size is fixed: another
	// disk limit needs a sandbox of its own.
	if initLayer == nil && sb.Limits.DiskBytes == n.o.DefaultLimits.DiskBytes {
		inst = n.claim(sb.TemplateKey())
		if n.isWarmTemplate(sb.TemplateKey()) {
			n.observer().WarmPoolClaim(sb.TemplateKey(), inst != nil)
		}
	}
	if inst != nil {
		source = "warm"
		defer n.kickPool()
		if err := inst.SetLimits(ctx, driverLimits(sb.Limits)); err != nil {
			inst.Destroy(context.WithoutCancel(ctx))
			return core.Placement{}, fmt.Errorf("apply limits: %w", err)
		}
		progress(50, "claimed a warm sandbox")
	} else {
		create := n.o.Driver.Create
		if restore != nil {
			create = restore
		}
		inst, err = create(ctx, driver.Spec{
			ID: sb.ID, Hostname: "sandbox", RootfsDir: tpl.RootfsDir, Limits: driverLimits(sb.Limits),
			InitLayer: initLayer,
		})
		if err != nil {
			return core.Placement{}, fmt.Errorf("create sandbox: %w", err)
		}
		progress(80, "sandbox started")
	}
	// The instance's network has been blocked since before its first
	// instruction; now it gets the sandbox's own policy.
	if err := n.applyNetwork(inst.ID(), sb.Network); err != nil {
		inst.Destroy(context.WithoutCancel(ctx))
		return core.Placement{}, err
	}
	h := newSandbox(sb.ID, inst, filepath.Join(n.o.LogDir, sb.ID), n)
	h.publicPorts = sb.PublicPorts
	h.ProjectID = sb.ProjectID
	cfg := agent.Config{Env: map[string]string{}, Cwd: tpl.Defaults.Cwd, User: tpl.Defaults.User}
	for k, v := range tpl.Defaults.Env {
		cfg.Env[k] = v
	}
	if n.o.Network != nil && sb.Network != nil {
		// HTTP_PROXY and friends: the explicit proxy on the sandbox's GW,
		// when its policy allows anything.
		for k, v := range n.o.Network.ProxyEnv(inst.ID(), sb.Network.Mode) {
			cfg.Env[k] = v
		}
	}
	for k, v := range sb.Env {
		cfg.Env[k] = v
	}
	// The command log dir is made by the first log that outgrows memory
	// (execlog): most sandboxes never need it.
	if err := h.Agent.SetConfig(ctx, cfg); err != nil {
		h.destroy(context.WithoutCancel(ctx))
		return core.Placement{}, fmt.Errorf("configure agent: %w", err)
	}
	if restore != nil {
		// Commands that ran at the checkpoint run on: record their output.
		n.followRestored(ctx, h)
	}
	n.mu.Lock()
	n.sandboxes[sb.ID] = h
	n.mu.Unlock()
	n.watch(h)
	return core.Placement{Driver: n.o.Driver.Name(), Instance: inst.ID()}, nil
}

// watch reports a sandbox lost when its instance dies while this node still
// runs it (a deliberate stop removes it from the map first).
func (n *Node) watch(h *Sandbox) {
	d, ok := driver.As[interface{ Done() <-chan struct{} }](h.inst)
	if !ok || n.o.OnLost == nil {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		select {
		case <-n.ctx.Done():
			return
		case <-d.Done():
		}
		n.mu.Lock()
		mine := n.sandboxes[h.ID] == h
		n.mu.Unlock()
		if mine {
			n.o.OnLost(h.ID, "the sandbox's init process (its agent) exited")
		}
	}()
}

// stopWaitsForSnapshot bounds how long a stop waits for a snapshot of the
// sandbox in flight.
const stopWaitsForSnapshot = 2 * time.Minute

// StopSandbox implements core.Runtime.
func (n *Node) StopSandbox(ctx context.Context, id string) error {
	n.mu.Lock()
	h := n.sandboxes[id]
	delete(n.sandboxes, id)
	n.mu.Unlock()
	if h == nil {
		return nil
	}
	t0 := time.Now()
	// A snapshot in flight ends first (its checkpoint is bounded): it no
	// longer finds the sandbox, so nothing new starts. If it does not
	// end in time the sandbox dies under it, which fails it.
	wctx, cancel := context.WithTimeout(ctx, stopWaitsForSnapshot)
	if h.lockState(wctx) == nil {
		defer h.unlockState()
	}
	cancel()
	n.thaw(ctx, h) // a v1-frozen task would not even die
	err := h.destroy(ctx)
	n.observer().SandboxStopped(n.o.Driver.Name(), time.Since(t0), err)
	return err
}

// AdoptSandbox implements core.Runtime.
func (n *Node) AdoptSandbox(ctx context.Context, sb core.Sandbox) error {
	instID := sb.Instance
	if instID == "" {
		instID = sb.ID
	}
	inst, err := n.o.Driver.Attach(ctx, instID)
	if err != nil {
		return err
	}
	if err := n.applyNetwork(inst.ID(), sb.Network); err != nil {
		n.o.Logf("sandbox %s: network policy: %v", sb.ID, err)
	}
	h := newSandbox(sb.ID, inst, filepath.Join(n.o.LogDir, sb.ID), n)
	h.publicPorts = sb.PublicPorts
	h.ProjectID = sb.ProjectID
	// A crash may have left it frozen (paused, or mid-snapshot): its agent
	// must answer below; a paused one is frozen again after.
	n.thaw(ctx, h)
	// The previous process's command logs are not trustworthy (their index
	// was in memory); start them again from what the agent still retains.
	os.RemoveAll(h.logDir)
	procs, err := h.Agent.List(ctx)
	if err != nil {
		h.destroy(ctx)
		return fmt.Errorf("agent does not answer: %w", err)
	}
	for _, p := range procs {
		if err := h.follow(p, nil); err != nil {
			n.o.Logf("sandbox %s: follow command %s: %v", sb.ID, p.ID, err)
		}
	}
	if sb.State == core.SandboxPaused {
		if err := n.freeze(ctx, h); err != nil {
			h.destroy(ctx)
			return err
		}
	}
	n.mu.Lock()
	n.sandboxes[sb.ID] = h
	n.mu.Unlock()
	n.watch(h)
	return nil
}

// Sweep implements core.Runtime: leftovers of instances not in keep go,
// and so do command logs of sandboxes this node does not run.
func (n *Node) Sweep(ctx context.Context, keep map[string]bool) error {
	n.mu.Lock()
	for _, list := range n.pool {
		for _, inst := range list {
			keep[inst.ID()] = true
		}
	}
	live := map[string]bool{}
	for id, h := range n.sandboxes {
		keep[h.inst.ID()] = true
		live[id] = true
	}
	n.mu.Unlock()
	if err := n.o.Driver.Sweep(ctx, keep); err != nil {
		return err
	}
	entries, err := os.ReadDir(n.o.LogDir)
	if err != nil {
		return fmt.Errorf("read log dir: %w", err)
	}
	for _, e := range entries {
		if !live[e.Name()] {
			os.RemoveAll(filepath.Join(n.o.LogDir, e.Name()))
		}
	}
	return nil
}

// applyNetwork sets an instance's egress policy (nil = blocked).
func (n *Node) applyNetwork(instID string, p *core.NetworkPolicy) error {
	if n.o.Network == nil {
		if p != nil && p.Mode != string(policy.Blocked) && p.Mode != "" {
			return fmt.Errorf("network mode %s: no egress gateway on this node: %w", p.Mode, core.ErrUnavailable)
		}
		return nil
	}
	var parsed *policy.Policy
	if p != nil {
		var err error
		if parsed, err = policy.Parse(p.Mode, p.Allow); err != nil {
			return fmt.Errorf("network policy: %w", err)
		}
	}
	if err := n.o.Network.GW.SetPolicy(instID, parsed); err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	return nil
}

// NetworkEnabled implements core.NetworkRuntime.
func (n *Node) NetworkEnabled() bool { return n.o.Network != nil }

// SetNetworkPolicy implements core.NetworkRuntime.
func (n *Node) SetNetworkPolicy(ctx context.Context, sb core.Sandbox, p core.NetworkPolicy) error {
	h, err := n.Sandbox(sb.ID)
	if err != nil {
		return err
	}
	return n.applyNetwork(h.inst.ID(), &p)
}

// NetworkLog implements core.NetworkRuntime.
func (n *Node) NetworkLog(ctx context.Context, sb core.Sandbox, after uint64, limit int) (core.NetworkLog, error) {
	out := core.NetworkLog{Decisions: []core.NetworkDecision{}}
	if n.o.Network == nil {
		return out, nil
	}
	h, err := n.Sandbox(sb.ID)
	if err != nil {
		return out, err
	}
	id := h.inst.ID()
	ds, err := n.o.Network.GW.Log(id, after, limit)
	if err != nil {
		return out, fmt.Errorf("network log: %w", core.ErrNotFound)
	}
	for _, d := range ds {
		out.Decisions = append(out.Decisions, core.NetworkDecision(d))
	}
	out.Counters = map[string]uint64{}
	if ctr, err := n.o.Network.Counters(id); err == nil {
		for k, v := range ctr {
			out.Counters["nft_"+k] = v
		}
	}
	if st, err := n.o.Network.GW.Stats(id); err == nil {
		out.Counters["upstream_sockets"] = st.UpstreamSockets
		out.Counters["dns_queries"] = st.DNSQueries
		out.Counters["dns_refused"] = st.DNSRefused
		out.Counters["conns_allowed"] = st.ConnsAllowed
		out.Counters["conns_denied"] = st.ConnsDenied
	}
	return out, nil
}

// captureWait bounds how long a data-plane call waits for a snapshot's
// freeze to end (a periodic checkpoint freezes a running sandbox for its
// capture: a call then waits instead of failing as if it were paused).
const captureWait = 30 * time.Second

// Sandbox returns a running sandbox by id.
func (n *Node) Sandbox(id string) (*Sandbox, error) {
	deadline := time.Now().Add(captureWait)
	for {
		n.mu.Lock()
		h := n.sandboxes[id]
		n.mu.Unlock()
		if h == nil {
			return nil, fmt.Errorf("sandbox %s is not running here: %w", id, core.ErrNotFound)
		}
		if !h.paused.Load() {
			h.lastActive.Store(time.Now().UnixNano())
			return h, nil
		}
		if h.capturing.Load() == 0 || time.Now().After(deadline) {
			return nil, fmt.Errorf("sandbox %s is paused; resume it first: %w", id, core.ErrConflict)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PausedPublic reports whether id is a sandbox of this node that is paused
// and has public ports: the port forwarder answers its paused state to a
// request without a credential, as it would to one with a credential.
func (n *Node) PausedPublic(id string) bool {
	n.mu.Lock()
	h := n.sandboxes[id]
	n.mu.Unlock()
	return h != nil && h.paused.Load() && h.publicPorts
}

// Running returns the sandboxes of this node that run (not paused), in no
// particular order.
func (n *Node) Running() []*Sandbox {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*Sandbox, 0, len(n.sandboxes))
	for _, h := range n.sandboxes {
		if !h.paused.Load() {
			out = append(out, h)
		}
	}
	return out
}

// Count returns how many sandboxes the node runs (after Close: the ones
// that outlive the process; warm-pool sandboxes are not counted).
func (n *Node) Count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.sandboxes)
}

// Close stops background work, destroys warm-pool sandboxes and closes the
// driver (driver.Close: the namespace driver's fork helper). Running
// sandboxes are left alone: they outlive the server process.
func (n *Node) Close(ctx context.Context) {
	n.cancel()
	n.wg.Wait()
	n.mu.Lock()
	pool := n.pool
	n.pool = map[string][]driver.Instance{}
	hs := make([]*Sandbox, 0, len(n.sandboxes))
	for _, h := range n.sandboxes {
		hs = append(hs, h)
	}
	n.mu.Unlock()
	for _, list := range pool {
		for _, inst := range list {
			inst.Destroy(ctx)
		}
	}
	for _, h := range hs {
		h.closeLogs()
	}
	driver.Close(n.o.Driver)
}

// Sandbox is one running sandbox on this node.
type Sandbox struct {
	ID     string
	Agent  *client.Client
	inst   driver.Instance
	logDir string
	node   *Node
	logs   *execlog.Budget // bounds what its commands' logs keep

	mu   sync.Mutex
	cmds map[string]*Command
	wg   sync.WaitGroup

	// publicPorts: forwarded ports need no token (core.Sandbox.PublicPorts).
	publicPorts bool

	// ProjectID owns the sandbox (E2B signed file URLs are checked
	// against a token bound to it).
	ProjectID string
	// openTunnels counts forwarded connections open now (not parked ones).
	openTunnels atomic.Int64
	// parked holds one idle forwarded connection per port between
	// requests (TakePort, ParkPort); parkEpoch changes whenever they are
	// dropped, so a connection in use then is not parked after.
	parkMu    sync.Mutex
	parked    map[int]parkedConn
	parkEpoch atomic.Uint64

	paused atomic.Bool // frozen: the data plane is refused
	// state is a one-slot lock held by whatever changes the instance's
	// run state: a snapshot (the driver's checkpoint hands the agent's
	// listener off and freezes), a pause or resume, and the stop. Two
	// checkpoints at once (a periodic one and a drain's hibernate) made
	// the second find no listener and keep files only, and a stop during
	// a dump killed the tasks CRIU was detaching from.
	state chan struct{}
	// capturing counts snapshots of the running sandbox in flight: the
	// data plane waits for them rather than refusing.
	capturing atomic.Int32
	gone      atomic.Bool // being destroyed: readers stop retrying
	// lastActive is when the data plane last used the sandbox or a
	// command of it ended (unix ns), for auto-pause.
	lastActive atomic.Int64
	// HasBash is set once the E2B envd emulation found /bin/bash in the
	// sandbox: E2B's SDKs run every command as /bin/bash -l -c, and a
	// stat through the agent per command was one more agent round trip
	// on each commands.run. Only a yes is kept (bash does not go away
	// under a running sandbox by itself; a template without it asks again).
	HasBash atomic.Bool
}

func newSandbox(id string, inst driver.Instance, logDir string, n *Node) *Sandbox {
	s := &Sandbox{ID: id, inst: inst, logDir: logDir, node: n, cmds: map[string]*Command{}, state: make(chan struct{}, 1),
		Agent: client.New(inst.Dial), logs: execlog.NewBudget(n.o.MaxLogBytes)}
	s.lastActive.Store(time.Now().UnixNano())
	return s
}

// Timing returns how the sandbox's creation time was spent.
func (s *Sandbox) Timing() driver.Timing { return s.inst.Timing() }

// lockState takes s.state, waiting at most until ctx ends.
func (s *Sandbox) lockState(ctx context.Context) error {
	select {
	case s.state <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sandbox %s: waiting for its snapshot, pause or resume in progress: %w", s.ID, ctx.Err())
	}
}

func (s *Sandbox) unlockState() { <-s.state }

func (s *Sandbox) destroy(ctx context.Context) error {
	s.gone.Store(true)
	s.dropParked()
	err := s.inst.Destroy(ctx)
	s.closeLogs()
	s.wg.Wait()
	os.RemoveAll(s.logDir)
	return err
}

func (s *Sandbox) closeLogs() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.cmds {
		c.Log.Finish()
	}
}

// Command is a command started in a sandbox, with its host-side output log.
type Command struct {
	Info agent.ProcessInfo
	Log  *execlog.Log

	mu   sync.Mutex
	exit *agent.Exit
}

// Exit returns how the command ended, or nil while it runs.
func (c *Command) Exit() *agent.Exit {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exit
}

// Exec starts a command and begins recording its output.
func (s *Sandbox) Exec(ctx context.Context, spec agent.ProcessSpec) (_ *Command, err error) {
	t0 := time.Now()
	defer func() { s.node.observer().CommandStarted(s.node.o.Driver.Name(), time.Since(t0), err) }()
	s.mu.Lock()
	n := len(s.cmds)
	s.mu.Unlock()
	if n >= s.node.o.MaxCommands {
		s.pruneFinished()
		s.mu.Lock()
		n = len(s.cmds)
		s.mu.Unlock()
		if n >= s.node.o.MaxCommands {
			return nil, fmt.Errorf("sandbox has %d recorded commands: %w", n, core.ErrExhausted)
		}
	}
	// The command's events come on the start's own request: the pump
	// needs no second round trip to the agent.
	info, er, err := s.Agent.StartEvents(ctx, s.node.ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := s.follow(info, er); err != nil {
		if er != nil {
			er.Close()
		}
		s.Agent.Signal(context.WithoutCancel(ctx), info.ID, "SIGKILL")
		return nil, err
	}
	return s.Command(info.ID)
}

// pruneFinished drops the oldest finished commands' logs.
func (s *Sandbox) pruneFinished() {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]int, 0, len(s.cmds))
	for id, c := range s.cmds {
		if c.Exit() != nil {
			if n, err := strconv.Atoi(id); err == nil {
				ids = append(ids, n)
			}
		}
	}
	sort.Ints(ids)
	for _, n := range ids[:(len(ids)+1)/2] {
		id := strconv.Itoa(n)
		s.cmds[id].Log.Close()
		os.Remove(filepath.Join(s.logDir, id+".log"))
		delete(s.cmds, id)
	}
}

// follow records a started command and pumps its events from er (nil: the
// pump opens the stream itself).
func (s *Sandbox) follow(info agent.ProcessInfo, er *client.EventReader) error {
	if !validCmdID(info.ID) {
		return fmt.Errorf("agent returned a bad command id %.32q", info.ID)
	}
	l, err := s.logs.Create(filepath.Join(s.logDir, info.ID+".log"))
	if err != nil {
		return err
	}
	startOOM, _ := s.inst.OOMKills()
	c := &Command{Info: info, Log: l}
	s.mu.Lock()
	if _, dup := s.cmds[info.ID]; dup {
		s.mu.Unlock()
		l.Close()
		return fmt.Errorf("agent reused command id %s", info.ID)
	}
	s.cmds[info.ID] = c
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		s.pump(c, startOOM, er)
	}()
	return nil
}

func validCmdID(id string) bool {
	n, err := strconv.ParseUint(id, 10, 32)
	return err == nil && n > 0 && strconv.FormatUint(n, 10) == id
}

// pump copies the agent's event stream into the command's log. It is the
// one reader the agent always has for a command, so its output never stalls
// and never depends on a client being connected.
func (s *Sandbox) pump(c *Command, startOOM uint64, er *client.EventReader) {
	// A command's end is activity for auto-pause.
	defer func() { s.lastActive.Store(time.Now().UnixNano()) }()
	ctx := s.node.ctx
	var after uint64
	for attempt := 0; attempt < 5; attempt++ {
		var err error
		if er == nil {
			er, err = s.Agent.Events(ctx, c.Info.ID, after)
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond)
			if s.paused.Load() && !s.gone.Load() {
				// A checkpoint of a paused sandbox released the agent's
				// listener; it listens again once resumed.
				attempt = min(attempt, 2) - 1
			}
			continue
		}
		for {
			ev, err := er.NextShared() // the log copies what it keeps
			if err != nil {
				er.Close()
				er = nil
				break
			}
			after = ev.Seq
			if ev.Type == agent.EventExit {
				var ex agent.Exit
				if json.Unmarshal(ev.Data, &ex) != nil {
					ex = agent.Exit{Code: -1, Error: "agent sent a malformed exit event"}
				}
				if ex.Signal == "SIGKILL" && !ex.TimedOut {
					if now, err := s.inst.OOMKills(); err == nil && now > startOOM {
						ex.OOMKilled = true
						s.logOOM(c, now)
					}
				}
				c.finish(&ex)
				s.node.observer().CommandExited(ExitReason(&ex))
				return
			}
			if ev.Type != agent.EventStdout && ev.Type != agent.EventStderr {
				continue
			}
			if _, err := c.Log.Append(ev.Type, ev.Data); err != nil {
				s.node.o.Logf("sandbox %s: command %s: %v", s.ID, c.Info.ID, err)
				return
			}
		}
	}
	c.finish(&agent.Exit{Code: -1, Error: "lost contact with the sandbox agent"})
	s.node.observer().CommandExited("lost")
}

func (c *Command) finish(ex *agent.Exit) {
	raw, _ := json.Marshal(ex)
	c.mu.Lock()
	c.exit = ex
	c.mu.Unlock()
	c.Log.Append(execlog.Exit, raw)
}

// Command returns a recorded command.
func (s *Sandbox) Command(id string) (*Command, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cmds[id]
	if c == nil {
		return nil, fmt.Errorf("command %.32q: %w", id, core.ErrNotFound)
	}
	return c, nil
}

// Commands lists recorded commands ordered by id.
func (s *Sandbox) Commands() []*Command {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Command, 0, len(s.cmds))
	for _, c := range s.cmds {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		a, _ := strconv.Atoi(out[i].Info.ID)
		b, _ := strconv.Atoi(out[j].Info.ID)
		return a < b
	})
	return out
}
