// Package server wires a single-process SPACE: the SQLite store, the
// operations engine, the in-process node with its driver, the control API and
// the data plane, each on its own listener.
package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/fdhygiene"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/firecracker"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/internal/driver/namespace"
	"github.com/space-sandbox/space/internal/driver/qemu"
	"github.com/space-sandbox/space/internal/e2b"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/egress/credstore"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/netns"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/portfwd"
	"github.com/space-sandbox/space/internal/store/postgres"
	"github.com/space-sandbox/space/internal/store/sqlite"
	"github.com/space-sandbox/space/internal/template"
	"github.com/space-sandbox/space/internal/uidpool"
	"github.com/space-sandbox/space/internal/vmimage"
)

// Config is everything `space server` needs.
type Config struct {
	DataDir       string // store, sandbox state, logs
	Store         string // "sqlite" or "" (DataDir/space.db, the default), or a postgres:// DSN several servers share
	NodeName      string // this server's node in sandbox records: default "local" (SQLite), host + data-dir hash (PostgreSQL)
	TemplateDir   string // built templates (default DataDir/templates); may be shared between servers on one host
	AddrFile      string // if set, the listen addresses are written here as JSON once serving
	RunDir        string // agent sockets (short path)
	Listen        string // control API address
	DataListen    string // data plane address
	DataURL       string // public data-plane URL handed to clients (default http://DataListen)
	Driver        string // "namespace", "gvisor", "qemu", "firecracker" or "auto"
	Runsc         string // runsc for the gvisor driver (default: the pinned build in /var/cache/space/runsc, then PATH)
	NamespaceCRIU bool   // namespace driver: process checkpoints with CRIU where found (--namespace-criu, default on)
	// NamespaceLazyRestore: restores bring memory in on demand (--namespace-lazy-restore).
	NamespaceLazyRestore bool
	CgroupParent         string // namespace driver: sandboxes' cgroups below this path, not the process's own (--cgroup-parent)
	// CgroupFavorDynMods turns on cgroup v2's favordynmods host-wide before
	// the driver starts (--cgroup-favordynmods; off in a zero Config).
	CgroupFavorDynMods bool
	QEMUAccel          string // qemu driver accelerator: "kvm", "tcg" or "" (KVM when it can run guests, else TCG)
	AgentPath          string // the space binary, exec'd as each sandbox's PID 1
	WarmPool           int
	WarmTemplates      []string
	Builtins           []string // builtin templates to make sure of at start ("minimal", "base")
	DefaultTimeout     time.Duration
	SessionTTL         time.Duration
	DefaultLimits      core.Limits
	MaxLimits          core.Limits
	// UIDBase.. (65536 ids) are the host ids templates' files are stored
	// with, and the ids every sandbox ran under before UIDPool.
	UIDBase uint32
	// UIDPool is "START:COUNT", the host ids (blocks of 65536) sandboxes
	// of the namespace and gvisor drivers each get their own block of;
	// "" is uidpool's default (16777216:1073741824); "off" keeps every
	// sandbox on UIDBase.. as before.
	UIDPool string
	// UIDPoolDir is the pool's allocation registry (default
	// /run/space/uid-pool), shared by every node of the host so none hands
	// out another's block.
	UIDPoolDir string
	// uidPool is UIDPool opened (nil when off).
	uidPool *uidpool.Pool
	// Egress, if set, gives every sandbox a network behind the egress
	// gateway; nil keeps sandboxes without any network.
	Egress *EgressConfig
	Logf   func(string, ...any)
	// Logger receives the structured records: the access log, operations,
	// OOM kills, refusals, shutdown (space server --log-format). nil: they
	// are rendered into Logf; set without Logf, it backs Logf too.
	Logger *slog.Logger
	// Retention: ended sandboxes, finished operations and events older
	// than this are pruned from the store every PruneInterval (default a
	// tenth of it, 1 s to 10 min); 0 keeps them forever.
	Retention     time.Duration
	PruneInterval time.Duration

	// SnapshotStore, if set, is a snapshot store shared between nodes
	// ("dir:/path" or "s3://bucket/prefix?endpoint=host:port"): snapshots
	// are written there too, so another node can restore them; the data
	// dir keeps a cache. "" keeps snapshots in the data dir only.
	SnapshotStore string

	// RemoteNodes: run no in-process node and no data plane; place
	// sandboxes on registered `space node` processes (see remote.go).
	RemoteNodes   bool
	ClusterSecret []byte        // signs node RPC requests (RemoteNodes, and `space node`)
	NodeTimeout   time.Duration // a node or replica silent this long is lost (default 15 s)
	ProjectQuota  int           // live sandboxes per project with RemoteNodes (0 = no bound)
	// CheckpointDefaults: project ("*" = any other) → checkpoint interval
	// in seconds of its sandboxes that name none, with RemoteNodes.
	CheckpointDefaults map[string]int64
	// ClusterTLS is this replica's node link certificate, key and the
	// cluster CA (RemoteNodes); ClusterPlaintext allows plaintext node
	// links on loopback instead.
	ClusterTLS       cluster.TLSFiles
	ClusterPlaintext bool
	// CredentialKeys is the operator keyring of the credential store the
	// replicas share (RemoteNodes; nil: no credentials): hex keys, the
	// first seals (credstore.ParseKeyring).
	CredentialKeys *credstore.Keyring

	// AllowPrivateRegistries lets template image pulls (source "image",
	// a build file's FROM) dial loopback, private and link-local registry
	// addresses; off, such a registry is refused (an SSRF guard).
	AllowPrivateRegistries bool
	// TemplateReadyTimeout bounds a build's pre-warm: how long the ready
	// check (READY) may take to pass (default 2 minutes).
	TemplateReadyTimeout time.Duration
	// AuditLog is where security decisions go as JSON lines: a file path
	// ("" = DataDir/audit.log) or "-" for standard error.
	AuditLog string
	// Metrics: Prometheus metrics (GET /metrics for admin keys, and the
	// operator listener); see metrics.go.
	Metrics MetricsConfig
	// MaxOutputBytes bounds the command output each sandbox keeps on the
	// host, its commands together (0: node.DefaultMaxLogBytes); past it
	// the oldest output is dropped with a "dropped" marker.
	MaxOutputBytes int64
	// SandboxDomain is the domain of forwarded ports' host form,
	// "<port>-<sandbox id>.<domain>" (wildcard DNS pointing at the data
	// listener); "" derives it from the data URL (portfwd.DefaultDomain).
	SandboxDomain string
	// MaxPortConns bounds the forwarded requests open at once per sandbox
	// (0: portfwd.DefaultMaxConns).
	MaxPortConns int
	// DataTLSCert and DataTLSKey are PEM files of the data listener's
	// certificate and key: with them it serves HTTPS (HTTP/2 and
	// HTTP/1.1) instead of plain HTTP, and the default data URL is https.
	DataTLSCert, DataTLSKey string
	// E2BNetwork is the network of an E2B sandbox whose create asks for
	// none: "blocked" ("" too) or "open" (E2B's own default; needs
	// Egress).
	E2BNetwork string
	// disks makes the sandboxes' disk images where disk limits are on
	// (withDisks).
	disks *diskquota.Manager
}

// Values of Config.E2BNetwork.
const (
	E2BNetworkBlocked = "blocked"
	E2BNetworkOpen    = "open"
)

// EgressConfig configures sandbox networks and the egress gateway. Two
// servers on one host need different Links.IfPrefix, Links.Table and
// Links.Pool.
type EgressConfig struct {
	Links   netns.Config
	Gateway egress.Config
	// UpstreamCAFile names a PEM file of extra roots the gateway trusts
	// when it verifies upstreams whose TLS it terminates (added to the
	// system roots, or to Gateway.UpstreamRoots when that is set).
	UpstreamCAFile string
	// CredentialKeyFile holds the key that encrypts stored credentials
	// (created if missing); empty: a key kept in the store's meta.
	CredentialKeyFile string
	// MetricsListen, if set, serves the gateway's Prometheus counters at
	// /metrics on this address (no authentication: keep it private).
	MetricsListen string
}

// DefaultConfig returns the settings `space server` uses with no flags.
func DefaultConfig() Config {
	return Config{
		DataDir: "/var/lib/space", RunDir: "/run/space",
		Listen: "127.0.0.1:7070", DataListen: "127.0.0.1:7071",
		Driver: "auto", Builtins: []string{"minimal", "base"},
		DefaultTimeout: 15 * time.Minute, SessionTTL: 24 * time.Hour,
		DefaultLimits: core.Limits{MemoryBytes: 512 << 20, CPUMillis: 1000, Pids: 1024},
		MaxLimits:     core.Limits{MemoryBytes: 16 << 30, CPUMillis: 64000, Pids: 65536},
		UIDBase:       100000,
		Logf:          log.Printf,
		Retention:     7 * 24 * time.Hour,
	}
}

// Server is a running single-node SPACE.
type Server struct {
	cfg        Config
	store      core.Store
	engine     *core.Engine
	svc        *core.Service
	node       *node.Node
	templates  *Templates
	tm         *template.Manager
	net        *egress.Network
	creds      *credstore.Store
	audit      *audit.Log
	metrics    *http.Server
	ctrl, data *http.Server
	ctrlLn     net.Listener
	dataLn     net.Listener
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

// favorDynMods applies --cgroup-favordynmods: without it every sandbox
// create waits for an RCU grace period when the driver moves the sandbox's
// processes into their cgroups (package cgroups, dynmods.go). A host that
// cannot is logged and served as it is.
func favorDynMods(cfg Config) {
	if !cfg.CgroupFavorDynMods {
		return
	}
	d, changed, err := cgroups.FavorDynMods()
	switch {
	case err != nil:
		cfg.Logf("cgroups: %s not turned on (%v); each sandbox create may wait an RCU grace period (ms) to join its cgroups", cgroups.DynModsOption, err)
	case changed:
		cfg.Logf("cgroups: turned on %s for the cgroup v2 hierarchy at %s, host-wide (sandboxes join their cgroups without an RCU grace period; --cgroup-favordynmods=false leaves the host as it is)", cgroups.DynModsOption, d.Mount)
	}
}

// pickDriver chooses the strongest driver this host supports and says why
// (the log and GET /v1/info).
func pickDriver(cfg Config, logf func(string, ...any), network *egress.Network) (driver.Driver, string, error) {
	want := cfg.Driver
	if want == "" || want == "auto" {
		reason := "no /dev/kvm (firecracker, qemu+KVM unavailable)"
		if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
			f.Close()
			reason = "/dev/kvm opens but cannot run guests (no vmx/svm): firecracker, qemu+KVM unavailable"
		}
		if vmimage.KVMUsable() {
			reason = "KVM usable"
			switch d, err := newFirecracker(cfg, logf, network); {
			case err == nil:
				logf("driver: firecracker (%s)", reason)
				return d, reason, nil
			default:
				reason += "; firecracker unavailable: " + err.Error()
			}
			cfg.QEMUAccel = "kvm"
			switch d, err := newQEMU(cfg, logf, network); {
			case err == nil:
				logf("driver: qemu with KVM (%s)", reason)
				return d, reason, nil
			default:
				reason += "; qemu unavailable: " + err.Error()
			}
		}
		want = "namespace"
		switch runsc, err := gvisor.FindRunsc(cfg.Runsc); {
		case err != nil:
			reason += "; gvisor unavailable: " + err.Error()
		default:
			// A runsc that answers --version may still be unable to run a
			// sandbox here (platform, user namespaces, cgroups): auto only
			// picks gvisor after one throwaway sandbox ran.
			d, err := newGvisor(cfg, logf, network, true)
			if err == nil {
				nw := "no sandbox network"
				if network != nil {
					nw = "egress network over runsc --network=sandbox"
				}
				reason = fmt.Sprintf("%s; runsc at %s passed a self-test; %s", reason, runsc, nw)
				logf("driver: gvisor (%s)", reason)
				return d, reason, nil
			}
			reason += "; gvisor failed its self-test: " + err.Error()
		}
		logf("driver: namespace (%s)", reason)
		d, err := newNamespace(cfg, logf, network)
		return d, reason, err
	}
	reason := "asked for with --driver " + want
	var d driver.Driver
	var err error
	switch want {
	case "gvisor":
		d, err = newGvisor(cfg, logf, network, false)
	case "qemu":
		d, err = newQEMU(cfg, logf, network)
	case "firecracker":
		d, err = newFirecracker(cfg, logf, network)
	case "namespace":
		d, err = newNamespace(cfg, logf, network)
	default:
		err = fmt.Errorf("driver %q is not available on this build/host", want)
	}
	return d, reason, err
}

// gvisorOf finds the gvisor driver in d or the drivers it wraps.
func gvisorOf(d driver.Driver) (*gvisor.Driver, bool) {
	for i := 0; i < 4 && d != nil; i++ {
		if g, ok := d.(*gvisor.Driver); ok {
			return g, true
		}
		u, ok := d.(interface{ Unwrap() driver.Driver })
		if !ok {
			break
		}
		d = u.Unwrap()
	}
	return nil, false
}

// newNamespace makes the namespace driver; with a network, each sandbox's
// link is set up from its PID 1 before the agent runs.
func newNamespace(cfg Config, logf func(string, ...any), network *egress.Network) (driver.Driver, error) {
	var hook func(ctx context.Context, id string, pid int) error
	if network != nil {
		hook = network.Setup
	}
	d, err := namespace.New(namespace.Options{
		CgroupBase:     cgroupBase(cfg.DataDir),
		StateDir:       filepath.Join(cfg.DataDir, "sandboxes"),
		RunDir:         cfg.RunDir,
		AgentPath:      cfg.AgentPath,
		UIDBase:        cfg.UIDBase,
		UIDCount:       65536,
		Pool:           cfg.uidPool,
		DefaultLimits:  driverDefaults(cfg),
		Disks:          cfg.disks,
		Network:        hook,
		Checkpoints:    cfg.NamespaceCRIU,
		LazyRestore:    cfg.NamespaceLazyRestore,
		LazyRestoreMin: namespace.DefaultLazyRestoreMin,
		CgroupParent:   cfg.CgroupParent,
		Logf:           logf,
	})
	if err != nil || network == nil {
		return d, err
	}
	return network.WrapDriver(d), nil
}

// newQEMU makes the qemu microVM driver (KVM or TCG), its state below
// DataDir/qemu, its sockets (<id>.agent, <id>.qmp) in RunDir beside the
// other drivers' (one driver runs per server) and its host cgroups beside
// the namespace driver's. With an egress network every VM gets a NIC whose
// traffic leaves through the sandbox's veth and the gateway, as a
// namespace sandbox's does.
func newQEMU(cfg Config, logf func(string, ...any), network *egress.Network) (driver.Driver, error) {
	opts := qemu.Options{
		StateDir:   filepath.Join(cfg.DataDir, "qemu"),
		RunDir:     cfg.RunDir,
		AgentPath:  cfg.AgentPath,
		Accel:      cfg.QEMUAccel,
		CgroupBase: cgroupBase(cfg.DataDir) + "-qemu",
		Logf:       logf,
	}
	if network != nil {
		opts.Network = network.Setup
	}
	d, err := qemu.New(opts)
	if err != nil {
		return nil, err
	}
	if network == nil {
		return d, nil
	}
	return network.WrapDriver(d), nil
}

// newFirecracker makes the firecracker driver (KVM hosts only).
func newFirecracker(cfg Config, logf func(string, ...any), network *egress.Network) (driver.Driver, error) {
	if network != nil {
		return nil, errors.New("driver firecracker: egress networks are not supported by this driver yet")
	}
	return firecracker.New(firecracker.Options{
		StateDir:  filepath.Join(cfg.DataDir, "fc"),
		AgentPath: cfg.AgentPath,
		Logf:      logf,
	})
}

// newGvisor makes the gvisor driver, its state beside the namespace
// driver's and its sockets and runsc root below RunDir/gvisor. With a
// network, each sandbox's netns is made and wired (network.SetupPath)
// before runsc starts, and the instances release it like the namespace
// driver's. selfTest runs one throwaway sandbox before answering.
func newGvisor(cfg Config, logf func(string, ...any), network *egress.Network, selfTest bool) (driver.Driver, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := gvisor.Options{
		Runsc:         cfg.Runsc,
		CgroupBase:    cgroupBase(cfg.DataDir) + "-gvisor",
		StateDir:      filepath.Join(cfg.DataDir, "gvisor"),
		RunDir:        filepath.Join(cfg.RunDir, "gvisor"),
		AgentPath:     cfg.AgentPath,
		UIDBase:       cfg.UIDBase,
		UIDCount:      65536,
		Pool:          cfg.uidPool,
		DefaultLimits: driverDefaults(cfg),
		Disks:         cfg.disks,
		Logf:          logf,
	}
	if network != nil {
		opts.Network = network.SetupPath
	}
	d, err := gvisor.New(ctx, opts)
	if err != nil {
		return nil, err
	}
	if selfTest {
		if err := d.SelfTest(ctx); err != nil {
			return nil, err
		}
	}
	if network == nil {
		return d, nil
	}
	return network.WrapDriver(d), nil
}

// cgroupBase names the cgroup directory of this server's sandboxes. The
// default data dir uses "space"; any other gets its own name, so two servers
// on one host (tests, benchmarks) never sweep each other's sandboxes.
func cgroupBase(dataDir string) string {
	if filepath.Clean(dataDir) == DefaultConfig().DataDir {
		return "space"
	}
	sum := sha256.Sum256([]byte(filepath.Clean(dataDir)))
	return "space-" + hex.EncodeToString(sum[:4])
}

// installAgent copies the running binary to dataDir/bin/space, which the
// driver executes as each sandbox's PID 1: the mapped sandbox root must be
// able to reach it, and a copy under the data dir avoids opening up the
// permissions of wherever the operator keeps the binary (e.g. /root).
func installAgent(dataDir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own binary: %w", err)
	}
	// The slim space-agent beside this binary links only the agent: each
	// sandbox's PID 1 then starts faster and holds less memory. Without it
	// the server's own binary serves (`space agent` is the same code).
	src, name := self, "space"
	if slim := filepath.Join(filepath.Dir(self), "space-agent"); isExecutable(slim) {
		src, name = slim, "space-agent"
	}
	dst := filepath.Join(dataDir, "bin", name)
	if err := os.MkdirAll(filepath.Dir(dst), 0o711); err != nil {
		return "", err
	}
	raw, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("read agent binary: %w", err)
	}
	if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, raw) {
		return dst, nil
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o755); err != nil {
		return "", fmt.Errorf("install agent binary: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("install agent binary: %w", err)
	}
	return dst, nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Start opens everything, reconciles state left by a previous process and
// begins serving. It returns once both listeners accept connections.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logf == nil && cfg.Logger == nil {
		cfg.Logf = log.Printf
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
	if cfg.RemoteNodes {
		return startRemote(ctx, cfg)
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
		cfg.Logf("agent binary: %s", p)
	}
	s := &Server{cfg: cfg}
	ok := false
	defer func() {
		if !ok {
			// A start that failed (or was interrupted by SIGTERM) leaves
			// nothing behind but what surviving sandboxes need.
			s.closeAll(context.Background())
			left := 0
			if s.node != nil {
				left = s.node.Count()
			}
			tidyHost(s.cfg, left, s.net)
		}
	}()
	var err error
	if cfg.NodeName, err = nodeName(cfg); err != nil {
		return nil, err
	}
	if s.store, err = OpenStore(ctx, cfg.Store, cfg.DataDir, cfg.NodeName, cfg.Logf); err != nil {
		return nil, err
	}
	obs := newMetrics(cfg)
	s.store = obs.Store(s.store)
	if s.audit, err = openAudit(cfg); err != nil {
		return nil, err
	}
	if cfg.Egress != nil {
		if s.net, err = openNetwork(cfg); err != nil {
			return nil, err
		}
		if s.creds, err = openCredentials(ctx, cfg.DataDir, cfg.Egress.CredentialKeyFile, s.store, s.net.GW.Revoke); err != nil {
			return nil, fmt.Errorf("egress: %w", err)
		}
		if s.metrics, err = serveMetrics(cfg.Egress.MetricsListen, s.net.GW, cfg.Logf); err != nil {
			return nil, fmt.Errorf("egress: %w", err)
		}
		logRanges(cfg.Logf, s.net)
	}
	if cfg, err = withDisks(cfg); err != nil {
		return nil, err
	}
	if cfg, err = withUIDPool(cfg); err != nil {
		return nil, err
	}
	favorDynMods(cfg)
	drv, driverReason, err := pickDataDirDriver(cfg, cfg.Logf, s.net)
	if err != nil {
		return nil, err
	}
	if cfg.TemplateDir == "" {
		cfg.TemplateDir = filepath.Join(cfg.DataDir, "templates")
	}
	tm, err := template.NewManager(cfg.TemplateDir, template.Options{
		UIDBase: cfg.UIDBase, UIDCount: 65536, Logf: cfg.Logf, AllowPrivateRegistries: cfg.AllowPrivateRegistries,
	})
	if err != nil {
		return nil, err
	}
	s.tm = tm
	s.templates = &Templates{m: tm, logf: cfg.Logf, building: map[string]bool{}, failed: map[string]string{}, store: s.store,
		started: map[string]string{}, logDir: filepath.Join(cfg.DataDir, "template-builds"), readyTimeout: cfg.TemplateReadyTimeout,
		runner: buildStepRunner(cfg, drv)}
	sharedSnaps, err := openSnapshotStore(ctx, cfg.SnapshotStore, cfg.Logf)
	if err != nil {
		return nil, err
	}
	s.node, err = node.New(node.Options{
		Driver: drv, Templates: tm, LogDir: filepath.Join(cfg.DataDir, "logs"),
		WarmPool: cfg.WarmPool, WarmTemplates: cfg.WarmTemplates, SnapshotShared: sharedSnaps,
		DefaultLimits: driverDefaults(cfg), MaxLogBytes: cfg.MaxOutputBytes, MaxDiskBytes: cfg.MaxLimits.DiskBytes,
		Network: s.net,
		// The service is made below; sandboxes only die after Start returns.
		OnLost:   func(id, reason string) { s.svc.MarkLost(context.Background(), id, reason) },
		Logf:     cfg.Logf,
		Logger:   cfg.Logger,
		Observer: obs.Node(),
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	broker := core.NewBroker(s.store, time.Now)
	if w, ok := s.store.(core.EventWatcher); ok {
		// Events other replicas store wake this one's followers.
		s.wg.Add(1)
		go func() { defer s.wg.Done(); w.WatchEvents(runCtx, broker.Wake) }()
	}
	s.engine = core.NewEngine(runCtx, s.store, broker, time.Now, cfg.Logf)
	s.engine.SetLogger(cfg.Logger)
	var rt core.Runtime = &runtime{Node: s.node, t: s.templates}
	if s.net != nil {
		rt = &egressRuntime{runtime: rt.(*runtime), net: s.net, creds: s.creds, logf: cfg.Logf}
	}
	s.svc = core.NewService(s.store, s.engine, broker, rt, core.ServiceOptions{
		DefaultTimeout: cfg.DefaultTimeout, DefaultLimits: cfg.DefaultLimits, MaxLimits: cfg.MaxLimits,
		NodeName: cfg.NodeName, Logf: cfg.Logf,
	})
	s.templates.svc, s.templates.engine, s.templates.node = s.svc, s.engine, s.node // for template pre-warm
	if err := s.svc.Reconcile(ctx); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	keys := auth.NewKeys(s.store, time.Now)
	sessions, err := auth.NewSessions(ctx, s.store, time.Now)
	if err != nil {
		return nil, err
	}
	if s.ctrlLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if s.dataLn, err = net.Listen("tcp", cfg.DataListen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.DataListen, err)
	}
	dataTLSConf, err := dataTLS(cfg.DataTLSCert, cfg.DataTLSKey)
	if err != nil {
		return nil, err
	}
	dataURL := cfg.DataURL
	if dataURL == "" {
		dataURL = "http://" + s.dataLn.Addr().String()
		if dataTLSConf != nil {
			dataURL = "https://" + s.dataLn.Addr().String()
		}
	}
	// E2B compatibility: its REST paths (/sandboxes, /v2/sandboxes, ...) on
	// the control listener, envd (routed by E2b-Sandbox-Id) on the data one.
	internalRange := egress.AlwaysInternal
	if s.net != nil {
		internalRange = s.net.GW.Internal
	}
	e2bAPI := e2b.NewAPI(e2b.APIOptions{Service: s.svc, Engine: s.engine, Keys: keys, Sessions: sessions,
		SessionTTL: cfg.SessionTTL, Logf: cfg.Logf, Audit: s.audit, InternalRange: internalRange,
		PortDomain:    func(core.Sandbox) string { return portfwd.NewURLs(dataURL, cfg.SandboxDomain).Domain },
		OpenByDefault: cfg.E2BNetwork == E2BNetworkOpen})
	e2bEnvd := e2b.NewEnvd(e2b.EnvdOptions{Node: s.node, Sessions: sessions, Logf: cfg.Logf, Wake: s.svc.AutoResume,
		SessionTTL: cfg.SessionTTL})
	apiOpts := api.Options{
		Service: s.svc, Engine: s.engine, Broker: broker, Keys: keys, Sessions: sessions,
		Templates: s.templates, Store: s.store, DataURL: dataURL, SandboxDomain: cfg.SandboxDomain, SessionTTL: cfg.SessionTTL, Logf: cfg.Logf,
		Audit: s.audit,
	}
	if s.creds != nil {
		apiOpts.Credentials = s.creds
	}
	ranges := egressRanges(s.net)
	apiOpts.Info = func() api.Info {
		in := api.Info{Driver: drv.Name(), DriverReason: driverReason, Egress: s.net != nil, EgressRanges: ranges}
		if g, ok := gvisorOf(drv); ok {
			path, version := g.Runsc()
			in.Runsc = path + " (" + version + ")"
		}
		return in
	}
	// Both public listeners answer oversize requests with the JSON error
	// envelope: httpx.Limits below net/http's own (higher) header limit, and
	// httpx.Listener for what net/http answers itself.
	s.ctrl = &http.Server{Handler: httpx.Limits(withConsole(e2bAPI.Wrap(api.New(apiOpts)), func() []string { return []string{dataURL} })), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: httpx.ServerMaxHeaderBytes}
	s.data = newDataServer(cfg, s.node, sessions, e2bEnvd, dataURL, serviceWakers(s.svc), s.audit)
	dataLn := httpx.Listener(s.dataLn)
	if dataTLSConf != nil {
		s.data.TLSConfig = dataTLSConf
		s.data.Protocols.SetHTTP2(true)
		s.data.TLSConfig.NextProtos = []string{"h2", "http/1.1"}
		dataLn = tls.NewListener(dataLn, s.data.TLSConfig)
	}
	if err := s.startMetrics(runCtx, obs, cfg.NodeName, drv.Name(), keys); err != nil {
		return nil, err
	}
	s.startLogging(sessions)
	for _, p := range []struct {
		srv *http.Server
		ln  net.Listener
	}{{s.ctrl, httpx.Listener(s.ctrlLn)}, {s.data, dataLn}} {
		p := p
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := p.srv.Serve(p.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				cfg.Logf("serve %s: %v", p.ln.Addr(), err)
			}
		}()
	}
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.svc.RunReaper(runCtx, time.Second) }()
	go func() { defer s.wg.Done(); s.templates.ensure(runCtx, cfg.Builtins, s.node) }()
	startPruner(runCtx, &s.wg, s.store, cfg)
	if cfg.AddrFile != "" {
		doc := fmt.Sprintf(`{"control":"http://%s","data":%q}`+"\n", s.ctrlLn.Addr(), dataURL)
		tmp := cfg.AddrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
			return nil, fmt.Errorf("write addr file: %w", err)
		}
		if err := os.Rename(tmp, cfg.AddrFile); err != nil {
			return nil, fmt.Errorf("write addr file: %w", err)
		}
	}
	ok = true
	cfg.Logf("space server: control API on http://%s, data plane on %s, data dir %s", s.ctrlLn.Addr(), dataURL, cfg.DataDir)
	return s, nil
}

// checkConfig refuses settings the server would otherwise bend silently.
func checkConfig(cfg Config) error {
	if cfg.MaxOutputBytes != 0 && cfg.MaxOutputBytes < node.MinMaxLogBytes {
		return fmt.Errorf("--max-output-bytes %d is below the minimum %d (4 MiB): %w", cfg.MaxOutputBytes, node.MinMaxLogBytes, core.ErrInvalid)
	}
	switch cfg.E2BNetwork {
	case "", E2BNetworkBlocked:
	case E2BNetworkOpen:
		// With --remote-nodes the nodes have the gateway (or refuse).
		if cfg.Egress == nil && !cfg.RemoteNodes {
			return fmt.Errorf("--e2b-network open needs --egress (without the gateway sandboxes have no network): %w", core.ErrInvalid)
		}
	default:
		return fmt.Errorf("--e2b-network %q: want blocked or open: %w", cfg.E2BNetwork, core.ErrInvalid)
	}
	if cfg.RemoteNodes && (cfg.DataTLSCert != "" || cfg.DataTLSKey != "") {
		return fmt.Errorf("--data-tls-cert/--data-tls-key: with --remote-nodes the data listeners are the nodes'; put a TLS front end before them (docs/e2b-compat.md): %w", core.ErrInvalid)
	}
	return nil
}

// IsPostgres reports whether store names a PostgreSQL database.
func IsPostgres(store string) bool {
	return strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://")
}

// OpenStore opens the store named by store ("" or "sqlite": dataDir/space.db;
// a postgres:// DSN: that database, scoped to node; see postgres.Options).
//
// A failed open returns a nil interface, never a nil *Store in one: the
// caller's cleanup closes what is non-nil (a server whose database was not
// up yet panicked there on Kubernetes instead of saying why).
func OpenStore(ctx context.Context, store, dataDir, node string, logf func(string, ...any)) (core.Store, error) {
	switch {
	case store == "" || store == "sqlite":
		st, err := sqlite.Open(ctx, filepath.Join(dataDir, "space.db"))
		if err != nil {
			return nil, err
		}
		return st, nil
	case IsPostgres(store):
		st, err := postgres.Open(ctx, store, postgres.Options{Node: node, Logf: logf})
		if err != nil {
			return nil, err
		}
		return st, nil
	default:
		return nil, fmt.Errorf("store: want sqlite or a postgres:// DSN: %w", core.ErrInvalid)
	}
}

// nodeName returns cfg.NodeName or its default: "local" on SQLite (one
// server), and on PostgreSQL one that differs between replicas: the host
// name and a hash of the data dir.
func nodeName(cfg Config) (string, error) {
	if cfg.NodeName != "" {
		return cfg.NodeName, nil
	}
	if !IsPostgres(cfg.Store) {
		return "local", nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("node name: %w", err)
	}
	return host + "-" + strings.TrimPrefix(cgroupBase(cfg.DataDir), "space-"), nil
}

// Addr returns the control API address.
func (s *Server) Addr() string { return s.ctrlLn.Addr().String() }

// DataAddr returns the data plane address ("" with RemoteNodes: the nodes serve it).
func (s *Server) DataAddr() string {
	if s.dataLn == nil {
		return ""
	}
	return s.dataLn.Addr().String()
}

// Node returns the in-process node (for benchmarks and tests that need its
// per-sandbox create timing or warm-pool state).
func (s *Server) Node() *node.Node { return s.node }

// Network returns the sandbox network and egress gateway (nil without
// Config.Egress), for tests that need its counters or to stop it.
func (s *Server) Network() *egress.Network { return s.net }

// Shutdown stops serving. Running sandboxes keep running; the next start
// re-adopts them. With none left, the host table, the sandbox cgroups and
// the run dir are removed (tidyHost).
func (s *Server) Shutdown(ctx context.Context) error {
	done := shutdownLog(s.cfg.Logger, "server", s.engine, s.liveHere(ctx))
	defer done()
	s.drain(ctx)
	s.closeAll(ctx)
	if s.node != nil {
		tidyHost(s.cfg, s.node.Count(), s.net)
	}
	return nil
}

// drain stops taking connections and lets the operations already accepted
// finish, for at most half the time ctx leaves (5 s without a deadline; the
// rest is for closing): a replica replaced by a rolling restart must lose
// none of them (test/k8s restarts the servers under a stream of creates
// and deletes). What is still running after that is cancelled by closeAll.
func (s *Server) drain(ctx context.Context) {
	if s.engine == nil || s.engine.Running() == 0 {
		return
	}
	// Shutdown closes the listeners at once and then waits for the open
	// connections (long polls among them): not that wait, here.
	for _, h := range []*http.Server{s.ctrl, s.data} {
		if h != nil {
			go h.Shutdown(ctx)
		}
	}
	budget := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		budget = time.Until(dl) / 2
	}
	dctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	t0 := time.Now()
	n := s.engine.Running()
	left := s.engine.Drain(dctx)
	s.cfg.Logger.Info("shutdown: drained operations", "operations", n, "left", left, "duration_ms", time.Since(t0).Milliseconds())
}

func (s *Server) closeAll(ctx context.Context) {
	for _, h := range []*http.Server{s.ctrl, s.data, s.metrics} {
		if h != nil {
			h.Shutdown(ctx)
		}
	}
	for _, ln := range []net.Listener{s.ctrlLn, s.dataLn} {
		if ln != nil {
			ln.Close()
		}
	}
	// A request whose handler was still running when drain found nothing
	// to wait for may have started an operation since (test/k8s: a delete
	// accepted 25 ms before the cancel was lost in a rolling restart); the
	// handlers are done now, so let those finish too.
	if s.engine != nil && s.engine.Running() > 0 {
		budget := 5 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			budget = time.Until(dl) / 2
		}
		dctx, cancel := context.WithTimeout(ctx, budget)
		left := s.engine.Drain(dctx)
		cancel()
		s.cfg.Logger.Info("shutdown: drained operations its last requests started", "left", left)
	}
	if s.cancel != nil {
		s.cancel()
	}
	if s.engine != nil {
		s.engine.Shutdown(ctx)
	}
	s.wg.Wait()
	if s.node != nil {
		s.node.Close(ctx)
	}
	if s.net != nil {
		s.net.Close()
	}
	if s.tm != nil {
		s.tm.Close()
	}
	if s.store != nil {
		s.store.Close()
	}
	s.audit.Close()
}

// openAudit opens the audit log the config names.
func openAudit(cfg Config) (*audit.Log, error) {
	path := cfg.AuditLog
	if path == "" {
		path = filepath.Join(cfg.DataDir, "audit.log")
	}
	return audit.Open(path)
}
