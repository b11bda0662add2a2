package egress

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/egress/policy"
	"golang.org/x/net/dns/dnsmessage"
)

// The explicit HTTP proxy, for tools that work better with HTTP_PROXY than
// with a transparent path: on each sandbox's own GW address, port
// ExplicitProxyPort. No listener of its own: the host rules redirect every
// TCP connection from the sandbox to the transparent proxy's port, which
// knows from the original destination (GW:3128, the sandbox's own GW) that
// the sandbox meant the explicit proxy. So the sandbox is known from the
// listener the connection arrived on, as on the transparent path (R2), and
// the same policy, the same checks and the same decision log apply:
//
//   - CONNECT host:port: the name is decided as a DNS query and a
//     connection would be (allowlist: an allowed name:port, never an IP
//     literal, R7; open: any public name or address), resolved by the
//     gateway itself, internal answers removed (R15), the addresses pinned
//     for the name (R6); after "200 Connection established" the tunnel is
//     served as a transparent connection to the address the gateway
//     resolved, whose SNI or Host must be the CONNECT name (R9), with TLS
//     termination, method/path rules and credentials as usual.
//   - absolute-form requests (GET http://host/path): decided the same
//     way, each request on its own; a request naming another authority on
//     a kept-alive connection gets a new decision and upstream.
//   - anything else (origin-form, https:// without CONNECT): 400.
//
// In blocked mode the connection is reset before a byte is read, like
// every other (R17).

// ExplicitProxyPort is the explicit proxy's port on a sandbox's GW address.
const ExplicitProxyPort = 3128

// ProxyURL is the explicit proxy's URL for a sandbox whose gateway is gw.
func ProxyURL(gw netip.Addr) string {
	return "http://" + netip.AddrPortFrom(gw, ExplicitProxyPort).String()
}

// ProxyEnv is what the environment of a sandbox whose policy allows
// anything (allowlist or open) gets: the explicit proxy for HTTP and
// HTTPS, in upper and lower case, and never for the sandbox's own
// loopback.
func ProxyEnv(gw netip.Addr) map[string]string {
	u := ProxyURL(gw)
	no := "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u,
		"NO_PROXY": no, "no_proxy": no,
	}
}

// proxyReply answers the sandbox with a refusal that says why.
func proxyReply(c net.Conn, code int, reason string) {
	body := fmt.Sprintf("space egress gateway: %d %s: %s\n", code, http.StatusText(code), reason)
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nX-Space-Egress-Reason: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), reason, len(body), body)
}

// serveExplicit serves one connection to the explicit proxy.
func (s *sandbox) serveExplicit(c *net.TCPConn, pol *policy.Policy) {
	hr := newHeadReader(bufio.NewReaderSize(c, 4096))
	c.SetReadDeadline(time.Now().Add(s.gw.cfg.HelloTimeout))
	self := netip.AddrPortFrom(s.addr, ExplicitProxyPort).String()
	req, err := hr.next()
	if err != nil {
		s.record(Decision{Proto: "http", Via: "proxy", Dest: self, Verdict: "deny", Reason: "bad_request"})
		proxyReply(c, http.StatusBadRequest, "bad_request")
		return
	}
	if req.Method == http.MethodConnect {
		s.serveConnect(c, hr, req, pol)
		return
	}
	for req != nil {
		pol = s.policy.Load()
		d := Decision{Proto: "http", Via: "proxy", Dest: self, Verdict: "deny"}
		refuse := func(code int, reason string) {
			d.Reason = reason
			s.record(d)
			proxyReply(c, code, reason)
		}
		if pol == nil || pol.Mode == policy.Blocked {
			refuse(http.StatusForbidden, "blocked")
			return
		}
		name, port, ok := proxyAuthority(req)
		if !ok {
			d.Name = req.Host
			refuse(http.StatusBadRequest, "proxy_bad_request") // origin form, or https:// without CONNECT
			return
		}
		d.Name, d.Port = name, port
		if reason := checkRequest(req); reason != "" {
			refuse(http.StatusForbidden, reason)
			return
		}
		addr, code, reason := s.proxyDecide(pol, name, port, &d)
		if reason != "" {
			refuse(code, reason)
			return
		}
		to := netip.AddrPortFrom(addr, port)
		d.Dialled = to.String()
		up, err := s.dial(to)
		if err != nil {
			refuse(http.StatusBadGateway, "upstream_unreachable")
			return
		}
		c.SetReadDeadline(time.Time{})
		d.Verdict = "allow"
		s.record(d)
		req = s.relayHTTP(c, hr, up, req, name, port, nil, true)
		up.Close()
	}
}

// serveConnect decides a CONNECT and serves the tunnel.
func (s *sandbox) serveConnect(c *net.TCPConn, hr *headReader, req *http.Request, pol *policy.Policy) {
	d := Decision{Proto: "connect", Via: "proxy", Dest: netip.AddrPortFrom(s.addr, ExplicitProxyPort).String(), Verdict: "deny"}
	refuse := func(code int, reason string) {
		d.Reason = reason
		s.record(d)
		proxyReply(c, code, reason)
	}
	host, port, err := splitTarget(req.RequestURI, 0)
	if err != nil || req.URL.Scheme != "" || req.URL.User != nil {
		d.Name = truncate(req.RequestURI, 256)
		refuse(http.StatusBadRequest, "bad_request")
		return
	}
	name := targetName(host)
	d.Name, d.Port = name, port
	if name == "" {
		d.Name = truncate(host, 256)
		refuse(http.StatusBadRequest, "bad_name")
		return
	}
	addr, code, reason := s.proxyDecide(pol, name, port, &d)
	if reason != "" {
		refuse(code, reason)
		return
	}
	d.Verdict, d.Dialled = "allow", netip.AddrPortFrom(addr, port).String()
	s.record(d)
	if _, err := c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	want := name
	if a, err := netip.ParseAddr(name); err == nil {
		want = a.String()
	}
	s.serveConn(c, hr.br, netip.AddrPortFrom(addr, port), pol, want)
}

// proxyDecide is proxyTarget, refused if the policy changed meanwhile
// (R18: the decision is made under one policy).
func (s *sandbox) proxyDecide(pol *policy.Policy, name string, port uint16, d *Decision) (netip.Addr, int, string) {
	addr, code, reason := s.proxyTarget(pol, name, port, d)
	if reason == "" && s.policy.Load() != pol {
		return netip.Addr{}, http.StatusForbidden, "policy_changed"
	}
	return addr, code, reason
}

// proxyTarget decides the destination name:port (a canonical name or an
// IP literal) asked of the explicit proxy, and resolves it: the address to
// dial, else an HTTP status and a reason.
func (s *sandbox) proxyTarget(pol *policy.Policy, name string, port uint16, d *Decision) (netip.Addr, int, string) {
	if a, err := netip.ParseAddr(name); err == nil || policy.IsIPLiteral(name) {
		// R7: no IP literals in allowlist mode; in open mode a public
		// address in its plain spelling may be dialled.
		if pol.Mode != policy.Open || err != nil {
			return netip.Addr{}, http.StatusForbidden, "ip_literal"
		}
		d.Rule = "open"
		if s.gw.filter.internal(a) {
			return netip.Addr{}, http.StatusForbidden, "internal"
		}
		return a.Unmap(), 0, ""
	}
	switch pol.Mode {
	case policy.Allowlist:
		rule, ok := pol.Allow(name, port)
		if !ok {
			return netip.Addr{}, http.StatusForbidden, "not_allowed"
		}
		d.Rule = rule.String()
	case policy.Open:
		d.Rule = "open"
	default:
		return netip.Addr{}, http.StatusForbidden, "blocked"
	}
	if !s.bkt.take() {
		return netip.Addr{}, http.StatusServiceUnavailable, "dns_rate_limited"
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.gw.cfg.DialTimeout)
	defer cancel()
	addrs, _, reason, err := s.resolve(ctx, name, pol)
	if err == nil && reason == "" && len(addrs) == 0 && s.addr6.IsValid() {
		// No IPv4 address: the name's IPv6 ones, with IPv6 on.
		addrs, _, reason, err = s.resolveType(ctx, name, pol, dnsmessage.TypeAAAA)
	}
	switch {
	case err != nil:
		s.gw.cfg.Logf("egress: %s: proxy: resolve %s: %v", s.id, name, err)
		return netip.Addr{}, http.StatusBadGateway, "upstream_error"
	case reason != "":
		return netip.Addr{}, http.StatusForbidden, reason
	case len(addrs) == 0:
		return netip.Addr{}, http.StatusBadGateway, "no_address"
	}
	s.pin(name, addrs)
	return addrs[0], 0, ""
}

// splitTarget splits host[:port]; without a port, defPort applies (0: a
// port is required). The port is plain decimal, 1-65535.
func splitTarget(authority string, defPort uint16) (string, uint16, error) {
	h, p, err := net.SplitHostPort(authority)
	if err != nil {
		if defPort == 0 {
			return "", 0, err
		}
		if strings.HasPrefix(authority, "[") && strings.HasSuffix(authority, "]") && !strings.ContainsAny(authority[1:len(authority)-1], "[]") {
			return authority[1 : len(authority)-1], defPort, nil // [IPv6]
		}
		if strings.ContainsAny(authority, ":[]") {
			return "", 0, err
		}
		return authority, defPort, nil
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != p {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	if h == "" {
		return "", 0, fmt.Errorf("no host in %q", authority)
	}
	return h, uint16(n), nil
}

// targetName is a proxy target's host as the policy sees it: an IP
// address in its canonical spelling, any other IP-literal spelling as
// given (refused), else the canonical name ("" if it is none).
func targetName(host string) string {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.String()
	}
	if policy.IsIPLiteral(host) {
		return host
	}
	n, err := policy.Canonical(host)
	if err != nil {
		return ""
	}
	return n
}

// proxyAuthority is the target of an absolute-form http:// request to the
// explicit proxy.
func proxyAuthority(r *http.Request) (string, uint16, bool) {
	if !r.URL.IsAbs() || !strings.EqualFold(r.URL.Scheme, "http") || r.URL.User != nil || r.URL.Host == "" {
		return "", 0, false
	}
	h, p, err := splitTarget(r.URL.Host, 80)
	if err != nil {
		return "", 0, false
	}
	n := targetName(h)
	return n, p, n != ""
}

// ProxyEnv is the explicit proxy's environment (ProxyEnv) for instance id
// when mode allows anything (allowlist, open); nil otherwise.
func (n *Network) ProxyEnv(id, mode string) map[string]string {
	if mode != string(policy.Allowlist) && mode != string(policy.Open) {
		return nil
	}
	l, ok := n.Links.Get(id)
	if !ok {
		return nil
	}
	return ProxyEnv(l.Host)
}
