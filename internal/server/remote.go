package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/e2b"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/portfwd"
	"github.com/space-sandbox/space/internal/store/postgres"
)

// startRemote starts a server that runs no node of its own: sandboxes are
// placed on registered `space node` processes (cluster.Remote), clients
// get the data URL of their sandbox's node, and a monitor heartbeats this
// replica and marks silent nodes and replicas lost.
func startRemote(ctx context.Context, cfg Config) (*Server, error) {
	if _, err := cluster.CheckSecret(cfg.ClusterSecret); err != nil {
		return nil, err
	}
	if !IsPostgres(cfg.Store) {
		return nil, fmt.Errorf("--remote-nodes needs a PostgreSQL store that the nodes share (--store postgres://...): %w", core.ErrInvalid)
	}
	if cfg.Egress != nil {
		return nil, fmt.Errorf("--remote-nodes: egress is configured on the nodes, not the server: %w", core.ErrInvalid)
	}
	if cfg.SnapshotStore != "" {
		return nil, fmt.Errorf("--remote-nodes: the shared snapshot store is configured on the nodes (space node --snapshot-store), not the server: %w", core.ErrInvalid)
	}
	if cfg.NodeTimeout <= 0 {
		cfg.NodeTimeout = 15 * time.Second
	}
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return nil, fmt.Errorf("create %s: %w", cfg.DataDir, err)
	}
	s := &Server{cfg: cfg}
	ok := false
	defer func() {
		if !ok {
			s.closeAll(context.Background())
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
	// The reaper deletes expired sandboxes of every node, so it reads
	// through an unscoped handle (its operations still belong to this replica).
	reapStore := s.store
	var extra core.Store
	if IsPostgres(cfg.Store) {
		if extra, err = postgres.Open(ctx, cfg.Store, postgres.Options{Logf: cfg.Logf, MaxConns: 2}); err != nil {
			return nil, err
		}
		reapStore = extra
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = func() {
		cancel()
		if extra != nil {
			extra.Close()
		}
	}
	broker := core.NewBroker(s.store, time.Now)
	if w, ok := s.store.(core.EventWatcher); ok {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); w.WatchEvents(runCtx, broker.Wake) }()
	}
	s.engine = core.NewEngine(runCtx, s.store, broker, time.Now, cfg.Logf)
	s.engine.SetLogger(cfg.Logger)
	link, err := clusterLink(cfg)
	if err != nil {
		return nil, err
	}
	var remote *cluster.Remote
	fleetCreds, credResolver, err := fleetCredentials(cfg, s.store, func(ctx context.Context, id string) error { return remote.RevokeCredential(ctx, id) })
	if err != nil {
		return nil, err
	}
	remote, err = cluster.NewRemote(cluster.RemoteOptions{Store: s.store, Signer: cluster.NewSigner(cfg.ClusterSecret, time.Now),
		Timeout: cfg.NodeTimeout, ProjectQuota: cfg.ProjectQuota, Link: link, Credentials: credResolver, Logf: cfg.Logf})
	if err != nil {
		return nil, err
	}
	sopts := core.ServiceOptions{DefaultTimeout: cfg.DefaultTimeout, DefaultLimits: cfg.DefaultLimits, MaxLimits: cfg.MaxLimits,
		NodeName: cfg.NodeName, AnyNode: true, Logf: cfg.Logf, CheckpointDefaults: cfg.CheckpointDefaults}
	s.svc = core.NewService(s.store, s.engine, broker, remote, sopts)
	reaper := core.NewService(reapStore, s.engine, broker, remote, sopts)
	// What this replica left unfinished before a restart: fail it and
	// settle its sandboxes (a create may have started on a node).
	if oo, ok := s.store.(core.OwnedOperations); ok {
		ops, err := oo.UnfinishedOperationsOf(ctx, cfg.NodeName)
		if err != nil {
			return nil, fmt.Errorf("recover operations: %w", err)
		}
		s.svc.FailOrphanOperations(ctx, ops, "the server stopped while this operation ran")
	}
	if err := s.svc.Reconcile(ctx); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	mon, err := cluster.NewMonitor(cluster.MonitorOptions{Store: s.store, Service: s.svc, Name: cfg.NodeName,
		Timeout: cfg.NodeTimeout, Logf: cfg.Logf})
	if err != nil {
		return nil, err
	}
	if err := mon.Heartbeat(ctx); err != nil {
		return nil, fmt.Errorf("first heartbeat: %w", err)
	}
	keys := auth.NewKeys(s.store, time.Now)
	sessions, err := auth.NewSessions(ctx, s.store, time.Now)
	if err != nil {
		return nil, err
	}
	if s.ctrlLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	// Nodes may declare different public ranges: an E2B denyOut maps onto
	// open mode only for ranges no node can make public.
	e2bAPI := e2b.NewAPI(e2b.APIOptions{Service: s.svc, Engine: s.engine, Keys: keys, Sessions: sessions,
		SessionTTL: cfg.SessionTTL, Logf: cfg.Logf, Audit: s.audit, InternalRange: egress.AlwaysInternal,
		PortDomain: func(sb core.Sandbox) string {
			u := remote.DataURL(sb)
			if u == "" {
				u = cfg.DataURL
			}
			return portfwd.NewURLs(u, cfg.SandboxDomain).Domain
		}, OpenByDefault: cfg.E2BNetwork == E2BNetworkOpen})
	apiOpts := api.Options{
		Service: s.svc, Engine: s.engine, Broker: broker, Keys: keys, Sessions: sessions,
		Templates: &remoteTemplates{r: remote, logf: cfg.Logf}, Store: s.store, DataURL: cfg.DataURL, DataURLFor: remote.DataURL, SandboxDomain: cfg.SandboxDomain,
		SessionTTL: cfg.SessionTTL, Logf: cfg.Logf, Audit: s.audit, Credentials: noRemoteCredentials{},
		Info: func() api.Info {
			egress, ranges := remoteEgress(remote, cfg.NodeTimeout)
			return api.Info{Driver: "remote", DriverReason: "--remote-nodes: sandboxes run on registered space node processes",
				Egress: egress, NodeEgressRanges: ranges}
		},
	}
	if fleetCreds != nil {
		apiOpts.Credentials = fleetCreds
	}
	s.ctrl = &http.Server{Handler: httpx.Limits(withConsole(e2bAPI.Wrap(remoteRefusals(api.New(apiOpts), remote)), nodeDataURLs(remote))), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: httpx.ServerMaxHeaderBytes}
	if err := s.startMetrics(runCtx, obs, "", "", keys); err != nil {
		return nil, err
	}
	s.startLogging(sessions)
	startPruner(runCtx, &s.wg, s.store, cfg)
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		if err := s.ctrl.Serve(httpx.Listener(s.ctrlLn)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Logf("serve %s: %v", s.ctrlLn.Addr(), err)
		}
	}()
	go func() { defer s.wg.Done(); mon.Run(runCtx) }()
	if fleetCreds != nil {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); remote.ResyncCredentials(runCtx, time.Second) }()
	}
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
			// One replica (the first by name of those alive) reaps.
			if leader(runCtx, remote, cfg.NodeName, cfg.NodeTimeout) {
				reaper.ReapExpired(runCtx)
				reaper.AutoPauseIdle(runCtx) // idle times from each sandbox's node
				reaper.CheckpointDue(runCtx)
			}
		}
	}()
	if cfg.AddrFile != "" {
		doc := fmt.Sprintf(`{"control":"http://%s","data":%q}`+"\n", s.ctrlLn.Addr(), cfg.DataURL)
		tmp := cfg.AddrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
			return nil, fmt.Errorf("write addr file: %w", err)
		}
		if err := os.Rename(tmp, cfg.AddrFile); err != nil {
			return nil, fmt.Errorf("write addr file: %w", err)
		}
	}
	ok = true
	cfg.Logf("space server %s: control API on http://%s, sandboxes on remote nodes (heartbeat timeout %v)", cfg.NodeName, s.ctrlLn.Addr(), cfg.NodeTimeout)
	return s, nil
}

// leader reports whether name is the first, by name, of the server
// replicas whose heartbeat is fresh.
func leader(ctx context.Context, r *cluster.Remote, name string, timeout time.Duration) bool {
	nodes, err := r.Nodes(ctx)
	if err != nil {
		return false
	}
	var alive []string
	now := time.Now()
	for _, n := range nodes {
		if n.Kind == core.NodeKindServer && n.State == core.NodeReady && now.Sub(n.HeartbeatAt) <= timeout {
			alive = append(alive, n.Name)
		}
	}
	sort.Strings(alive)
	return len(alive) > 0 && alive[0] == name
}

// remoteEgress reports whether some ready node runs the egress gateway,
// and the effective address sets of each such node.
func remoteEgress(r *cluster.Remote, timeout time.Duration) (bool, map[string]*core.EgressRanges) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes, err := r.Nodes(ctx)
	if err != nil {
		return false, nil
	}
	now := time.Now()
	on := false
	var ranges map[string]*core.EgressRanges
	for _, n := range nodes {
		if n.Kind == core.NodeKindNode && n.State == core.NodeReady && n.Egress && now.Sub(n.HeartbeatAt) <= timeout {
			on = true
			if n.EgressRanges != nil {
				if ranges == nil {
					ranges = map[string]*core.EgressRanges{}
				}
				ranges[n.Name] = n.EgressRanges
			}
		}
	}
	return on, ranges
}
