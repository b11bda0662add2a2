package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/egress/policy"
	"github.com/space-sandbox/space/internal/netns"
)

const (
	maxHeader   = 32 << 10
	openSniff   = 300 * time.Millisecond // open mode: a server-speaks-first protocol sends nothing
	idleTimeout = 5 * time.Minute
)

// track registers a connection so that Detach can close it; false means
// the sandbox is going away.
func (s *sandbox) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		c.Close()
		return false
	}
	s.open[c] = struct{}{}
	return true
}

func (s *sandbox) untrack(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.open, c)
	s.mu.Unlock()
}

func (s *sandbox) serveProxy(ln *net.TCPListener) {
	defer s.wg.Done()
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case s.conns <- struct{}{}:
		default:
			c.SetLinger(0)
			c.Close()
			s.record(Decision{Proto: "tcp", Verdict: "deny", Reason: "overload"})
			continue
		}
		if !s.track(c) {
			<-s.conns
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.conns }()
			defer s.untrack(c)
			s.handle(c)
		}()
	}
}

// handle decides one connection from the sandbox and, if allowed, relays
// it over a new upstream connection.
func (s *sandbox) handle(c *net.TCPConn) {
	pol := s.policy.Load()
	orig, err := netns.OriginalDst(c)
	d := Decision{Proto: "tcp", Verdict: "deny"}
	deny := func(reason string) {
		d.Reason = reason
		s.record(d)
		c.SetLinger(0) // RST: the sandbox learns nothing more
	}
	if err != nil {
		deny("no_original_dst")
		return
	}
	d.Dest, d.Port = orig.String(), orig.Port()
	if pol == nil || pol.Mode == policy.Blocked {
		deny("blocked") // before reading a byte; no upstream socket (R17)
		return
	}
	if (orig.Addr() == s.addr || s.addr6.IsValid() && orig.Addr() == s.addr6) && orig.Port() == ExplicitProxyPort {
		s.serveExplicit(c, pol) // explicit.go
		return
	}
	s.serveConn(c, bufio.NewReaderSize(c, 4096), orig, pol, "")
}

// serveConn decides and relays one connection whose first bytes br reads:
// a transparent one (orig is its original destination) or a tunnel the
// explicit proxy opened (orig is the address the gateway resolved for the
// CONNECT authority, want its canonical name, which the SNI or Host must
// then equal).
func (s *sandbox) serveConn(c *net.TCPConn, br *bufio.Reader, orig netip.AddrPort, pol *policy.Policy, want string) {
	d := Decision{Proto: "tcp", Verdict: "deny", Dest: orig.String(), Port: orig.Port()}
	if want != "" {
		d.Via = "proxy"
	}
	deny := func(reason string) {
		d.Reason = reason
		s.record(d)
		c.SetLinger(0) // RST: the sandbox learns nothing more
	}
	// First bytes: a ClientHello, an HTTP request head, or (open mode only)
	// anything, or nothing for a server-speaks-first protocol.
	wait := s.gw.cfg.HelloTimeout
	if pol.Mode == policy.Open {
		wait = openSniff
	}
	c.SetReadDeadline(time.Now().Add(wait))
	first, err := br.Peek(1)
	var (
		name   string
		replay []byte
		req    *http.Request
		hr     *headReader
	)
	switch {
	case err != nil && pol.Mode == policy.Open && isTimeout(err):
		// Nothing sent: an opaque stream to a public address.
	case err != nil:
		deny("no_request")
		return
	case first[0] == 0x16:
		d.Proto = "tls"
		c.SetReadDeadline(time.Now().Add(s.gw.cfg.HelloTimeout))
		sni, raw, err := readClientHello(br)
		if err != nil {
			deny("bad_client_hello")
			return
		}
		name, replay = sni, raw
	default:
		head, _ := br.Peek(8)
		if !looksHTTP(head) {
			if pol.Mode != policy.Open {
				deny("unknown_protocol")
				return
			}
			break // open mode: an opaque stream to a public address
		}
		d.Proto = "http"
		c.SetReadDeadline(time.Now().Add(s.gw.cfg.HelloTimeout))
		hr = newHeadReader(br)
		r, err := hr.next()
		if err != nil {
			deny("bad_request")
			return
		}
		if reason := checkRequest(r); reason != "" {
			d.Name = r.Host
			deny(reason)
			return
		}
		req, name = r, r.Host
	}
	c.SetReadDeadline(time.Time{})
	if name != "" {
		canon, err := canonicalHost(name, orig.Port())
		if err != nil {
			d.Name = name
			deny("bad_name")
			return
		}
		name = canon
	}
	d.Name = name
	if want != "" && name != want && (name != "" || pol.Mode != policy.Open) {
		// R9: through CONNECT, the SNI or Host is the CONNECT authority
		// (open mode may tunnel what names nothing: an opaque stream).
		if name == "" {
			name = want
		}
		deny("connect_mismatch")
		return
	}
	dial := orig.Addr()
	switch pol.Mode {
	case policy.Allowlist:
		if name == "" {
			if d.Proto == "tls" {
				deny("no_sni")
			} else {
				deny("no_host")
			}
			return
		}
		if policy.IsIPLiteral(name) {
			deny("ip_literal")
			return
		}
		rule, ok := pol.Allow(name, orig.Port())
		if !ok {
			deny("not_allowed")
			return
		}
		d.Rule = rule.String()
		// R6: the address must be one the gateway resolved for this very
		// name for this sandbox; that is the address dialled.
		if !s.pinned(name, dial) {
			deny("not_resolved")
			return
		}
	case policy.Open:
		d.Rule = "open"
	}
	if s.gw.filter.internal(dial) {
		deny("internal")
		return
	}
	if s.policy.Load() != pol {
		deny("policy_changed")
		return
	}
	up, err := s.dial(netip.AddrPortFrom(dial, orig.Port()))
	d.Dialled = netip.AddrPortFrom(dial, orig.Port()).String()
	if err != nil {
		deny("upstream_unreachable")
		return
	}
	defer up.Close()
	if d.Proto == "tls" && name != "" && s.terminate(pol, name, orig.Port()) {
		// R10: the gateway's own TLS upstream, verified for the
		// authorised name, before the sandbox's handshake completes.
		d.TLS = "terminated"
		upTLS, err := s.upstreamTLS(up, name)
		if err != nil {
			s.gw.cfg.Logf("egress: %s: upstream TLS %s (%s): %v", s.id, name, d.Dialled, err)
			deny("upstream_tls")
			return
		}
		d.Verdict = "allow"
		s.record(d)
		// Credentials need the address to be one the gateway resolved for
		// this name (in allowlist mode it always is; in open mode the
		// sandbox chose it).
		s.serveTerminated(c, io.MultiReader(bytes.NewReader(replay), br), upTLS, pol, name, orig.Port(), s.pinned(name, dial))
		return
	}
	if d.Proto == "tls" {
		d.TLS = "passthrough"
	}
	d.Verdict = "allow"
	s.record(d)
	if req != nil {
		s.relayHTTP(c, hr, up, req, name, orig.Port(), nil, false)
		return
	}
	if len(replay) > 0 {
		if _, err := up.Write(replay); err != nil {
			return
		}
	}
	relay(c, br, up)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// dial connects upstream, checking the address once more at connect time.
func (s *sandbox) dial(to netip.AddrPort) (net.Conn, error) {
	s.count(func(st *Stats) { st.UpstreamSockets++ })
	d := net.Dialer{Timeout: s.gw.cfg.DialTimeout, Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || s.gw.filter.internal(ap.Addr()) {
			return fmt.Errorf("refusing to dial %s", address)
		}
		return nil
	}}
	ctx, cancel := context.WithTimeout(s.ctx, s.gw.cfg.DialTimeout)
	defer cancel()
	network := "tcp4"
	if to.Addr().Is6() {
		network = "tcp6"
	}
	return d.DialContext(ctx, network, to.String())
}

// canonicalHost canonicalises a Host or SNI value; a port, if present,
// must be the connection's.
func canonicalHost(h string, port uint16) (string, error) {
	host := h
	i := strings.LastIndexByte(h, ':')
	if strings.HasPrefix(h, "[") {
		i = -1
		if j := strings.LastIndex(h, "]:"); j >= 0 {
			i = j + 1 // [IPv6]:port
		}
	}
	if i >= 0 {
		p, err := strconv.ParseUint(h[i+1:], 10, 16)
		if err != nil || uint16(p) != port {
			return "", errors.New("port mismatch")
		}
		host = h[:i]
	}
	if strings.HasPrefix(host, "[") {
		// An IPv6 literal: its canonical spelling, an IP literal to the
		// policy (denied in allowlist mode, R7).
		a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
		if err != nil || !strings.HasSuffix(host, "]") || a.Zone() != "" {
			return "", errors.New("bad IPv6 literal")
		}
		return a.String(), nil
	}
	return policy.Canonical(host)
}

var methods = []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ", "TRACE ", "CONNECT "}

// looksHTTP reports whether the first bytes start an HTTP/1 request line.
func looksHTTP(b []byte) bool {
	for _, m := range methods {
		n := min(len(b), len(m))
		if n > 0 && string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}

// headReader reads requests from the sandbox, bounding each head to
// maxHeader bytes while letting bodies stream.
type headReader struct {
	lim *limited
	br  *bufio.Reader
}

func newHeadReader(src io.Reader) *headReader {
	l := &limited{r: src}
	return &headReader{lim: l, br: bufio.NewReaderSize(l, 4096)}
}

func (h *headReader) next() (*http.Request, error) {
	h.lim.left = maxHeader
	r, err := http.ReadRequest(h.br)
	h.lim.left = -1
	return r, err
}

type limited struct {
	r    io.Reader
	left int // < 0: unlimited
}

func (l *limited) Read(p []byte) (int, error) {
	if l.left == 0 {
		return 0, errors.New("request head too large")
	}
	if l.left > 0 && len(p) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	if l.left > 0 {
		l.left -= n
	}
	return n, err
}

// checkRequest applies R9/R12 to one request: origin form (or an absolute
// form naming the same authority), no CONNECT, no upgrades, one Host.
func checkRequest(r *http.Request) string {
	switch {
	case r.Method == http.MethodConnect:
		return "connect_denied"
	case r.Host == "":
		return "no_host"
	case len(r.Header.Values("Host")) > 0:
		return "duplicate_host"
	case r.Header.Get("Upgrade") != "":
		return "upgrade_denied"
	case r.URL.IsAbs() && !strings.EqualFold(r.URL.Host, r.Host):
		return "authority_mismatch"
	}
	return ""
}

// relayHTTP serves the connection request by request: every request's Host
// must be the authorised name (R9), forwarding headers from the sandbox are
// dropped, and each response is copied back.
//
// term is nil for plaintext HTTP, where any credential placeholder is
// refused (R13f); on a terminated TLS connection it says whether
// credentials may be injected, and responses to credential-bearing
// requests are scrubbed (R14).
//
// proxied: the requests come to the explicit proxy in absolute form; one
// that names another authority than name:port is returned, unanswered, for
// a decision of its own.
func (s *sandbox) relayHTTP(c net.Conn, hr *headReader, up net.Conn, req *http.Request, name string, port uint16, term *termInfo, proxied bool) *http.Request {
	upr := bufio.NewReader(up)
	proto := "http"
	if term != nil {
		proto = "https"
	}
	via := ""
	if proxied {
		via = "proxy"
	}
	for first := true; ; first = false {
		if proxied && !first {
			if n, p, ok := proxyAuthority(req); !ok || n != name || p != port {
				return req
			}
		}
		if reason := checkRequest(req); reason != "" {
			s.record(Decision{Proto: proto, Via: via, Name: req.Host, Port: port, Verdict: "deny", Reason: reason})
			writeStatus(c, http.StatusForbidden)
			return nil
		}
		h, err := canonicalHost(req.Host, port)
		if err != nil || h != name {
			s.record(Decision{Proto: proto, Via: via, Name: req.Host, Port: port, Verdict: "deny", Reason: "host_mismatch"})
			writeStatus(c, http.StatusMisdirectedRequest)
			return nil
		}
		// Method/path rules: every request is decided on its own, against
		// the policy in force now.
		if _, ok := s.policy.Load().AllowRequest(name, port, req.Method, requestPath(req)); !ok {
			d := Decision{Proto: proto, Via: via, Name: name, Port: port, Verdict: "deny", Reason: "request_not_allowed",
				// No rule allowed it: say which request was refused.
				Rule: "request " + truncate(req.Method, 16) + " " + truncate(req.URL.EscapedPath(), 256)}
			if term != nil {
				d.TLS = "terminated"
			}
			s.record(d)
			writeStatus(c, http.StatusForbidden)
			return nil
		}
		for _, k := range []string{"X-Forwarded-Host", "X-Forwarded-For", "Forwarded", "Proxy-Authorization", "Proxy-Connection"} {
			req.Header.Del(k)
		}
		var used []Credential
		if term == nil {
			if hasPlaceholder(req) {
				s.alert(Decision{Proto: proto, Via: via, Name: name, Port: port, Verdict: "deny", Reason: "credential_plaintext"})
				writeStatus(c, http.StatusForbidden)
				return nil
			}
		} else {
			var reason string
			used, reason = s.creds.Load().inject(req, name, port, term.verified)
			if reason != "" {
				s.alert(Decision{Proto: proto, Via: via, Name: name, Port: port, Verdict: "deny", Reason: reason})
				writeStatus(c, http.StatusForbidden)
				return nil
			}
			if len(used) > 0 {
				ids := make([]string, len(used))
				for i, u := range used {
					ids[i] = u.ID
				}
				s.record(Decision{Proto: proto, Via: via, Name: name, Port: port, Verdict: "allow", Rule: "credential " + strings.Join(ids, ","), Reason: "credential_injected", TLS: "terminated"})
				// The response must be scannable: no compression (R14).
				req.Header.Del("Accept-Encoding")
				req.Header.Del("Te")
			}
		}
		req.URL.Scheme, req.URL.Host = "", ""
		if err := req.Write(up); err != nil {
			return nil
		}
		up.SetReadDeadline(time.Now().Add(idleTimeout))
		resp, err := http.ReadResponse(upr, req)
		if err != nil {
			writeStatus(c, http.StatusBadGateway)
			return nil
		}
		if len(used) > 0 && !scrubResponse(resp, used) {
			resp.Body.Close()
			s.record(Decision{Proto: proto, Via: via, Name: name, Port: port, Verdict: "deny", Reason: "unscannable_response"})
			writeStatus(c, http.StatusBadGateway)
			return nil
		}
		err = resp.Write(c)
		resp.Body.Close()
		if err != nil || resp.Close || req.Close {
			return nil
		}
		c.SetReadDeadline(time.Now().Add(idleTimeout))
		next, err := hr.next()
		if err != nil {
			return nil
		}
		req = next
	}
}

// requestPath returns the request's decoded path when it is normalised
// and carries no encoded slash, backslash or dot (what is matched is what
// the upstream sees), else "".
func requestPath(r *http.Request) string {
	raw := r.URL.EscapedPath()
	low := strings.ToLower(raw)
	if strings.Contains(low, "%2f") || strings.Contains(low, "%5c") || strings.Contains(low, "%2e") || strings.Contains(raw, "\\") {
		return ""
	}
	if !policy.NormalPath(r.URL.Path) {
		return ""
	}
	return r.URL.Path
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func writeStatus(c net.Conn, code int) {
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", code, http.StatusText(code))
}

// relay copies both ways until either side is done.
func relay(c net.Conn, br io.Reader, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(up, br)
		if tc, ok := up.(interface{ CloseWrite() error }); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		io.Copy(c, up)
		if tc, ok := c.(interface{ CloseWrite() error }); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}
