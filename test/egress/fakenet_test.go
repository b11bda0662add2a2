package egress_test

import (
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
)

// The offline fake internet: a "wan" network namespace, reached from the
// test's private namespace (where the server, its gateway and the sandbox
// veths live) through one veth, uplink 192.0.2.1 <-> 192.0.2.254. Every
// server in it records every contact; the attacker's records are the
// bypass oracle.
const (
	upstreamDNS  = "192.0.2.53"
	edgeIP       = "203.0.113.10" // shared CDN IP: registry.test and the attacker tenant evil-cdn.test
	attackerIP   = "198.51.100.66"
	apiIP        = "203.0.113.20" // api.test: the credential-bound upstream
	apiSiblingIP = "203.0.113.21" // files.api.test: a sibling host, not bound
	uplinkIP     = "192.0.2.1"
)

type zoneEntry struct {
	a      []string
	aaaa   []string // IPv6 answers (TestEgressIPv6)
	cname  string
	rotate bool // one answer per query, in turn (TTL 0 rebinding)
}

var zone = map[string]zoneEntry{
	"registry.test":           {a: []string{edgeIP}},
	"files.registry.test":     {a: []string{edgeIP}},
	"evil-cdn.test":           {a: []string{edgeIP}},
	"evil.test":               {a: []string{attackerIP}},
	"x.evil.test":             {a: []string{attackerIP}},
	"evilregistry.test":       {a: []string{attackerIP}},
	"api.test":                {a: []string{apiIP}},
	"forged.registry.test":    {a: []string{attackerIP}}, // the attacker's TLS with a certificate from its own CA
	"cdn-alias.registry.test": {cname: "x.evil.test"},
	"tt.registry.test":        {a: []string{edgeIP, "127.0.0.1", "169.254.169.254", "10.200.0.1"}, rotate: true},
	"tt.evil.test":            {a: []string{attackerIP, "127.0.0.1", "169.254.169.254", "10.200.0.1"}, rotate: true},
	"rebind.evil.test":        {a: []string{attackerIP, "10.200.0.1", "127.0.0.1", "169.254.169.254", "10.200.0.6", "10.0.0.1", "0.0.0.0"}, rotate: true},
	"rebind2.evil.test":       {a: []string{attackerIP, "10.200.0.1", "127.0.0.1", "169.254.169.254", "10.200.0.6", "10.0.0.1", "0.0.0.0"}},
	"rb.registry.test":        {cname: "rebind.evil.test"},
	"files.api.test":          {a: []string{apiSiblingIP}},
	"api.test.evil.test":      {a: []string{attackerIP}},
	"local.test":              {a: []string{"127.0.0.1"}},
	"corp.test":               {a: []string{"10.0.0.1"}},
}

// wan is the fake internet and its contact log.
type wan struct {
	roots    *x509.CertPool // the test CA the gateway trusts for upstreams
	canary   string         // the real secret; only api.test's checker may see it
	ca       *testCA
	mu       sync.Mutex
	events   []string // every contact, "who: what"
	attacker []string // contacts with an attacker endpoint
	queries  []string // names the fake upstream resolver was asked
	closers  []io.Closer
	flag     string            // FLAG: only attacker endpoints return it
	wire     *wire             // every packet that reached the wan from the uplink
	internal []string          // contacts with internal listeners (metadata, host, corp)
	registry map[string][]byte // registry.test's files (fake Debian and Python repositories)
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

// attackerCount is the number of attacker contacts so far.
func (w *wan) attackerCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.attacker)
}

// sawEventExceptChecker reports whether any contact other than api.test's
// checker lines recorded s (api.test's echo of the secret goes back to the
// gateway, which must scrub it; the log line itself never holds it).
func (w *wan) sawEventExceptChecker(s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.events {
		if strings.Contains(e, s) {
			return true
		}
	}
	return false
}

// count says how many contacts mention s.
func (w *wan) count(s string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.events {
		if strings.Contains(e, s) {
			n++
		}
	}
	return n
}

func (w *wan) close() {
	for _, c := range w.closers {
		c.Close()
	}
}

// startWAN builds the wan namespace and its servers. It must run in the
// test's private network namespace.
func startWAN() (_ *wan, err error) {
	w := &wan{canary: "space-canary-" + randHex(), flag: "FLAG-" + randHex()}
	if w.registry, err = registryFiles(); err != nil {
		return nil, err
	}
	if w.ca, err = newTestCA("SPACE egress test upstream CA"); err != nil {
		return nil, err
	}
	w.roots = x509.NewCertPool()
	w.roots.AddCert(w.ca.cert)
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
	for _, a := range append([]string{upstreamDNS, edgeIP, attackerIP, apiIP, apiSiblingIP}, labIPs...) {
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a).To4(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return nil, fmt.Errorf("wan address %s: %w", a, err)
		}
	}
	for _, a := range []string{attackerIP6, edgeIP6} {
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
			return nil, fmt.Errorf("wan address %s: %w", a, err)
		}
	}
	// O-WIRE: a packet socket in wan sees every packet the uplink delivers.
	if w.wire, err = captureWire(lo.Attrs().Index); err != nil {
		return nil, err
	}
	w.closers = append(w.closers, w.wire)
	if err := w.serveAttacker6(); err != nil {
		return nil, err
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
	if err := w.serveAPI(); err != nil {
		return nil, err
	}
	if err := w.serveLab(); err != nil {
		return nil, err
	}
	back()
	// An earlier test's uplink goes with its wan namespace, but not
	// necessarily at once.
	if old, err := netlink.LinkByName("up0"); err == nil {
		netlink.LinkDel(old)
	}
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
	if err := w.linkV6(up, h, peer); err != nil {
		return nil, err
	}
	// The test's namespace (the "host") forwards, as a real host with
	// containers or VMs often does: what stops a sandbox's packets must be
	// the gateway's rules, not a forwarding switch that happens to be off.
	for _, k := range []string{"ipv4/ip_forward", "ipv6/conf/all/forwarding"} {
		if err := os.WriteFile("/proc/sys/net/"+k, []byte("1"), 0); err != nil {
			return nil, fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	if err := w.serveInternal(); err != nil {
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
			answers := e.a
			if e.rotate {
				w.mu.Lock()
				i := len(w.queries)
				w.mu.Unlock()
				answers = []string{e.a[i%len(e.a)]}
			}
			for _, a := range answers {
				b.AResource(dnsmessage.ResourceHeader{Name: qn, Class: dnsmessage.ClassINET, TTL: 0}, dnsmessage.AResource{A: netip.MustParseAddr(a).As4()})
			}
		}
		if q.Type == dnsmessage.TypeAAAA {
			for _, a := range e.aaaa {
				b.AAAAResource(dnsmessage.ResourceHeader{Name: qn, Class: dnsmessage.ClassINET, TTL: 0}, dnsmessage.AAAAResource{AAAA: netip.MustParseAddr(a).As16()})
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

func randHex() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// testCA issues the fake internet's certificates: one the gateway trusts
// (the registry's and api.test's), one it does not (the attacker's
// forgeries).
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(name string) (*testCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &testCA{cert: cert, key: key}, nil
}

func (ca *testCA) issue(names ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key}, nil
}

// serveAPI is api.test, the credential-bound upstream: it logs whether the
// real secret arrived (the canary checker) and echoes request headers, as
// an API that reflects its caller's token would (RT-33).
func (w *wan) serveAPI() error {
	handler := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("Authorization")
		switch {
		case got == "Bearer "+w.canary:
			w.note(false, "api.test credential-ok %s %s tls=%v", r.Method, r.URL.Path, r.TLS != nil)
		case strings.Contains(strings.ToLower(fmt.Sprint(r.Header, r.URL)), "space-cred-"):
			w.note(false, "api.test placeholder-seen %s %s tls=%v", r.Method, r.URL.Path, r.TLS != nil)
		default:
			w.note(false, "api.test no-credential %s %s tls=%v", r.Method, r.URL.Path, r.TLS != nil)
		}
		if strings.HasPrefix(r.URL.Path, "/v1/redir") {
			http.Redirect(rw, r, r.URL.Query().Get("to"), http.StatusFound)
			return
		}
		if apiEcho(rw, r, got) {
			return
		}
		rw.Header().Set("X-Echo-Authorization", got)
		fmt.Fprintf(rw, "api ok %s %s auth=%q b64=%s\n", r.Method, r.URL.Path, got, base64.StdEncoding.EncodeToString([]byte(got)))
	})
	cert, err := w.ca.issue("api.test")
	if err != nil {
		return err
	}
	if err := w.listenHTTP(apiIP, handler, cert); err != nil {
		return err
	}
	// files.api.test: not bound; logs what authorization it got.
	sib, err := w.ca.issue("files.api.test")
	if err != nil {
		return err
	}
	return w.listenHTTP(apiSiblingIP, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.note(false, "files.api.test %s %s auth=%q", r.Method, r.URL, r.Header.Get("Authorization"))
		fmt.Fprintf(rw, "files.api.test echo auth=%q\n", r.Header.Get("Authorization"))
	}), sib)
}

// listenHTTP serves handler on ip:80 and, with cert, ip:443.
func (w *wan) listenHTTP(ip string, handler http.Handler, cert tls.Certificate) error {
	network := "tcp4"
	if strings.Contains(ip, ":") {
		network = "tcp6"
	}
	for _, port := range []string{"80", "443"} {
		ln, err := net.Listen(network, net.JoinHostPort(ip, port))
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
		if host == "registry.test" && strings.HasPrefix(r.URL.Path, "/blob/") {
			// Bulk download for the benchmarks: /blob/<MiB>, not logged.
			n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/blob/"))
			buf := make([]byte, 1<<20)
			rw.Header().Set("Content-Length", strconv.Itoa(n<<20))
			for i := 0; i < n; i++ {
				rw.Write(buf)
			}
			return
		}
		if host == "registry.test" || strings.HasSuffix(host, ".registry.test") {
			w.note(false, "edge registry %s %s %s sni=%s auth=%q from %s", r.Method, host, r.URL, sni, r.Header.Get("Authorization"), r.RemoteAddr)
			switch p := r.URL.Path; {
			case w.registry[p] != nil:
				if r.Method != http.MethodGet && r.Method != http.MethodHead {
					http.Error(rw, "read-only", http.StatusMethodNotAllowed)
					return
				}
				http.ServeContent(rw, r, p, time.Unix(1700000000, 0), bytes.NewReader(w.registry[p]))
			case strings.HasPrefix(p, "/debian/") || strings.HasPrefix(p, "/packages/") || strings.HasPrefix(p, "/simple/") && p != "/simple/":
				http.NotFound(rw, r)
			case p == "/r": // open redirect (RT-29)
				http.Redirect(rw, r, r.URL.Query().Get("to"), http.StatusFound)
			case p == "/echo/headers":
				fmt.Fprintf(rw, "registry echo %v\n", r.Header)
			case strings.HasPrefix(p, "/proxy/"): // fetch-through relay to any origin (RT-49): a request here reaches the attacker
				w.note(true, "edge registry relay-through to %s", r.URL)
				io.WriteString(rw, w.flag+"-relay\n")
			case strings.HasPrefix(p, "/upload/"): // write channel (RT-49)
				body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
				w.note(true, "edge registry upload %s %s body %q", r.Method, r.URL, body)
				io.WriteString(rw, "stored\n")
			default:
				io.WriteString(rw, "registry ok\n")
			}
			return
		}
		w.note(true, "edge attacker-tenant %s %s sni=%s headers=%v from %s", host, r.URL, sni, r.Header, r.RemoteAddr)
		io.WriteString(rw, w.flag+"-edge\n")
	})
	// One shared-SAN certificate for both tenants, as on a real CDN edge.
	cert, err := w.ca.issue("registry.test", "*.registry.test", "evil-cdn.test")
	if err != nil {
		return err
	}
	if err := w.listenHTTP(edgeIP, handler, cert); err != nil {
		return err
	}
	return w.listenHTTP(edgeIP6, handler, cert)
}

// serveAttacker is flagd: any TCP port it listens on answers FLAG and
// records what it got; UDP is recorded too.
func (w *wan) serveAttacker() error {
	forger, err := newTestCA("attacker CA")
	if err != nil {
		return err
	}
	forged, err := forger.issue("registry.test", "*.registry.test", "api.test", "evil.test")
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp4", attackerIP+":443")
	if err != nil {
		return err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.note(true, "flagd tls %s %s sni=%s headers=%v", r.Host, r.URL, r.TLS.ServerName, r.Header)
		io.WriteString(rw, w.flag+"-flagd\n")
	})}
	w.closers = append(w.closers, srv)
	go srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{forged}}))
	// 53 and 853: DNS over TCP and DNS over TLS to the attacker's own
	// resolver (RT-11).
	for _, port := range []string{"53", "80", "853", "4444", "8080"} {
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
					io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\n"+w.flag+"-flagd\n")
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

// apiEcho serves api.test's reflection endpoints (RT-33): the caller's
// Authorization value as JSON headers, base64, an error body, a response
// header, gzip, a slow chunked stream and split across chunks.
func apiEcho(rw http.ResponseWriter, r *http.Request, auth string) bool {
	fl, _ := rw.(http.Flusher)
	switch strings.TrimPrefix(r.URL.Path, "/v1/") {
	case "echo/headers":
		rw.Header().Set("Content-Type", "application/json")
		json.NewEncoder(rw).Encode(r.Header)
	case "echo/b64":
		io.WriteString(rw, base64.StdEncoding.EncodeToString([]byte(auth))+"\n")
	case "error":
		rw.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(rw, "invalid token %s\n", auth)
	case "echo/resp-header":
		rw.Header().Set("X-Debug-Auth", auth)
		io.WriteString(rw, "see header\n")
	case "echo/gzip":
		rw.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(rw)
		io.WriteString(zw, auth)
		zw.Close()
	case "echo/stream":
		for i := 0; i < len(auth); i++ {
			rw.Write([]byte{auth[i]})
			if fl != nil {
				fl.Flush()
			}
			time.Sleep(5 * time.Millisecond)
		}
	case "echo/split":
		half := len(auth) / 2
		io.WriteString(rw, auth[:half])
		if fl != nil {
			fl.Flush()
		}
		io.WriteString(rw, auth[half:])
	default:
		return false
	}
	return true
}
