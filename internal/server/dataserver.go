package server

import (
	"context"
	"github.com/space-sandbox/space/internal/audit"
	"net/http"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/dataplane"
	"github.com/space-sandbox/space/internal/e2b"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/portfwd"
)

// wakers are the data listener's automatic resume: with a session or port
// token, and for a public port without one.
type wakers struct {
	wake   func(ctx context.Context, projectID, id string) (bool, error)
	public func(ctx context.Context, id string) (bool, error)
}

// serviceWakers wakes through svc (nil: nothing is woken).
func serviceWakers(svc *core.Service) wakers {
	if svc == nil {
		return wakers{}
	}
	return wakers{svc.AutoResume, svc.AutoResumePublic}
}

// newDataServer builds the data listener of a server or node: forwarded
// ports first (they are matched by Host, E2B headers or a /ports/ path),
// then E2B's envd, then SPACE's data plane. wk wakes paused and
// hibernated sandboxes that asked for it (zero: nothing is woken).
//
// al receives data-plane refusals (a credential used on another sandbox
// or port, a files request refused 403); nil discards them.
func newDataServer(cfg Config, n *node.Node, sessions *auth.Sessions, envd *e2b.Envd, dataURL string, wk wakers, al *audit.Log) *http.Server {
	urls := portfwd.NewURLs(dataURL, cfg.SandboxDomain)
	wake, wakePublic := wk.wake, wk.public
	fwd := portfwd.New(portfwd.Options{Node: n, Sessions: sessions, Domain: cfg.SandboxDomain,
		MaxConns: cfg.MaxPortConns, Wake: wake, WakePublic: wakePublic, Logf: cfg.Logf, Audit: al})
	dp := dataplane.New(dataplane.Options{Node: n, Sessions: sessions, Logf: cfg.Logf, Wake: wake, PortURLs: &urls, Audit: al})
	srv := &http.Server{Handler: httpx.Limits(fwd.Wrap(envd.Wrap(dp))),
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: httpx.ServerMaxHeaderBytes}
	// HTTP/2 without TLS (prior knowledge) as well as HTTP/1.1: gRPC and
	// h2 clients reach forwarded ports and the data plane directly.
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	srv.RegisterOnShutdown(fwd.Close)
	return srv
}
