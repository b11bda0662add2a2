package server

import (
	"context"
	"log"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/dataplane"
	"github.com/space-sandbox/space/internal/e2b"
	"github.com/space-sandbox/space/internal/logx"
	"github.com/space-sandbox/space/internal/portfwd"
)

// withLoggers fills in Config.Logf and Config.Logger from each other: a
// Logger (space server --log-format) also backs Logf, so every line the
// packages print becomes one of its records; with only a Logf (tests),
// the Logger's records are rendered into it.
func withLoggers(cfg Config) Config {
	switch {
	case cfg.Logger != nil && cfg.Logf == nil:
		cfg.Logf = logx.Logf(cfg.Logger)
	case cfg.Logger == nil:
		if cfg.Logf == nil {
			cfg.Logf = log.Printf
		}
		cfg.Logger = logx.FromLogf(cfg.Logf)
	}
	return cfg
}

// controlRoutes are the patterns of the control listener: the control
// API, the E2B REST API, /metrics and the web console.
func controlRoutes() []string {
	return append(append(api.Routes(), e2b.Routes()...), "GET /metrics", "GET /ui/", "GET /{$}")
}

// dataRoutes are the patterns of the data listener: the data plane and
// E2B's envd (Connect RPCs by service).
func dataRoutes() []string {
	return append(dataplane.Routes(), "GET /healthz", "GET /openapi.json",
		"/health", "/files", "/process.Process/", "/filesystem.Filesystem/")
}

// controlAccess wraps the control listener's handler in the access log.
func controlAccess(h http.Handler, l *slog.Logger) http.Handler {
	return logx.Access(h, logx.AccessOptions{Logger: l, Plane: "control", Routes: controlRoutes(), Quiet: []string{"/healthz"}})
}

// dataAccess wraps a data listener's handler in the access log; each line
// names the project and sandbox of the request's session token.
func dataAccess(h http.Handler, l *slog.Logger, sessions *auth.Sessions) http.Handler {
	return logx.Access(h, logx.AccessOptions{Logger: l, Plane: "data", Routes: dataRoutes(), Quiet: []string{"/healthz", "/health"},
		// Forwarded ports: one pattern, the port in the path field.
		Classify: func(r *http.Request) string {
			if t, ok := portfwd.Match(r, ""); ok {
				return "FORWARD port " + strconv.Itoa(t.Port)
			}
			return ""
		},
		Identify: func(r *http.Request) logx.Principal {
			tok := r.Header.Get("X-Access-Token")
			if a := r.Header.Get("Authorization"); tok == "" && strings.HasPrefix(a, "Bearer ") {
				tok = strings.TrimPrefix(a, "Bearer ")
			}
			if tok == "" {
				return logx.Principal{}
			}
			sess, err := sessions.Verify(tok)
			if err != nil {
				return logx.Principal{}
			}
			return logx.Principal{Project: sess.ProjectID, Sandbox: sess.SandboxID}
		}})
}

// nodeAccess wraps the node RPC handler in the access log (the paths are
// the patterns: a fixed set of POST routes).
func nodeAccess(h http.Handler, l *slog.Logger) http.Handler {
	return logx.Access(h, logx.AccessOptions{Logger: l, Plane: "node", Pattern: func(r *http.Request) string {
		if p := r.URL.Path; strings.HasPrefix(p, "/node/v1/") && len(p) <= 64 {
			return r.Method + " " + p
		}
		return ""
	}})
}

// startLogging adds the access log around both listeners and makes the
// audit log's refusals also warn records of the operational log.
func (s *Server) startLogging(sessions *auth.Sessions) {
	l := s.cfg.Logger
	s.audit.AlsoWarn(l)
	if s.ctrl != nil {
		s.ctrl.Handler = controlAccess(s.ctrl.Handler, l)
	}
	if s.data != nil {
		s.data.Handler = dataAccess(s.data.Handler, l, sessions)
	}
}

// startLogging adds the access log around a `space node`'s data plane
// and node RPC.
func (p *NodeProcess) startLogging(sessions *auth.Sessions) {
	l := p.cfg.Logger
	p.data.Handler = dataAccess(p.data.Handler, l, sessions)
	p.rpc.Handler = nodeAccess(p.rpc.Handler, l)
}

// liveHere counts the sandboxes of this server's node that keep running
// after it stops (the next start re-adopts them).
func (s *Server) liveHere(ctx context.Context) int {
	if s.store == nil || s.node == nil {
		return 0
	}
	list, err := s.store.ListSandboxes(ctx, core.SandboxFilter{States: []core.SandboxState{core.SandboxCreating, core.SandboxRunning, core.SandboxPaused}})
	if err != nil {
		return -1
	}
	name := s.cfg.NodeName
	if name == "" {
		name, _ = nodeName(s.cfg) // s.cfg is the Config before Start filled it in
	}
	n := 0
	for _, sb := range list {
		if sb.Node == "" || sb.Node == name {
			n++
		}
	}
	return n
}

// shutdownLog records a shutdown's beginning and returns what records its
// end: how long it took, the operations it had to cancel and those still
// running at its deadline (failed as interrupted at the next start), and
// the sandboxes left running.
func shutdownLog(l *slog.Logger, what string, engine *core.Engine, sandboxes int) func() {
	t0 := time.Now()
	ops := 0
	if engine != nil {
		ops = engine.Running()
	}
	l.Info("shutdown begun", "process", what, "operations_running", ops, "sandboxes_running", sandboxes)
	return func() {
		left := 0
		if engine != nil {
			left = engine.Running()
		}
		l.Info("shutdown complete", "process", what, "duration_ms", float64(time.Since(t0).Microseconds())/1000,
			"operations_cancelled", ops, "operations_left", left, "sandboxes_left", sandboxes)
	}
}

// count is how many sandboxes the node runs or is starting.
func (t *trackedRuntime) count() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live)
}
