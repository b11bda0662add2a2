package egress_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
)

// The offline fake internet: a "wan" network namespace, reached from the
// test's private namespace (where the server, its gateway and the sandbox
// veths live) through one veth, uplink 192.0.2.1 <-> 192.0.2.254. Every
// server in it records every contact; the attacker's records are the
// bypass oracle.
const (
	upstreamDNS = "192.0.2.53"
	edgeIP      = "203.0.113.10" // shared CDN IP: registry.test and the attacker tenant evil-cdn.test
	attackerIP  = "198.51.100.66"
	uplinkIP    = "192.0.2.1"
)

type zoneEntry struct {
	a     []string
	cname string
}

var zone = map[string]zoneEntry{
	"registry.test":           {a: []string{edgeIP}},
	"files.registry.test":     {a: []string{edgeIP}},
	"evil-cdn.test":           {a: []string{edgeIP}},
	"evil.test":               {a: []string{attackerIP}},
	"x.evil.test":             {a: []string{attackerIP}},
	"evilregistry.test":       {a: []string{attackerIP}},
	"cdn-alias.registry.test": {cname: "x.evil.test"},
	"tt.registry.test":        {a: []string{"127.0.0.1", "169.254.169.254"}},
	"local.test":              {a: []string{"127.0.0.1"}},
	"corp.test":               {a: []string{"10.0.0.1"}},
}

// wan is the fake internet and its contact log.
type wan struct {
	mu       sync.Mutex
	events   []string // every contact, "who: what"
	attacker []string // contacts with an attacker endpoint
	queries  []string // names the fake upstream resolver was asked
	closers  []io.Closer
}

func (w *wan) note(attacker bool, format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := fmt.Sprintf(format, args...)
	w.events = append(w.events, s)
	if attacker {
		w.attacker = append(w.attacker, s)
	}
}

// attackerSaw reports whether any attacker endpoint saw s.
func (w *wan) attackerSaw(s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.attacker {
		if strings.Contains(e, s) {
			return true
		}
	}
	return false
}

func (w *wan) asked(s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, q := range w.queries {
		if strings.Contains(q, s) {
			return true
		}
	}
	return false
}

func (w *wan) sawEvent(s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.events {
		if strings.Contains(e, s) {
			return true
		}
	}
	return false
}

func (w *wan) close() {
	for _, c := range w.closers {
		c.Close()
	}
}

// startWAN builds the wan namespace and its servers. It must run in the
// test's private network namespace.
func startWAN() (_ *wan, err error) {
	w := &wan{}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, err := vns.Get()
	if err != nil {
		return nil, err
	}
	defer host.Close()
	wanNS, err := vns.New() // and this thread is now in it
	if err != nil {
		return nil, err
	}
	defer wanNS.Close()
	back := func() {
		if err := vns.Set(host); err != nil {
			panic("cannot return to the test's netns: " + err.Error())
		}
	}
	ok := false
	defer func() {
		if !ok {
			back()
			w.close()
		}
	}()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return nil, err
	}
	for _, a := range []string{upstreamDNS, edgeIP, attackerIP} {
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a).To4(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return nil, fmt.Errorf("wan address %s: %w", a, err)
		}
	}
	// Servers, created while this thread is in wan: their sockets stay there.
	if err := w.serveDNS(); err != nil {
		return nil, err
	}
	if err := w.serveEdge(); err != nil {
		return nil, err
	}
	if err := w.serveAttacker(); err != nil {
		return nil, err
	}
	back()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "wan0", PeerNamespace: netlink.NsFd(int(wanNS))}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, err
	}
	up, err := netlink.LinkByName("up0")
	if err != nil {
		return nil, err
	}
	if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(uplinkIP).To4(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(up); err != nil {
		return nil, err
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: net.ParseIP("192.0.2.254").To4()}); err != nil {
		return nil, fmt.Errorf("default route: %w", err)
	}
	h, err := netlink.NewHandleAt(wanNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	peer, err := h.LinkByName("wan0")
	if err != nil {
		return nil, err
	}
	if err := h.AddrAdd(peer, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("192.0.2.254").To4(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return nil, err
	}
	if err := h.LinkSetUp(peer); err != nil {
		return nil, err
	}
	ok = true
	return w, nil
}

func (w *wan) serveDNS() error {
	pc, err := net.ListenPacket("udp4", upstreamDNS+":53")
	if err != nil {
		return err
	}
	w.closers = append(w.closers, pc)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := w.dnsAnswer(buf[:n], from); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	return nil
}

func (w *wan) dnsAnswer(msg []byte, from net.Addr) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	name := strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")
	w.mu.Lock()
	w.queries = append(w.queries, name)
	w.mu.Unlock()
	w.note(strings.HasSuffix(name, "evil.test"), "dns %s asked %s by %s", upstreamDNS, name, from)
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
	b.StartQuestions()
	b.Question(q)
	b.StartAnswers()
	cur := name
	found := false
	for i := 0; i < 4; i++ {
		e, ok := zone[cur]
		if !ok && strings.HasSuffix(cur, ".evil.test") {
			e, ok = zone["x.evil.test"]
		}
		if !ok {
			break
		}
		found = true
		qn, _ := dnsmessage.NewName(cur + ".")
		if e.cname != "" {
			tn, _ := dnsmessage.NewName(e.cname + ".")
			b.CNAMEResource(dnsmessage.ResourceHeader{Name: qn, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.CNAMEResource{CNAME: tn})
			cur = e.cname
			continue
		}
		if q.Type == dnsmessage.TypeA {
			for _, a := range e.a {
				b.AResource(dnsmessage.ResourceHeader{Name: qn, Class: dnsmessage.ClassINET, TTL: 0}, dnsmessage.AResource{A: netip.MustParseAddr(a).As4()})
			}
		}
		break
	}
	out, _ := b.Finish()
	if !found {
		out[3] |= 3 // NXDOMAIN
	}
	return out
}

func selfSigned(names ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// serveEdge is the shared CDN address: vhosts by Host header, the
// registry's and the attacker tenant's (also its default vhost).
func (w *wan) serveEdge() error {
	handler := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		host := strings.ToLower(r.Host)
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		if host == "registry.test" || strings.HasSuffix(host, ".registry.test") {
			w.note(false, "edge registry %s %s sni=%s from %s", host, r.URL, sni, r.RemoteAddr)
			io.WriteString(rw, "registry ok\n")
			return
		}
		w.note(true, "edge attacker-tenant %s %s sni=%s from %s", host, r.URL, sni, r.RemoteAddr)
		io.WriteString(rw, "FLAG-edge\n")
	})
	cert, err := selfSigned("registry.test", "*.registry.test", "evil-cdn.test")
	if err != nil {
		return err
	}
	for _, port := range []string{"80", "443"} {
		ln, err := net.Listen("tcp4", edgeIP+":"+port)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
		w.closers = append(w.closers, srv)
		if port == "443" {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
		}
		go srv.Serve(ln)
	}
	return nil
}

// serveAttacker is flagd: any TCP port it listens on answers FLAG and
// records what it got; UDP is recorded too.
func (w *wan) serveAttacker() error {
	for _, port := range []string{"80", "443", "4444", "8080"} {
		ln, err := net.Listen("tcp4", attackerIP+":"+port)
		if err != nil {
			return err
		}
		w.closers = append(w.closers, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(3 * time.Second))
					buf := make([]byte, 2048)
					n, _ := c.Read(buf)
					w.note(true, "flagd tcp %s from %s: %q", c.LocalAddr(), c.RemoteAddr(), buf[:n])
					io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nFLAG-flagd\n")
				}()
			}
		}()
	}
	for _, port := range []string{"53", "9999"} {
		pc, err := net.ListenPacket("udp4", attackerIP+":"+port)
		if err != nil {
			return err
		}
		w.closers = append(w.closers, pc)
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				w.note(true, "flagd udp %s from %s: %q", pc.LocalAddr(), from, buf[:n])
			}
		}()
	}
	return nil
}
