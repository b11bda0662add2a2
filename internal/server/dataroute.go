package server

// Data-plane routing between nodes: any node's data listener serves every
// sandbox of the cluster. A request for a sandbox another node runs is
// proxied to that node over the node link (mutual TLS, the node's own
// certificate as client), where the RPC listener hands it to the data
// plane under PathData; the session token in the request is checked there,
// as on the sandbox's own listener.

import (
	"context"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/node"
)

// PathData prefixes data-plane requests forwarded over the node link.
const PathData = "/node/v1/data"

// forwardedHeader marks a request a peer node forwarded: it is served
// here, never forwarded again (no loops).
const forwardedHeader = "X-Space-Forwarded-By"

// requestSandbox returns the sandbox a data-listener request names: the
// E2B header, a "<port>-<id>.<domain>" host, or a /v1/sandboxes/{id}/ path.
func requestSandbox(r *http.Request) string {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		return id
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/"); ok {
		id, _, _ := strings.Cut(rest, "/")
		return id
	}
	label, _, _ := strings.Cut(r.Host, ".")
	if _, id, ok := strings.Cut(label, "-"); ok && core.ValidSandboxID(id) {
		return id
	}
	return ""
}

// dataRouter forwards requests for other nodes' sandboxes.
type dataRouter struct {
	self  string
	local interface {
		Has(id string) bool
	}
	store core.Store
	ns    core.NodeStore
	link  cluster.LinkOptions
	logf  func(string, ...any)

	mu    sync.Mutex
	peers map[string]*peer // node name → its proxy
}

type peer struct {
	url   string
	proxy *httputil.ReverseProxy
}

// wrap forwards what another node serves and hands the rest to next.
func (d *dataRouter) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := requestSandbox(r)
		if id == "" || !core.ValidSandboxID(id) || d.local.Has(id) {
			next.ServeHTTP(w, r)
			return
		}
		if r.Header.Get(forwardedHeader) != "" {
			// Served here, never forwarded on, unless a wake moves the
			// sandbox (datawake.go).
			d.serveLocal(next, w, r, id)
			return
		}
		p := d.peerFor(r.Context(), id)
		if p == nil {
			// Answers as for an unknown sandbox, or wakes a hibernated one.
			d.serveLocal(next, w, r, id)
			return
		}
		p.serve(w, r)
	})
}

// peerFor returns the proxy to the node that runs sandbox id (nil: none
// other than this one, or not reachable now).
func (d *dataRouter) peerFor(ctx context.Context, id string) *peer {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sb, err := d.store.GetSandbox(ctx, "", id)
	if err != nil || sb.Node == "" || sb.Node == d.self {
		return nil
	}
	nodes, err := d.ns.ListNodes(ctx)
	if err != nil {
		return nil
	}
	for _, n := range nodes {
		if n.Name != sb.Node || n.Kind != core.NodeKindNode || n.State != core.NodeReady || n.RPCURL == "" {
			continue
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if p := d.peers[n.Name]; p != nil && p.url == n.RPCURL {
			return p
		}
		p, err := d.newPeer(n.Name, n.RPCURL)
		if err != nil {
			d.logf("data plane: cannot forward to node %s: %v", n.Name, err)
			return nil
		}
		d.peers[n.Name] = p
		return p
	}
	return nil
}

func (d *dataRouter) newPeer(name, rpcURL string) (*peer, error) {
	hc, err := d.link.HTTPClient(name, rpcURL)
	if err != nil {
		return nil, err
	}
	base, err := url.Parse(strings.TrimRight(rpcURL, "/") + PathData)
	if err != nil {
		return nil, err
	}
	self := d.self
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(base)
			pr.Out.Host = pr.In.Host // forwarded ports and envd match on it
			pr.Out.Header.Set(forwardedHeader, self)
			pr.SetXForwarded()
		},
		Transport:     hc.Transport, // no overall timeout: streams last
		FlushInterval: -1,           // SSE and streamed bodies as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			d.logf("data plane: forward to node %s: %v", name, err)
			httpx.WriteError(w, httpx.Errorf(http.StatusBadGateway, "unavailable", "the sandbox's node cannot be reached"))
		},
	}
	return &peer{url: rpcURL, proxy: rp}, nil
}

// forwardedData serves, on the RPC listener, data-plane requests a peer
// forwarded (PathData + the original path), and the node RPC otherwise.
func forwardedData(rpc, data http.Handler) http.Handler {
	strip := http.StripPrefix(PathData, data)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, PathData+"/") {
			rpc.ServeHTTP(w, r)
			return
		}
		if r.Header.Get(forwardedHeader) == "" {
			httpx.WriteError(w, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "not a forwarded request"))
			return
		}
		// The RPC listener's read timeout is for RPC bodies; an upload
		// or a stdin stream takes as long as it takes.
		http.NewResponseController(w).SetReadDeadline(time.Time{})
		strip.ServeHTTP(w, r)
	})
}

// nodeHas reports whether this node runs a sandbox.
type nodeHas struct{ n *node.Node }

func (h nodeHas) Has(id string) bool {
	_, err := h.n.Sandbox(id)
	return err == nil
}

// nodeLinkClient is how a node reaches its peers for forwarded data-plane
// requests: its own certificate (node certificates allow client auth), or
// plaintext on loopback as its RPC.
func nodeLinkClient(nc NodeConfig, logf func(string, ...any)) cluster.LinkOptions {
	if nc.TLS.Empty() {
		return cluster.LinkOptions{Plaintext: nc.Plaintext}
	}
	ct, err := cluster.LoadClientTLS(nc.TLS)
	if err != nil {
		logf("data plane: requests for other nodes' sandboxes are not forwarded: %v", err)
		return cluster.LinkOptions{}
	}
	return cluster.LinkOptions{TLS: ct}
}

// nodePauser is the node's runtime for thawing its own paused sandboxes
// (nodeWaker adds the wake of hibernated ones).
type nodePauser struct{ lifecycleOnly }

func (n nodePauser) PauseSandbox(ctx context.Context, id string) error {
	return n.t.PauseSandbox(ctx, id)
}

func (n nodePauser) ResumeSandbox(ctx context.Context, id string) error {
	return n.t.ResumeSandbox(ctx, id)
}

// serve forwards a request to the peer. Full duplex: without it net/http
// closes the client's request body when the proxy writes the peer's first
// bytes back, and a transport still reading that body (for its end) then
// fails the request write and closes the connection to the peer under the
// answer: a process Start answers before its request is read to the end.
func (p *peer) serve(w http.ResponseWriter, r *http.Request) {
	http.NewResponseController(w).EnableFullDuplex() // HTTP/2 is full duplex already
	p.proxy.ServeHTTP(w, r)
}
