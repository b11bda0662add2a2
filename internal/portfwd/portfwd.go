package portfwd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/node"
)

// Credentials a forwarded request may carry; all are removed before the
// request reaches the sandbox.
const (
	// HeaderToken carries a session token or a port token.
	HeaderToken = "X-Access-Token"
	// HeaderTrafficToken is E2B's header for a sandbox without public
	// traffic (the create answer's trafficAccessToken).
	HeaderTrafficToken = "E2b-Traffic-Access-Token"
	// QueryToken carries a port token in a signed URL.
	QueryToken = "space_token"
	// CookieToken keeps a signed URL's token for the page's later requests.
	CookieToken = "space_port_token"
)

// DefaultMaxConns bounds the forwarded requests (WebSockets included) open
// at once per sandbox.
const DefaultMaxConns = 256

// Options configure a Forwarder.
type Options struct {
	Node     *node.Node
	Sessions *auth.Sessions
	// Domain is the sandbox domain of the host form; "" accepts any host
	// whose first label is "<port>-<id>".
	Domain string
	// MaxConns bounds open forwarded requests per sandbox (0: DefaultMaxConns).
	MaxConns int
	// Wake, if set, resumes a paused or hibernated sandbox created with
	// auto-resume (core.Service.AutoResume); it reports whether it did.
	Wake func(ctx context.Context, projectID, id string) (bool, error)
	// WakePublic, if set, does the same for a request without a
	// credential, for sandboxes with public ports only
	// (core.Service.AutoResumePublic).
	WakePublic func(ctx context.Context, id string) (bool, error)
	// Audit receives refusals of a credential for another sandbox or
	// port; nil discards them.
	Audit *audit.Log
	Logf  func(string, ...any)
}

// Forwarder is the data listener's port-forwarding front door.
type Forwarder struct {
	o     Options
	tr    *http.Transport
	proxy *httputil.ReverseProxy

	mu   sync.Mutex
	open map[string]int // sandbox id -> forwarded requests in flight
}

type targetKey struct{}

// New returns a Forwarder.
func New(o Options) *Forwarder {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	f := &Forwarder{o: o, open: map[string]int{}}
	f.tr = &http.Transport{
		// The pool key is "<sandbox id>:<port>" (set by rewrite), so a
		// connection is only ever reused for the same sandbox and port.
		DialContext:            f.dial,
		Proxy:                  nil,
		MaxIdleConnsPerHost:    8,
		MaxConnsPerHost:        o.MaxConns,
		IdleConnTimeout:        30 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
		DisableCompression:     true, // bytes pass through as the server sent them
		ForceAttemptHTTP2:      false,
		WriteBufferSize:        64 << 10,
		ReadBufferSize:         64 << 10,
	}
	f.proxy = &httputil.ReverseProxy{
		Rewrite:   f.rewrite,
		Transport: f.tr,
		// 0: responses of unknown length (streams) and server-sent events
		// are still flushed after every write (httputil does that); a
		// response with a length is not flushed per write.
		FlushInterval:  0,
		BufferPool:     newBufferPool(),
		ErrorHandler:   f.proxyError,
		ModifyResponse: f.modifyResponse,
		ErrorLog:       nil,
	}
	return f
}

// Close drops idle connections to sandboxes.
func (f *Forwarder) Close() { f.tr.CloseIdleConnections() }

// Wrap forwards requests that name a sandbox port and passes the rest to next.
func (f *Forwarder) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, ok := Match(r, f.o.Domain)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		f.serve(w, r, t)
	})
}

func (f *Forwarder) serve(w http.ResponseWriter, r *http.Request, t Target) {
	if t.Prefix != "" && r.URL.Path == t.Prefix && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		// Relative links of the page resolve against the directory.
		u := *r.URL
		u.Path, u.RawPath = t.Prefix+"/", ""
		http.Redirect(w, r, u.RequestURI(), http.StatusPermanentRedirect)
		return
	}
	sb, err := f.authorize(w, r, t)
	if err != nil {
		httpx.WriteError(w, err)
		return
	}
	if !f.acquire(t.SandboxID) {
		httpx.WriteError(w, httpx.Errorf(http.StatusTooManyRequests, "too_many_connections",
			"sandbox %s has %d forwarded requests open; close some first", t.SandboxID, f.o.MaxConns))
		return
	}
	defer f.release(t.SandboxID)
	// Full duplex: without it net/http closes the request body when the
	// proxy writes the response header, and a transport still finishing
	// the request write (its read for EOF after the body) then fails and
	// closes the upstream connection: a streamed response (the code
	// interpreter's /execute) was cut right after its header.
	http.NewResponseController(w).EnableFullDuplex() // HTTP/2 is full duplex already
	fw := &forward{t: t, sb: sb}
	ctx := context.WithValue(r.Context(), targetKey{}, fw)
	ew := &endWriter{ResponseWriter: w, fw: fw}
	defer ew.finish()
	f.proxy.ServeHTTP(ew, r.WithContext(ctx))
}

// forward is what a request being forwarded carries in its context.
type forward struct {
	t  Target
	sb *node.Sandbox
	// ended is set once the sandbox's answer has been read to its end.
	ended atomic.Bool
}

// endBody is the sandbox's answer body; it notes its end in fw.
type endBody struct {
	io.ReadCloser
	fw *forward
}

func (b *endBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.fw.ended.Store(true)
	}
	return n, err
}

// endWriter sends a streamed answer in as few writes as it can: the
// proxy flushes every piece of a body of unknown length (the code
// interpreter's NDJSON) and, at once and from another goroutine, the
// header before it. Each write is a wake-up of the client. The header's
// own flush waits headerFlushDelay for the first piece of the body (and
// goes with it if it comes), and the flush after the last piece is left
// to net/http, which writes the end of the chunked body with it when the
// handler returns: a quick answer whose server wrote it at once leaves in
// one write where it took three.
type endWriter struct {
	http.ResponseWriter
	fw *forward

	mu    sync.Mutex
	wrote bool        // a piece of the body was written
	done  bool        // the handler is returning: w is no longer ours
	timer *time.Timer // the header's delayed flush
}

// headerFlushDelay is how long the header of a streamed answer may wait
// for the first piece of its body.
const headerFlushDelay = 5 * time.Millisecond

func (w *endWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

func (w *endWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.fw.ended.Load():
		return nil // the handler returns next, and net/http flushes then
	case !w.wrote:
		if w.timer == nil {
			w.timer = time.AfterFunc(headerFlushDelay, w.flushHeader)
		}
		return nil
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *endWriter) flushHeader() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done && !w.wrote {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// finish stops the delayed flush before the handler returns.
func (w *endWriter) finish() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

func (w *endWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func forwardOf(ctx context.Context) *forward {
	fw, _ := ctx.Value(targetKey{}).(*forward)
	return fw
}

func (f *Forwarder) acquire(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.open[id] >= f.o.MaxConns {
		return false
	}
	f.open[id]++
	return true
}

func (f *Forwarder) release(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.open[id]--; f.open[id] <= 0 {
		delete(f.open, id)
	}
}

// authorize checks the request may reach the port and returns the sandbox.
// A public sandbox needs nothing; otherwise the request must carry a
// session token or a port token for this sandbox (and port). Without a
// valid credential the answer is 401 whether or not the sandbox exists, so
// probing reveals nothing; a credential for another sandbox is 404.
func (f *Forwarder) authorize(w http.ResponseWriter, r *http.Request, t Target) (*node.Sandbox, error) {
	sb, err := f.o.Node.Sandbox(t.SandboxID)
	if err == nil && sb.PublicPorts() {
		return sb, nil
	}
	grant, fromQuery, gerr := f.credential(r, t)
	if gerr != nil && err != nil && f.o.WakePublic != nil && !hasCredential(r) {
		// A paused public sandbox with auto-resume wakes for a browser too.
		if woke, werr := f.o.WakePublic(r.Context(), t.SandboxID); errors.Is(werr, core.ErrConflict) {
			return nil, errPaused() // public, paused or hibernated, no auto-resume
		} else if werr != nil {
			f.o.Logf("sandbox %s: auto-resume for port %d: %v", t.SandboxID, t.Port, werr)
		} else if woke {
			if sb, err = f.o.Node.Sandbox(t.SandboxID); err == nil && sb.PublicPorts() {
				return sb, nil
			}
		}
	}
	if gerr != nil && errors.Is(err, core.ErrConflict) && f.o.Node.PausedPublic(t.SandboxID) {
		// A public port needs no credential, so its paused state is no
		// secret: the same 409 as with a credential.
		return nil, errPaused()
	}
	if gerr != nil {
		return nil, gerr
	}
	if err != nil && f.o.Wake != nil {
		if woke, werr := f.o.Wake(r.Context(), grant.ProjectID, t.SandboxID); werr != nil {
			f.o.Logf("sandbox %s: auto-resume for port %d: %v", t.SandboxID, t.Port, werr)
		} else if woke {
			sb, err = f.o.Node.Sandbox(t.SandboxID)
		} else if errors.Is(err, core.ErrNotFound) && f.o.WakePublic != nil {
			// Not on the node and not woken: a hibernated public sandbox
			// answers what it answers without a credential.
			if _, werr := f.o.WakePublic(r.Context(), t.SandboxID); errors.Is(werr, core.ErrConflict) {
				return nil, errPaused()
			}
		}
	}
	if errors.Is(err, core.ErrConflict) {
		return nil, errPaused()
	}
	if err != nil {
		return nil, httpx.Errorf(http.StatusNotFound, "not_found", "sandbox not found or not running")
	}
	if fromQuery {
		// A signed link opens a page whose own requests (scripts, images,
		// XHR) carry no token: keep it in a cookie of this origin and path.
		path := "/"
		if t.Prefix != "" {
			path = t.Prefix + "/"
		}
		http.SetCookie(w, &http.Cookie{Name: CookieToken, Value: r.URL.Query().Get(QueryToken), Path: path,
			Expires: grant.Expires, HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
	}
	return sb, nil
}

// credential finds a credential that opens t. fromQuery says the one that
// did came in the signed-URL parameter.
func (f *Forwarder) credential(r *http.Request, t Target) (g auth.PortGrant, fromQuery bool, err error) {
	type cand struct {
		tok   string
		query bool
	}
	var cands []cand
	for _, h := range []string{HeaderToken, HeaderTrafficToken} {
		if v := r.Header.Get(h); v != "" {
			cands = append(cands, cand{tok: v})
		}
	}
	if v := r.URL.Query().Get(QueryToken); v != "" {
		cands = append(cands, cand{tok: v, query: true})
	}
	// Every cookie of the name: another page of the same site may have
	// set one too (cookie tossing must not lock the owner out).
	for _, c := range r.Cookies() {
		if c.Name == CookieToken && len(cands) < 16 {
			cands = append(cands, cand{tok: c.Value})
		}
	}
	if len(cands) == 0 {
		return g, false, httpx.Errorf(http.StatusUnauthorized, "unauthorized",
			"port %d of this sandbox is private: send the session token (%s) or open a signed URL (POST /v1/sandboxes/{id}/ports/{port}/url)", t.Port, HeaderToken)
	}
	expired, other := false, false
	var otherGrant auth.PortGrant
	for _, c := range cands {
		grant, err := f.verify(c.tok)
		if errors.Is(err, auth.ErrExpired) {
			expired = true
			continue
		}
		if err != nil {
			continue
		}
		if grant.Covers(t.SandboxID, t.Port) {
			return grant, c.query, nil
		}
		other, otherGrant = true, grant
	}
	switch {
	case other:
		f.o.Audit.Record(r.Context(), audit.Event{Action: "port forward", Outcome: "denied", ProjectID: otherGrant.ProjectID, Kind: "port",
			Target: fmt.Sprintf("%.64s:%d", t.SandboxID, t.Port), Reason: "a credential of sandbox " + otherGrant.SandboxID + " used on another sandbox or port"})
		return g, false, httpx.Errorf(http.StatusNotFound, "not_found", "sandbox not found or not running")
	case expired:
		return g, false, httpx.Errorf(http.StatusUnauthorized, "token_expired", "the token has expired; ask the control API for a new one")
	}
	return g, false, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "invalid token")
}

// hasCredential reports whether the request carries any of SPACE's
// credentials (valid or not).
func hasCredential(r *http.Request) bool {
	if r.Header.Get(HeaderToken) != "" || r.Header.Get(HeaderTrafficToken) != "" || r.URL.Query().Has(QueryToken) {
		return true
	}
	_, err := r.Cookie(CookieToken)
	return err == nil
}

// verify accepts a session token (every port of its sandbox) or a port token.
func (f *Forwarder) verify(tok string) (auth.PortGrant, error) {
	if strings.HasPrefix(tok, "spt_") {
		return f.o.Sessions.VerifyPort(tok)
	}
	s, err := f.o.Sessions.Verify(tok)
	if err != nil {
		return auth.PortGrant{}, err
	}
	return auth.PortGrant{ProjectID: s.ProjectID, SandboxID: s.SandboxID, Port: auth.AnyPort, Expires: s.Expires}, nil
}

// rewrite turns the client's request into the sandbox server's: the path
// prefix of the path form and SPACE's credentials removed, the Host kept
// (servers build absolute links from it), X-Forwarded-* set.
func (f *Forwarder) rewrite(pr *httputil.ProxyRequest) {
	fw := forwardOf(pr.In.Context())
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = fw.t.SandboxID + ":" + strconv.Itoa(fw.t.Port)
	out.Host = pr.In.Host
	if fw.t.Prefix != "" {
		out.URL.Path = "/" + strings.TrimPrefix(strings.TrimPrefix(pr.In.URL.Path, fw.t.Prefix), "/")
		out.URL.RawPath = ""
		if raw := pr.In.URL.RawPath; raw != "" && strings.HasPrefix(raw, fw.t.Prefix) {
			out.URL.RawPath = "/" + strings.TrimPrefix(strings.TrimPrefix(raw, fw.t.Prefix), "/")
		}
		out.Header.Set("X-Forwarded-Prefix", fw.t.Prefix)
	}
	pr.SetXForwarded()
	out.Header.Del(HeaderToken)
	out.Header.Del(HeaderTrafficToken)
	if q := out.URL.Query(); q.Has(QueryToken) {
		q.Del(QueryToken)
		out.URL.RawQuery = q.Encode()
	}
	stripCookie(out.Header)
}

// stripCookie removes SPACE's cookie from the Cookie header.
func stripCookie(h http.Header) {
	vals := h.Values("Cookie")
	if len(vals) == 0 {
		return
	}
	var keep []string
	for _, v := range vals {
		for _, part := range strings.Split(v, ";") {
			part = strings.TrimSpace(part)
			if name, _, _ := strings.Cut(part, "="); part != "" && name != CookieToken {
				keep = append(keep, part)
			}
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// modifyResponse keeps a sandbox's cookies on its own origin: a Domain
// attribute would make the browser send them to every sandbox under the
// domain (and let one sandbox set cookies for another). On the path form
// all sandboxes share one origin, so the page is put in a CSP sandbox (an
// opaque origin) and cannot read other sandboxes' responses.
func (f *Forwarder) modifyResponse(resp *http.Response) error {
	// Not a 101: the proxy takes an upgraded connection's body as the
	// connection itself.
	if fw := forwardOf(resp.Request.Context()); fw != nil && resp.StatusCode != http.StatusSwitchingProtocols &&
		resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = &endBody{ReadCloser: resp.Body, fw: fw}
	}
	if cs := resp.Header.Values("Set-Cookie"); len(cs) > 0 {
		resp.Header.Del("Set-Cookie")
		for _, c := range cs {
			resp.Header.Add("Set-Cookie", dropDomain(c))
		}
	}
	if fw := forwardOf(resp.Request.Context()); fw != nil && fw.t.Prefix != "" {
		resp.Header.Add("Content-Security-Policy", "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads")
	}
	return nil
}

func dropDomain(c string) string {
	parts := strings.Split(c, ";")
	out := parts[:1]
	for _, p := range parts[1:] {
		if name, _, _ := strings.Cut(p, "="); strings.EqualFold(strings.TrimSpace(name), "domain") {
			continue
		}
		out = append(out, p)
	}
	return strings.Join(out, ";")
}

// bufferPool implements httputil.BufferPool: the proxy's 64 KiB body
// copy buffers, reused across requests.
type bufferPool struct{ p *sync.Pool }

func newBufferPool() bufferPool {
	return bufferPool{p: &sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}}
}

func (b bufferPool) Get() []byte    { return *b.p.Get().(*[]byte) }
func (b bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// dial opens the tunnel for "<sandbox id>:<port>".
func (f *Forwarder) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	fw := forwardOf(ctx)
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, _ := strconv.Atoi(ps)
	sb := (*node.Sandbox)(nil)
	if fw != nil && fw.t.SandboxID == host {
		sb = fw.sb
	} else if sb, err = f.o.Node.Sandbox(host); err != nil {
		return nil, err
	}
	return sb.DialPort(ctx, port)
}

// proxyError answers a request that could not be forwarded, in the JSON
// envelope: nothing listening is 502 port_not_listening.
func (f *Forwarder) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	fw := forwardOf(r.Context())
	switch {
	case r.Context().Err() != nil:
		return // the client went away
	case client.IsPortClosed(err):
		httpx.WriteError(w, httpx.Errorf(http.StatusBadGateway, "port_not_listening",
			"nothing is listening on port %d in sandbox %s", fw.t.Port, fw.t.SandboxID))
	case errors.Is(err, core.ErrConflict):
		httpx.WriteError(w, errPaused())
	default:
		f.o.Logf("sandbox %s: port %d: %v", fw.t.SandboxID, fw.t.Port, err)
		httpx.WriteError(w, httpx.Errorf(http.StatusBadGateway, "bad_gateway",
			"the server on port %d of sandbox %s did not answer", fw.t.Port, fw.t.SandboxID))
	}
}

// errPaused is the answer for a paused sandbox, as the data plane's.
func errPaused() error {
	return httpx.Errorf(http.StatusConflict, "sandbox_paused", "the sandbox is paused; resume it through the control API")
}
