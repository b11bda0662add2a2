package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/fdhygiene"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/e2b"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/template"
)

var nodeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// NodeConfig is what `space node` needs beyond the node-side fields of
// Config (DataDir, Store, NodeName, TemplateDir, AddrFile, RunDir, Driver,
// Runsc, QEMUAccel, AgentPath, WarmPool, WarmTemplates, Builtins,
// DefaultLimits, UIDBase, DataListen, DataURL, Logf). Config.Listen is the
// node RPC address.
type NodeConfig struct {
	// Secret is the cluster secret servers sign node requests with.
	Secret []byte
	// RPCURL is the RPC address servers are told (default
	// https://Listen, http:// with Plaintext).
	RPCURL string
	// TLS is the node's certificate, key and the cluster CA: the RPC is
	// served over mutual TLS to replicas with a certificate from that CA.
	// Plaintext serves it without TLS instead (loopback --listen only).
	TLS       cluster.TLSFiles
	Plaintext bool
	// Heartbeat is the interval of registry updates (default 1 s).
	Heartbeat time.Duration
	// Capacity offered to the scheduler: 0 = the host's CPUs and memory.
	CPUMillis    int64
	MemoryBytes  int64
	MaxSandboxes int // 0 = no bound
}

// NodeProcess is a running `space node`: its driver, templates, warm pool
// and data plane, the node RPC API, and its heartbeat.
type NodeProcess struct {
	cfg        Config
	nc         NodeConfig
	store      core.Store
	ns         core.NodeStore
	node       *node.Node
	tm         *template.Manager
	templates  *Templates
	builds     *nodeBuilds // template builds over the API and their copies (nodebuild.go)
	svc        *core.Service
	engine     *core.Engine
	rt         *trackedRuntime
	rpc, data  *http.Server
	rpcLn      net.Listener
	dataLn     net.Listener
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	started    time.Time
	rpcURL     string
	dataURL    string
	driverName string
	// snapStore names the shared snapshot store ("" = none).
	snapStore string
	// net is the egress gateway and sandbox networks (nil without
	// Config.Egress); metrics serves its counters.
	net     *egress.Network
	metrics *http.Server
	ranges  *core.EgressRanges // its effective sets, in the heartbeat
}

// trackedRuntime is the node's runtime with the capacity it has committed
// (the limits of the sandboxes it runs or is starting), for heartbeats and
// admission.
type trackedRuntime struct {
	*runtime
	max int
	// eg is the egress wiring (nil: sandboxes without network).
	eg *egressRuntime
	// net remembers the credentials of each sandbox's applied policy.
	net netState

	mu   sync.Mutex
	live map[string]core.Limits
	// gen numbers the committed set (cluster.Generations): bumped on every
	// change, from the node's start time in nanoseconds so that a
	// restarted node is ahead of what its previous process reported;
	// added says at which generation each live sandbox came.
	gen   uint64
	added map[string]uint64
	// freed is signalled when a sandbox lets its capacity go, so that the
	// node heartbeats soon: other replicas learn of a delete only that way.
	freed chan struct{}
}

var _ cluster.Generations = (*trackedRuntime)(nil)

// Generation implements cluster.Generations.
func (t *trackedRuntime) Generation() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gen
}

// AddedAt implements cluster.Generations.
func (t *trackedRuntime) AddedAt(id string) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.added[id]
}

// commit records id's limits (t.mu held).
func (t *trackedRuntime) commit(id string, l core.Limits) {
	if _, ok := t.live[id]; !ok {
		t.gen++
		t.added[id] = t.gen
	}
	t.live[id] = l
}

func (t *trackedRuntime) reserve(sb core.Sandbox) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.live[sb.ID]; !ok && t.max > 0 && len(t.live) >= t.max {
		return fmt.Errorf("node runs %d sandboxes, its maximum: %w", len(t.live), core.ErrExhausted)
	}
	t.commit(sb.ID, sb.Limits)
	return nil
}

func (t *trackedRuntime) release(id string) {
	t.mu.Lock()
	if _, ok := t.live[id]; ok {
		t.gen++
		delete(t.live, id)
		delete(t.added, id)
		select {
		case t.freed <- struct{}{}:
		default:
		}
	}
	t.mu.Unlock()
	t.net.mu.Lock()
	t.net.set(id, nil)
	t.net.mu.Unlock()
}

func (t *trackedRuntime) StartSandbox(ctx context.Context, sb core.Sandbox, progress core.Progress) (core.Placement, error) {
	if t.eg != nil {
		return t.StartSandboxWithCredentials(ctx, sb, nil, progress)
	}
	if err := t.reserve(sb); err != nil {
		return core.Placement{}, err
	}
	pl, err := t.runtime.StartSandbox(ctx, sb, progress)
	if err != nil {
		t.release(sb.ID)
	}
	return pl, err
}

func (t *trackedRuntime) StartSandboxFromSnapshot(ctx context.Context, sb core.Sandbox, chain []string, progress core.Progress) (core.Placement, error) {
	if err := t.reserve(sb); err != nil {
		return core.Placement{}, err
	}
	pl, err := t.runtime.StartSandboxFromSnapshot(ctx, sb, chain, progress)
	if err != nil {
		t.release(sb.ID)
	}
	return pl, err
}

// lifecycleOnly is the node's runtime as its own core.Service sees it: the
// lifecycle without snapshots, so that the service's start-up
// reconciliation leaves the cluster's snapshot records to the servers
// (StartNode collects this node's unreferenced snapshot data itself).
type lifecycleOnly struct{ t *trackedRuntime }

func (l lifecycleOnly) StartSandbox(ctx context.Context, sb core.Sandbox, p core.Progress) (core.Placement, error) {
	return l.t.StartSandbox(ctx, sb, p)
}
func (l lifecycleOnly) StopSandbox(ctx context.Context, id string) error {
	return l.t.StopSandbox(ctx, id)
}
func (l lifecycleOnly) AdoptSandbox(ctx context.Context, sb core.Sandbox) error {
	return l.t.AdoptSandbox(ctx, sb)
}
func (l lifecycleOnly) Sweep(ctx context.Context, keep map[string]bool) error {
	return l.t.Sweep(ctx, keep)
}
func (l lifecycleOnly) HasTemplate(ctx context.Context, name string) error {
	return l.t.HasTemplate(ctx, name)
}

func (t *trackedRuntime) StopSandbox(ctx context.Context, id string) error {
	err := t.runtime.StopSandbox(ctx, id)
	if err == nil {
		t.release(id)
	}
	return err
}

func (t *trackedRuntime) AdoptSandbox(ctx context.Context, sb core.Sandbox) error {
	if err := t.runtime.AdoptSandbox(ctx, sb); err != nil {
		return err
	}
	t.reattachNetwork(ctx, sb)
	t.mu.Lock()
	t.commit(sb.ID, sb.Limits)
	t.mu.Unlock()
	return nil
}

func (t *trackedRuntime) usage() (ids []string, cpu, mem int64, gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, l := range t.live {
		ids = append(ids, id)
		cpu += l.CPUMillis
		mem += l.MemoryBytes
	}
	return ids, cpu, mem, t.gen
}

// hostMemory reads MemTotal from /proc/meminfo (0 if unknown).
func hostMemory() int64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// StartNode starts a `space node`. It needs a store shared with the
// servers (the node registry, sandbox records and the session-token key)
// and the cluster secret.
func StartNode(ctx context.Context, cfg Config, nc NodeConfig) (*NodeProcess, error) {
	if cfg.Logf == nil && cfg.Logger == nil {
		cfg.Logf = DefaultConfig().Logf
	}
	// Nothing this process inherited may reach a sandbox, runsc, qemu or
	// firecracker: children get only what is passed on purpose.
	if err := fdhygiene.MarkInherited(); err != nil {
		return nil, err
	}
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	cfg = withLoggers(cfg)
	if _, err := cluster.CheckSecret(nc.Secret); err != nil {
		return nil, err
	}
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("space node: --name is required: %w", core.ErrInvalid)
	}
	if !nodeNameRE.MatchString(cfg.NodeName) {
		return nil, fmt.Errorf("space node: --name %.80q must match %s: %w", cfg.NodeName, nodeNameRE, core.ErrInvalid)
	}
	if !IsPostgres(cfg.Store) {
		return nil, fmt.Errorf("space node: --store must be the PostgreSQL database the servers use: %w", core.ErrInvalid)
	}
	rpcTLS, err := nodeRPCTLS(cfg.Listen, nc)
	if err != nil {
		return nil, err
	}
	if nc.Heartbeat <= 0 {
		nc.Heartbeat = time.Second
	}
	if nc.CPUMillis <= 0 {
		nc.CPUMillis = int64(goruntime.NumCPU()) * 1000
	}
	if nc.MemoryBytes <= 0 {
		nc.MemoryBytes = hostMemory()
	}
	for _, d := range []string{cfg.DataDir, cfg.RunDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	if cfg.AgentPath == "" {
		p, err := installAgent(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		cfg.AgentPath = p
	}
	p := &NodeProcess{cfg: cfg, nc: nc, started: time.Now().UTC()}
	ok := false
	defer func() {
		if !ok {
			// A start that failed (or was interrupted by SIGTERM) leaves
			// nothing behind but what surviving sandboxes need.
			p.closeAll(context.Background())
			left := 0
			if p.node != nil {
				left = p.node.Count()
			}
			tidyHost(p.cfg, left, p.net)
		}
	}()
	st, err := OpenStore(ctx, cfg.Store, cfg.DataDir, cfg.NodeName, cfg.Logf)
	if err != nil {
		return nil, err // (not into p.store: a typed nil would be closed)
	}
	obs := newMetrics(cfg)
	p.store = obs.Store(st)
	var isNS bool
	if p.ns, isNS = p.store.(core.NodeStore); !isNS {
		return nil, fmt.Errorf("space node: the store keeps no node registry: %w", core.ErrInvalid)
	}
	if cfg.Egress != nil {
		if cfg.Egress.CredentialKeyFile != "" {
			return nil, fmt.Errorf("space node: credentials are stored by the servers, not the node (drop --egress-credential-key): %w", core.ErrInvalid)
		}
		if p.net, err = openNetwork(cfg); err != nil {
			return nil, err
		}
		if p.metrics, err = serveMetrics(cfg.Egress.MetricsListen, p.net.GW, cfg.Logf); err != nil {
			return nil, fmt.Errorf("egress: %w", err)
		}
		logRanges(cfg.Logf, p.net)
		p.ranges = egressRanges(p.net)
	}
	if cfg, err = withDisks(cfg); err != nil {
		return nil, err
	}
	if cfg, err = withUIDPool(cfg); err != nil {
		return nil, err
	}
	favorDynMods(cfg)
	drv, _, err := pickDataDirDriver(cfg, cfg.Logf, p.net)
	if err != nil {
		return nil, err
	}
	p.driverName = drv.Name()
	if cfg.TemplateDir == "" {
		cfg.TemplateDir = filepath.Join(cfg.DataDir, "templates")
	}
	if p.tm, err = template.NewManager(cfg.TemplateDir, template.Options{UIDBase: cfg.UIDBase, UIDCount: 65536, Logf: cfg.Logf}); err != nil {
		return nil, err
	}
	p.templates = &Templates{m: p.tm, logf: cfg.Logf, building: map[string]bool{}, failed: map[string]string{}, store: p.store,
		logDir: filepath.Join(cfg.DataDir, "template-builds"), runner: buildStepRunner(cfg, drv)}
	if p.builds, err = newNodeBuilds(p); err != nil {
		return nil, err
	}
	sharedSnaps, err := openSnapshotStore(ctx, cfg.SnapshotStore, cfg.Logf)
	if err != nil {
		return nil, err
	}
	if sharedSnaps != nil {
		p.snapStore = sharedSnaps.String()
	}
	p.node, err = node.New(node.Options{
		Driver: drv, Templates: p.tm, LogDir: filepath.Join(cfg.DataDir, "logs"),
		WarmPool: cfg.WarmPool, WarmTemplates: cfg.WarmTemplates, SnapshotShared: sharedSnaps,
		DefaultLimits: driverDefaults(cfg), MaxLogBytes: cfg.MaxOutputBytes, MaxDiskBytes: cfg.MaxLimits.DiskBytes,
		Network: p.net,
		// The service is made below; sandboxes only die after StartNode returns.
		OnLost:   func(id, reason string) { p.svc.MarkLost(context.Background(), id, reason) },
		Logf:     cfg.Logf,
		Logger:   cfg.Logger,
		Observer: obs.Node(),
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	broker := core.NewBroker(p.store, time.Now)
	p.engine = core.NewEngine(runCtx, p.store, broker, time.Now, cfg.Logf)
	p.engine.SetLogger(cfg.Logger)
	p.rt = &trackedRuntime{runtime: &runtime{Node: p.node, t: p.templates}, max: nc.MaxSandboxes, live: map[string]core.Limits{},
		freed: make(chan struct{}, 1), gen: uint64(time.Now().UnixNano()), added: map[string]uint64{}, net: netState{creds: map[string][]string{}}}
	if p.net != nil {
		p.rt.eg = &egressRuntime{runtime: p.rt.runtime, net: p.net, logf: cfg.Logf}
	}
	// The node's own service only reconciles at start (adopt what survived,
	// sweep the rest) and reports sandboxes that die on their own.
	p.svc = core.NewService(p.store, p.engine, broker, lifecycleOnly{p.rt}, core.ServiceOptions{NodeName: cfg.NodeName, Logf: cfg.Logf})
	if err := p.svc.Reconcile(ctx); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	// Snapshot data no ready snapshot needs is reclaimed here, before the
	// node serves: no capture can be running on it now.
	ready, err := p.store.ListSnapshots(ctx, core.SnapshotFilter{States: core.SnapshotStatesKept()})
	if err != nil {
		return nil, fmt.Errorf("snapshots: %w", err)
	}
	keep := make([]string, 0, len(ready))
	for _, sn := range ready {
		// Only this node's snapshots have their data here.
		if src, err := p.store.GetSandbox(ctx, "", sn.SandboxID); err == nil && src.Node == cfg.NodeName {
			keep = append(keep, sn.Manifest)
		}
	}
	keep = append(keep, p.builds.manifests()...) // the template layers it advertises
	if res, err := p.node.CollectSnapshots(ctx, keep); err != nil {
		return nil, fmt.Errorf("snapshot gc: %w", err)
	} else {
		cfg.Logf("snapshot gc at start: %+v", res)
	}
	if sharedSnaps != nil {
		// The shared store: what no ready snapshot of the cluster names,
		// and is old enough not to be a capture in flight elsewhere.
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			collectSharedSnapshots(runCtx, p.store, p.builds.collectShared, cfg.Logf)
		}()
	}
	sessions, err := auth.NewSessions(ctx, p.store, time.Now)
	if err != nil {
		return nil, err
	}
	if p.rpcLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	scheme := "http"
	if rpcTLS != nil {
		p.rpcLn, scheme = tls.NewListener(p.rpcLn, rpcTLS), "https"
	}
	if p.dataLn, err = net.Listen("tcp", cfg.DataListen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.DataListen, err)
	}
	p.dataURL = cfg.DataURL
	if p.dataURL == "" {
		p.dataURL = "http://" + p.dataLn.Addr().String()
	}
	p.rpcURL = nc.RPCURL
	if p.rpcURL == "" {
		p.rpcURL = scheme + "://" + p.rpcLn.Addr().String()
	}
	verifier := cluster.NewVerifier(nc.Secret, cfg.NodeName, time.Now)
	p.rpc = &http.Server{Handler: cluster.TemplateRoutes(cluster.NewHandler(p.rt, verifier, cfg.Logf), p.builds, verifier, cfg.Logf), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 16 << 10}
	// Automatic resume on a data-plane call: this node thaws its own
	// paused sandboxes, and wakes a hibernated one through the scheduler
	// as a replica would (it may come back on another node: datawake.go).
	link := nodeLinkClient(nc, cfg.Logf)
	router := &dataRouter{self: cfg.NodeName, local: nodeHas{p.node}, store: p.store, ns: p.ns,
		link: link, logf: cfg.Logf, peers: map[string]*peer{}}
	waker, err := cluster.NewRemote(cluster.RemoteOptions{Store: p.store, Signer: cluster.NewSigner(nc.Secret, time.Now),
		Timeout: cfg.NodeTimeout, Link: link, Logf: cfg.Logf,
		// Wakes are rare: each reads the registry as it is (a drain
		// that just happened counts).
		NodeCacheTTL: -1})
	if err != nil {
		return nil, err
	}
	wakeSvc := core.NewService(p.store, p.engine, broker, nodeWaker{nodePauser: nodePauser{lifecycleOnly{p.rt}}, remote: waker, local: nodeHas{p.node}},
		core.ServiceOptions{NodeName: cfg.NodeName, AnyNode: true, Logf: cfg.Logf})
	envd := e2b.NewEnvd(e2b.EnvdOptions{Node: p.node, Sessions: sessions, Logf: cfg.Logf, SessionTTL: cfg.SessionTTL, Wake: router.wake(wakeSvc.AutoResume)})
	p.data = newDataServer(cfg, p.node, sessions, envd, p.dataURL, wakers{router.wake(wakeSvc.AutoResume), router.wakePublic(wakeSvc.AutoResumePublic)}, nil)
	// Forwarded requests pass the router too: a wake there may move the
	// sandbox on (datawake.go); the router never forwards them otherwise.
	p.data.Handler = router.wrap(p.data.Handler)
	p.rpc.Handler = forwardedData(p.rpc.Handler, p.data.Handler)
	if err := p.startMetrics(runCtx, obs); err != nil {
		return nil, err
	}
	p.startLogging(sessions)
	if scheme == "https" {
		// net/http handshakes *tls.Conn itself and logs refused peers (no
		// client certificate, another CA) here.
		p.rpc.ErrorLog = log.New(logfWriter(cfg.Logf), "node rpc: ", 0)
	} else {
		p.rpcLn = httpx.Listener(p.rpcLn)
	}
	for _, s := range []struct {
		srv *http.Server
		ln  net.Listener
	}{{p.rpc, p.rpcLn}, {p.data, httpx.Listener(p.dataLn)}} {
		s := s
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				cfg.Logf("serve %s: %v", s.ln.Addr(), err)
			}
		}()
	}
	if err := p.heartbeat(ctx); err != nil {
		return nil, fmt.Errorf("first heartbeat: %w", err)
	}
	p.wg.Add(3)
	go func() { defer p.wg.Done(); p.templates.ensure(runCtx, cfg.Builtins, p.node) }()
	go func() { defer p.wg.Done(); p.builds.run(runCtx, nc.Heartbeat) }()
	go func() { defer p.wg.Done(); p.run(runCtx) }()
	if cfg.AddrFile != "" {
		doc := fmt.Sprintf(`{"rpc":%q,"data":%q}`+"\n", p.rpcURL, p.dataURL)
		tmp := cfg.AddrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
			return nil, fmt.Errorf("write addr file: %w", err)
		}
		if err := os.Rename(tmp, cfg.AddrFile); err != nil {
			return nil, fmt.Errorf("write addr file: %w", err)
		}
	}
	ok = true
	cfg.Logf("space node %s: driver %s, RPC on %s, data plane on %s, data dir %s", cfg.NodeName, p.driverName, p.rpcURL, p.dataURL, cfg.DataDir)
	return p, nil
}

// heartbeat stores the node's record. When the record says the node had
// been marked lost, its sandboxes were reported lost: it removes them.
func (p *NodeProcess) heartbeat(ctx context.Context) error {
	var names []string
	if list, err := p.tm.List(); err == nil {
		for _, t := range list {
			if !p.builds.isStale(t.Name) {
				names = append(names, t.Name)
			}
		}
	}
	ids, cpu, mem, gen := p.rt.usage()
	prev, err := p.ns.PutNode(ctx, core.NodeRecord{Name: p.cfg.NodeName, Kind: core.NodeKindNode,
		RPCURL: p.rpcURL, DataURL: p.dataURL, Driver: p.driverName,
		CPUMillis: p.nc.CPUMillis, MemoryBytes: p.nc.MemoryBytes, MaxSandboxes: p.nc.MaxSandboxes,
		UsedCPUMillis: cpu, UsedMemoryBytes: mem, Sandboxes: len(ids), Generation: gen, Templates: names, TemplateLayers: p.builds.adverts(),
		SnapshotStore: p.snapStore, Egress: p.net != nil, EgressRanges: p.ranges, StartedAt: p.started, HeartbeatAt: time.Now().UTC()})
	if err != nil {
		return err
	}
	if prev.State == core.NodeLost {
		p.cfg.Logf("node %s had been marked lost (%s); removing the sandboxes the store no longer gives it", p.cfg.NodeName, prev.StateReason)
		p.resync(ctx, ids)
	}
	return nil
}

// resync stops every sandbox this node runs that the store says is over or
// on another node.
func (p *NodeProcess) resync(ctx context.Context, ids []string) {
	for _, id := range ids {
		sb, err := p.store.GetSandbox(ctx, "", id)
		if err != nil && !errors.Is(err, core.ErrNotFound) {
			continue
		}
		if err == nil && !sb.State.Terminal() && sb.Node == p.cfg.NodeName {
			continue
		}
		if err := p.rt.StopSandbox(ctx, id); err != nil {
			p.cfg.Logf("resync: stop %s: %v", id, err)
		}
	}
}

// freedHeartbeatGap spaces the heartbeats sent because capacity was freed.
const freedHeartbeatGap = 100 * time.Millisecond

func (p *NodeProcess) run(ctx context.Context) {
	t := time.NewTicker(p.nc.Heartbeat)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.rt.freed:
			// A sandbox went: beat now (at most every freedHeartbeatGap),
			// so that replicas which did not stop it see the room.
			select {
			case <-ctx.Done():
				return
			case <-time.After(freedHeartbeatGap):
			}
		}
		if err := p.heartbeat(ctx); err != nil && ctx.Err() == nil {
			p.cfg.Logf("heartbeat: %v", err)
		}
		if n++; n%30 == 0 {
			ids, _, _, _ := p.rt.usage()
			p.resync(ctx, ids)
		}
	}
}

// RPCAddr and DataAddr return the listen addresses.
func (p *NodeProcess) RPCAddr() string  { return p.rpcLn.Addr().String() }
func (p *NodeProcess) DataAddr() string { return p.dataLn.Addr().String() }

// Shutdown stops serving. Sandboxes keep running: a node restarted within
// the cluster's heartbeat timeout re-adopts them. With none left, the host
// table, the sandbox cgroups and the run dir are removed (tidyHost).
func (p *NodeProcess) Shutdown(ctx context.Context) error {
	done := shutdownLog(p.cfg.Logger, "node", p.engine, p.rt.count())
	defer done()
	p.closeAll(ctx)
	if p.node != nil {
		tidyHost(p.cfg, p.node.Count(), p.net)
	}
	return nil
}

func (p *NodeProcess) closeAll(ctx context.Context) {
	for _, h := range []*http.Server{p.rpc, p.data, p.metrics} {
		if h != nil {
			h.Shutdown(ctx)
		}
	}
	for _, ln := range []net.Listener{p.rpcLn, p.dataLn} {
		if ln != nil {
			ln.Close()
		}
	}
	if p.cancel != nil {
		p.cancel()
	}
	if p.engine != nil {
		p.engine.Shutdown(ctx)
	}
	p.wg.Wait()
	if p.node != nil {
		p.node.Close(ctx)
	}
	if p.net != nil {
		p.net.Close()
	}
	if p.tm != nil {
		p.tm.Close()
	}
	if p.store != nil {
		p.store.Close()
	}
}
