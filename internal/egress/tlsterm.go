package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/space-sandbox/space/internal/egress/policy"
)

// termInfo describes a TLS connection the gateway terminated.
type termInfo struct {
	// verified: the upstream was dialled to an address the gateway itself
	// resolved for the name, and its certificate verified for the name.
	verified bool
}

// terminate decides whether TLS to name:port is terminated (R10). In
// allowlist mode everything is, unless the policy leaves the name in
// pass-through; a host with a bound credential always is; in open mode
// only such hosts are.
func (s *sandbox) terminate(pol *policy.Policy, name string, port uint16) bool {
	if s.creds.Load().bound(name, port) {
		return true
	}
	// A rule limiting methods or paths is checked per request, so it needs
	// the plaintext: pass-through does not apply to it.
	return pol.Mode == policy.Allowlist && (!pol.IsPassthrough(name, port) || pol.Inspect(name, port))
}

// upstreamTLS runs the gateway's own handshake with the upstream, with
// full verification for the authorised name.
func (s *sandbox) upstreamTLS(up net.Conn, name string) (*tls.Conn, error) {
	c := tls.Client(up, &tls.Config{
		ServerName: name,
		RootCAs:    s.gw.cfg.UpstreamRoots,
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	ctx, cancel := context.WithTimeout(s.ctx, s.gw.cfg.DialTimeout)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "" && p != "http/1.1" {
		return nil, fmt.Errorf("upstream negotiated %q", p)
	}
	return c, nil
}

// replayConn is the sandbox's connection with the ClientHello bytes the
// gateway already read put back in front.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// serveTerminated completes the sandbox's handshake with a certificate
// from its CA for the authorised name, then serves HTTP/1 requests, each
// checked against that name (R9). Anything but HTTP inside is relayed only
// in open mode.
func (s *sandbox) serveTerminated(c net.Conn, rd io.Reader, up *tls.Conn, pol *policy.Policy, name string, port uint16, verified bool) {
	leaf, err := s.ca.leaf(name)
	if err != nil {
		s.gw.cfg.Logf("egress: %s: %v", s.id, err)
		return
	}
	sc := tls.Server(&replayConn{Conn: c, r: rd}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	ctx, cancel := context.WithTimeout(s.ctx, s.gw.cfg.HelloTimeout)
	err = sc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		return
	}
	sc.SetReadDeadline(time.Now().Add(s.gw.cfg.HelloTimeout))
	br := bufio.NewReaderSize(sc, 4096)
	head, err := br.Peek(8)
	if err != nil && len(head) == 0 {
		return
	}
	if !looksHTTP(head) {
		if pol.Mode != policy.Open {
			s.record(Decision{Proto: "https", Name: name, Port: port, Verdict: "deny", Reason: "unknown_protocol", TLS: "terminated"})
			return
		}
		sc.SetReadDeadline(time.Time{})
		relay(sc, br, up)
		return
	}
	hr := newHeadReader(br)
	req, err := hr.next()
	if err != nil {
		s.record(Decision{Proto: "https", Name: name, Port: port, Verdict: "deny", Reason: "bad_request", TLS: "terminated"})
		writeStatus(sc, 400)
		return
	}
	sc.SetReadDeadline(time.Time{})
	s.relayHTTP(sc, hr, up, req, name, port, &termInfo{verified: verified}, false)
	sc.Close()
}

// alert records a credential misuse and reports it to the node's log.
func (s *sandbox) alert(d Decision) {
	s.record(d)
	s.gw.cfg.Logf("egress: ALERT sandbox %s: %s to %s:%d refused", s.id, d.Reason, d.Name, d.Port)
}
