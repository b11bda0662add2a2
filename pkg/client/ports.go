package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Credentials of requests to forwarded ports.
const (
	// PortTokenHeader carries the session token (or a port token) on a
	// request to a forwarded port; the data plane removes it before the
	// request reaches the sandbox.
	PortTokenHeader = "X-Access-Token"
	// PortTokenQuery is the query parameter of a signed URL.
	PortTokenQuery = "space_token"
)

// maxPortWaitRequest bounds one ?wait= request of WaitForPort; a longer
// wait is several requests (proxies cut long silent requests).
const maxPortWaitRequest = 60 * time.Second

// Port is a TCP port something listens on inside a sandbox.
type Port struct {
	Port    int    `json:"port"`
	Address string `json:"address"` // e.g. "127.0.0.1", "0.0.0.0", "::"
	Family  string `json:"family"`  // "tcp" or "tcp6"
	// URL (host form, needs wildcard DNS for the sandbox domain) and
	// PathURL (path form under the data plane URL) reach the port.
	URL     string `json:"url,omitempty"`
	PathURL string `json:"path_url,omitempty"`
}

// SignedPortURL is a URL that opens one port of a sandbox, without any
// other credential, until ExpiresAt: for a browser preview.
type SignedPortURL struct {
	URL       string    `json:"url"`      // host form, with ?space_token=
	PathURL   string    `json:"path_url"` // path form, with ?space_token=
	Token     string    `json:"token"`    // the port token itself (opens this port only)
	ExpiresAt time.Time `json:"expires_at"`
}

func validPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("space: invalid port %d (want 1-65535)", port)
	}
	return nil
}

// ListPorts returns the TCP ports something listens on inside the sandbox.
func (c *SandboxConn) ListPorts(ctx context.Context) ([]Port, error) {
	u, err := c.url("/ports")
	if err != nil {
		return nil, err
	}
	var res struct {
		Ports []Port `json:"ports"`
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &res})
	return res.Ports, err
}

// WaitForPort waits until something listens on port inside the sandbox and
// returns it. It waits until ctx is done (give it a deadline), asking the
// server to hold each request up to a minute; a dropped request is retried
// like an event stream (WithStreamRetries).
func (c *SandboxConn) WaitForPort(ctx context.Context, port int) (Port, error) {
	if err := validPort(port); err != nil {
		return Port{}, err
	}
	u, err := c.url("/ports")
	if err != nil {
		return Port{}, err
	}
	failures := 0
	for {
		wait := maxPortWaitRequest
		if dl, ok := ctx.Deadline(); ok {
			if wait = min(wait, time.Until(dl)); wait <= 0 {
				<-ctx.Done()
				return Port{}, fmt.Errorf("space: wait for port %d: %w", port, ctx.Err())
			}
		}
		var res struct {
			Ports []Port `json:"ports"`
		}
		q := url.Values{"wait": {strconv.Itoa(port)}, "timeout_ms": {strconv.FormatInt(wait.Milliseconds(), 10)}}
		_, err := c.r.do(ctx, request{method: http.MethodGet, url: u + "?" + q.Encode(), out: &res, wait: wait})
		if err == nil {
			for _, p := range res.Ports {
				if p.Port == port {
					return p, nil
				}
			}
			err = fmt.Errorf("space: port %d not in the listing the server answered the wait with", port)
		}
		if ctx.Err() != nil {
			return Port{}, fmt.Errorf("space: wait for port %d: %w", port, ctx.Err())
		}
		var ae *APIError
		if errors.As(err, &ae) && ae.Code == "port_timeout" {
			failures = 0 // the server waited its share: ask again
			continue
		}
		if !transient(ctx, err) {
			return Port{}, err
		}
		if failures++; failures > c.r.retries {
			return Port{}, err
		}
		if err := backoff(ctx, failures, 0); err != nil {
			return Port{}, fmt.Errorf("space: wait for port %d: %w", port, err)
		}
	}
}

// portHost is "P-<id>.<domain>" (domain may carry a port).
func (c *SandboxConn) portHost(port int) (scheme, host string, err error) {
	if c.err != nil {
		return "", "", c.err
	}
	if err := validPort(port); err != nil {
		return "", "", err
	}
	du, err := url.Parse(c.s.DataURL)
	if err != nil || du.Host == "" {
		return "", "", fmt.Errorf("space: session data_url %q is not a URL", c.s.DataURL)
	}
	domain := c.s.Domain
	if domain == "" {
		domain = defaultDomain(du)
	}
	return du.Scheme, strconv.Itoa(port) + "-" + c.s.SandboxID + "." + domain, nil
}

// defaultDomain is the server's own default (portfwd.DefaultDomain) for a
// session that names no domain: "localhost[:port]" for an address or
// localhost (browsers resolve *.localhost to loopback), else the host.
func defaultDomain(du *url.URL) string {
	host, port := du.Hostname(), du.Port()
	if net.ParseIP(host) != nil || host == "localhost" {
		host = "localhost"
	}
	if port == "" || (du.Scheme == "http" && port == "80") || (du.Scheme == "https" && port == "443") {
		return host
	}
	return host + ":" + port
}

// PortURL is the host-form URL of a port of the sandbox,
// "<scheme>://P-<id>.<domain>/", built from the session without a network
// call. It needs wildcard DNS for the domain (*.localhost resolves to
// loopback in browsers; PortHTTPClient needs no DNS at all); a private
// sandbox's port also needs the token (PortHTTPClient sends it) or a
// signed URL (Client.SignedPortURL).
func (c *SandboxConn) PortURL(port int) (string, error) {
	scheme, host, err := c.portHost(port)
	if err != nil {
		return "", err
	}
	return scheme + "://" + host + "/", nil
}

// PortPathURL is the path-form URL of a port,
// "<data_url>/v1/sandboxes/<id>/ports/P/": no wildcard DNS needed, but all
// sandboxes share the data plane's origin (the page runs in a CSP sandbox).
func (c *SandboxConn) PortPathURL(port int) (string, error) {
	if err := validPort(port); err != nil {
		return "", err
	}
	u, err := c.url("/ports/%s", strconv.Itoa(port))
	if err != nil {
		return "", err
	}
	return u + "/", nil
}

// PortTransport is an http.RoundTripper for a sandbox's forwarded ports:
// requests to the sandbox's port hosts (PortURL) are sent to the data
// plane's address whatever DNS says, and those and path-form requests
// (PortPathURL) carry the session token. Requests to any other host go
// out unchanged, without the token.
type PortTransport struct {
	conn     *SandboxConn
	dataAddr string // host:port of the data plane
	dataHost string // host[:port] of the data URL as written
	suffix   string // "-<id>.<domain>", lower case
	tr       *http.Transport
}

// PortTransport returns a transport for the sandbox's forwarded ports. It
// keeps connections alive; CloseIdleConnections releases them.
func (c *SandboxConn) PortTransport() (*PortTransport, error) {
	if c.err != nil {
		return nil, c.err
	}
	du, err := url.Parse(c.s.DataURL)
	if err != nil || du.Host == "" {
		return nil, fmt.Errorf("space: session data_url %q is not a URL", c.s.DataURL)
	}
	addr := du.Host
	if du.Port() == "" {
		addr = net.JoinHostPort(du.Hostname(), map[bool]string{true: "443", false: "80"}[du.Scheme == "https"])
	}
	domain := c.s.Domain
	if domain == "" {
		domain = defaultDomain(du)
	}
	t := &PortTransport{conn: c, dataAddr: addr, dataHost: strings.ToLower(du.Host),
		suffix: strings.ToLower("-" + c.s.SandboxID + "." + domain)}
	// The SDK's own transport settings (TLS roots, timeouts) carry over.
	base, ok := c.r.hc.Transport.(*http.Transport)
	if !ok || base == nil {
		base = http.DefaultTransport.(*http.Transport)
	}
	t.tr = base.Clone()
	dial := t.tr.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	t.tr.DialContext = func(ctx context.Context, network, a string) (net.Conn, error) {
		if t.isPortHost(a) {
			a = t.dataAddr
		}
		return dial(ctx, network, a)
	}
	proxy := t.tr.Proxy
	t.tr.Proxy = func(r *http.Request) (*url.URL, error) {
		if proxy == nil || t.isPortHost(r.URL.Host) {
			return nil, nil // a proxy cannot resolve the sandbox's names
		}
		return proxy(r)
	}
	return t, nil
}

// isPortHost reports whether host[:port] is one of this sandbox's port
// hosts ("P-<id>.<domain>"; the domain's own port, when it has one, must
// match too).
func (t *PortTransport) isPortHost(hostport string) bool {
	h := strings.ToLower(hostport)
	label, _, ok := strings.Cut(h, "-")
	if !ok || label == "" || len(label) > 5 || strings.Trim(label, "0123456789") != "" {
		return false
	}
	rest := h[len(label):]
	if rest == t.suffix {
		return true
	}
	// The domain has no port but the host does (the listener's): compare
	// without it.
	if !strings.Contains(t.suffix, ":") {
		if name, _, err := net.SplitHostPort(h); err == nil {
			return name[len(label):] == t.suffix
		}
	}
	return false
}

// RoundTrip sends r, adding the token for the sandbox's ports only.
func (t *PortTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	host := strings.ToLower(r.URL.Host)
	if t.isPortHost(host) || (host == t.dataHost && strings.HasPrefix(r.URL.Path, "/v1/sandboxes/"+t.conn.s.SandboxID+"/ports/")) {
		if r.Header.Get(PortTokenHeader) == "" {
			r = r.Clone(r.Context())
			r.Header.Set(PortTokenHeader, t.conn.s.Token)
		}
		if r.Header.Get("User-Agent") == "" {
			r.Header.Set("User-Agent", t.conn.r.ua)
		}
	}
	return t.tr.RoundTrip(r)
}

// CloseIdleConnections closes the transport's idle connections.
func (t *PortTransport) CloseIdleConnections() { t.tr.CloseIdleConnections() }

// PortHTTPClient returns an http.Client that reaches the sandbox's
// forwarded ports by their PortURL (or PortPathURL) with the session token
// and no wildcard DNS. It has no timeout: bound requests with contexts.
// The token is the session's: a client made from an expired session gets
// 401 token_expired; make a new one from Client.Connect.
func (c *SandboxConn) PortHTTPClient() (*http.Client, error) {
	t, err := c.PortTransport()
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// SignedPortURL asks the control API for a URL that opens one port of a
// sandbox for ttl (0: the server's default, an hour; at most 7 days)
// without any other credential: for a browser preview of a private
// sandbox. Anyone holding the URL reaches that port (and no other, and no
// command or file) until it expires.
func (c *Client) SignedPortURL(ctx context.Context, sandboxID string, port int, ttl time.Duration) (SignedPortURL, error) {
	var res SignedPortURL
	if err := validPort(port); err != nil {
		return res, err
	}
	u, err := route(c.base, "/v1/sandboxes/%s/ports/%s/url", sandboxID, strconv.Itoa(port))
	if err != nil {
		return res, err
	}
	body := map[string]int64{}
	if ttl > 0 {
		body["ttl_seconds"] = int64((ttl + time.Second - 1) / time.Second)
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, json: body, out: &res})
	return res, err
}
