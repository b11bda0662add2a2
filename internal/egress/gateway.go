// Package egress is the gateway every sandbox's traffic is redirected to by
// the host-side rules of internal/netns: a DNS resolver and a transparent
// TCP proxy, one set of listeners per sandbox on that sandbox's own GW
// address, so a connection's sandbox is known from the socket it arrived on
// (R2), never from anything in the packet.
//
// The gateway terminates every connection and opens its own upstream one
// only after deciding (R4). It resolves names itself and pins, per sandbox,
// the addresses it handed out for each name: a TLS connection is allowed
// only when its SNI (an HTTP request only when its Host) names an allowed
// name that the sandbox resolved through the gateway to the very address it
// connected to; that address, which the gateway itself resolved, is the one
// dialled (R6). Internal destinations are refused in every mode (R15);
// blocked sandboxes cause no upstream socket at all, DNS included (R17).
// Parse errors, timeouts, overload and a missing policy all mean deny (R18).
package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/space-sandbox/space/internal/egress/policy"
)

// Config configures a Gateway.
type Config struct {
	// Upstream is the resolver the gateway asks (IPv4 UDP, TCP fallback);
	// default: the first IPv4 nameserver of /etc/resolv.conf.
	Upstream netip.AddrPort
	// Deny lists extra internal ranges (--egress-internal-ranges; the
	// sandbox pool and the host's own networks are always internal).
	Deny []netip.Prefix
	// Public declares ranges that are internal by default public
	// (--egress-public-ranges: a lab network, the offline test harness's
	// fake internet in the documentation ranges). New refuses one that
	// overlaps loopback, link-local and metadata, the other ranges of
	// never, Pool or a network of the host's own interfaces. Deny wins
	// over Public.
	Public []netip.Prefix
	// Pool is the sandbox address pool (set by NewNetwork): internal, and
	// never public.
	Pool netip.Prefix
	// Pool6 is the sandboxes' IPv6 pool (set by NewNetwork with IPv6 on):
	// internal, and never public.
	Pool6 netip.Prefix
	// IPv6: sandboxes have IPv6 (set by NewNetwork from the links'
	// effective setting), so the gateway listens on their IPv6 GW
	// addresses, answers AAAA queries from its own resolution and dials
	// IPv6 upstreams. Off, AAAA queries get an empty answer.
	IPv6 bool
	// DNSPort and ProxyPort are the per-sandbox listening ports on GW.
	DNSPort, ProxyPort uint16
	// MaxConns bounds a sandbox's concurrent proxied connections (256).
	MaxConns int
	// DNSQPS bounds a sandbox's DNS queries per second (100, burst 2x).
	DNSQPS int
	// LogSize is how many decisions are kept per sandbox (1024).
	LogSize int
	// DialTimeout bounds upstream connects and DNS queries (5s).
	DialTimeout time.Duration
	// HelloTimeout bounds how long a sandbox may take to send the first
	// bytes (ClientHello or request head) of a connection (10s).
	HelloTimeout time.Duration
	// UpstreamRoots verifies the certificates of upstreams whose TLS the
	// gateway terminates (nil: the host's system roots).
	UpstreamRoots *x509.CertPool
	Logf          func(string, ...any)
}

// Decision is one entry of a sandbox's decision log (R19).
type Decision struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Proto   string    `json:"proto"` // dns, tls, http, tcp
	Name    string    `json:"name,omitempty"`
	Port    uint16    `json:"port,omitempty"`
	Dest    string    `json:"dest,omitempty"`    // the sandbox's original destination
	Dialled string    `json:"dialled,omitempty"` // what the gateway connected to
	Verdict string    `json:"verdict"`           // allow or deny
	Rule    string    `json:"rule,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	TLS     string    `json:"tls,omitempty"` // terminated or passthrough
	Via     string    `json:"via,omitempty"` // "proxy": through the explicit proxy (GW:3128)
}

// Stats are a sandbox's gateway counters.
type Stats struct {
	UpstreamSockets uint64 `json:"upstream_sockets"` // connects and DNS queries the gateway made for it
	DNSQueries      uint64 `json:"dns_queries"`
	DNSRefused      uint64 `json:"dns_refused"`
	ConnsAllowed    uint64 `json:"conns_allowed"`
	ConnsDenied     uint64 `json:"conns_denied"`
}

// Gateway serves every sandbox of a node.
type Gateway struct {
	cfg     Config
	filter  *ipFilter
	metrics metrics

	mu  sync.Mutex
	sbx map[string]*sandbox
}

// New returns a gateway.
func New(cfg Config) (*Gateway, error) {
	if !cfg.Upstream.IsValid() {
		up, err := resolvConfUpstream("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("egress: no upstream resolver configured: %w", err)
		}
		cfg.Upstream = up
	}
	if cfg.DNSPort == 0 {
		cfg.DNSPort = 53
	}
	if cfg.ProxyPort == 0 {
		cfg.ProxyPort = 15001
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 256
	}
	if cfg.DNSQPS <= 0 {
		cfg.DNSQPS = 100
	}
	if cfg.LogSize <= 0 {
		cfg.LogSize = 1024
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = 10 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	host := hostNetworks()
	if err := checkPublic(cfg.Public, cfg.Pool, host); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	deny := append([]netip.Prefix(nil), cfg.Deny...)
	if cfg.Pool.IsValid() {
		deny = append(deny, cfg.Pool.Masked())
	}
	if cfg.Pool6.IsValid() {
		if err := checkPublic(cfg.Public, cfg.Pool6, nil); err != nil {
			return nil, fmt.Errorf("egress: %w", err)
		}
		deny = append(deny, cfg.Pool6.Masked())
	}
	filter := &ipFilter{deny: append(deny, host...), public: append([]netip.Prefix(nil), cfg.Public...), v6: cfg.IPv6}
	return &Gateway{cfg: cfg, filter: filter, sbx: map[string]*sandbox{}}, nil
}

// Ranges returns the gateway's effective address sets: every address it
// never dials for a sandbox (disjoint prefixes, sorted) and the ranges
// declared public.
func (g *Gateway) Ranges() (internal, public []netip.Prefix) { return g.filter.ranges() }

// Internal reports whether every address of p is internal here: never
// dialled for a sandbox, in any mode.
func (g *Gateway) Internal(p netip.Prefix) bool { return g.filter.covered(p) }

func resolvConfUpstream(path string) (netip.AddrPort, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return netip.AddrPort{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() {
				return netip.AddrPortFrom(a, 53), nil
			}
		}
	}
	return netip.AddrPort{}, errors.New("no IPv4 nameserver in " + path)
}

// sandbox is the gateway's state for one sandbox.
type sandbox struct {
	id     string
	gw     *Gateway
	addr   netip.Addr // its GW address
	addr6  netip.Addr // its IPv6 GW address (invalid without IPv6)
	policy atomic.Pointer[policy.Policy]
	creds  atomic.Pointer[credSet]
	ca     *sandboxCA

	// The listeners on GW (and GW6): DNS over UDP and TCP, the
	// transparent proxy.
	udps    []*net.UDPConn
	dnsLns  []*net.TCPListener
	proxies []*net.TCPListener
	conns   chan struct{} // semaphore of proxied connections
	dnsIn   chan struct{} // semaphore of DNS queries in flight
	bkt     bucket

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	pins  map[netip.Addr]map[string]time.Time // address -> names resolved to it -> until
	log   []Decision
	seq   uint64
	stats Stats
	open  map[net.Conn]struct{}
}

// Attach starts serving a sandbox on its GW address (and, with IPv6, its
// IPv6 GW address gw6; an invalid one is ignored). Its policy is blocked
// until SetPolicy says otherwise.
func (g *Gateway) Attach(id string, gwAddr netip.Addr, gw6 ...netip.Addr) (err error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sandbox{id: id, gw: g, addr: gwAddr, ctx: ctx, cancel: cancel,
		conns: make(chan struct{}, g.cfg.MaxConns), dnsIn: make(chan struct{}, 32),
		pins: map[netip.Addr]map[string]time.Time{}, open: map[net.Conn]struct{}{}}
	s.bkt = bucket{rate: float64(g.cfg.DNSQPS), burst: float64(2 * g.cfg.DNSQPS), tokens: float64(2 * g.cfg.DNSQPS), last: time.Now()}
	s.policy.Store(&policy.Policy{Mode: policy.Blocked})
	s.creds.Store(&credSet{})
	if s.ca, err = newSandboxCA(id); err != nil {
		cancel()
		return fmt.Errorf("egress: %s: CA: %w", id, err)
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	addrs := []netip.Addr{gwAddr}
	if len(gw6) > 0 && gw6[0].IsValid() && g.cfg.IPv6 {
		s.addr6 = gw6[0]
		addrs = append(addrs, gw6[0])
	}
	for _, a := range addrs {
		udp, tcp, ip := "udp4", "tcp4", a.AsSlice()
		if a.Is6() {
			udp, tcp = "udp6", "tcp6"
		}
		pc, err := net.ListenUDP(udp, &net.UDPAddr{IP: ip, Port: int(g.cfg.DNSPort)})
		if err != nil {
			return fmt.Errorf("egress: %s: dns: %w", id, err)
		}
		s.udps = append(s.udps, pc)
		ln, err := net.ListenTCP(tcp, &net.TCPAddr{IP: ip, Port: int(g.cfg.DNSPort)})
		if err != nil {
			return fmt.Errorf("egress: %s: dns: %w", id, err)
		}
		s.dnsLns = append(s.dnsLns, ln)
		if ln, err = net.ListenTCP(tcp, &net.TCPAddr{IP: ip, Port: int(g.cfg.ProxyPort)}); err != nil {
			return fmt.Errorf("egress: %s: proxy: %w", id, err)
		}
		s.proxies = append(s.proxies, ln)
	}
	g.mu.Lock()
	if _, dup := g.sbx[id]; dup {
		g.mu.Unlock()
		return fmt.Errorf("egress: %s is already attached", id)
	}
	g.sbx[id] = s
	g.mu.Unlock()
	for i := range s.udps {
		s.wg.Add(3)
		go s.serveUDP(s.udps[i])
		go s.serveDNSTCP(s.dnsLns[i])
		go s.serveProxy(s.proxies[i])
	}
	return nil
}

func (s *sandbox) close() {
	s.cancel()
	for _, c := range s.udps {
		c.Close()
	}
	for _, ln := range append(append([]*net.TCPListener(nil), s.dnsLns...), s.proxies...) {
		ln.Close()
	}
	s.mu.Lock()
	for c := range s.open {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Detach stops serving a sandbox and closes its connections. Unknown ids
// are not an error.
func (g *Gateway) Detach(id string) {
	g.mu.Lock()
	s := g.sbx[id]
	delete(g.sbx, id)
	g.mu.Unlock()
	if s != nil {
		s.close()
	}
}

// Close detaches every sandbox.
func (g *Gateway) Close() {
	g.mu.Lock()
	ids := make([]string, 0, len(g.sbx))
	for id := range g.sbx {
		ids = append(ids, id)
	}
	g.mu.Unlock()
	for _, id := range ids {
		g.Detach(id)
	}
}

// ErrUnknown is returned for a sandbox the gateway does not serve.
var ErrUnknown = errors.New("egress: sandbox not attached")

func (g *Gateway) get(id string) (*sandbox, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.sbx[id]
	if s == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknown, id)
	}
	return s, nil
}

// SetPolicy swaps a sandbox's policy atomically: new connections and
// queries see the new one (R18). Pins learned under the old policy are
// dropped, so nothing resolved before counts after.
func (g *Gateway) SetPolicy(id string, p *policy.Policy) error {
	if p == nil {
		p = &policy.Policy{Mode: policy.Blocked}
	}
	s, err := g.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.pins = map[netip.Addr]map[string]time.Time{}
	s.mu.Unlock()
	s.policy.Store(p)
	return nil
}

// Policy returns a sandbox's current policy.
func (g *Gateway) Policy(id string) (*policy.Policy, error) {
	s, err := g.get(id)
	if err != nil {
		return nil, err
	}
	return s.policy.Load(), nil
}

// Log returns up to limit decisions with Seq > after.
func (g *Gateway) Log(id string, after uint64, limit int) ([]Decision, error) {
	s, err := g.get(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Decision{}
	for _, d := range s.log {
		if d.Seq > after {
			out = append(out, d)
			if limit > 0 && len(out) >= limit {
				break
			}
		}
	}
	return out, nil
}

// Stats returns a sandbox's counters.
func (g *Gateway) Stats(id string) (Stats, error) {
	s, err := g.get(id)
	if err != nil {
		return Stats{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats, nil
}

func (s *sandbox) record(d Decision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	d.Seq, d.Time = s.seq, time.Now().UTC()
	if len(s.log) >= s.gw.cfg.LogSize {
		copy(s.log, s.log[1:])
		s.log = s.log[:len(s.log)-1]
	}
	s.log = append(s.log, d)
	s.gw.metrics.decision(d)
	if d.Proto != "dns" {
		if d.Verdict == "allow" {
			s.stats.ConnsAllowed++
			s.gw.metrics.add(func(st *Stats) { st.ConnsAllowed++ })
		} else {
			s.stats.ConnsDenied++
			s.gw.metrics.add(func(st *Stats) { st.ConnsDenied++ })
		}
	}
}

func (s *sandbox) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
	s.gw.metrics.add(f)
}

// pinTTL is how long a resolution authorises connections to its addresses,
// however short the record's TTL (a TTL-0 answer must still be usable by
// the connection that follows it).
const pinTTL = 10 * time.Minute

// maxPins bounds a sandbox's pin set.
const maxPins = 4096

func (s *sandbox) pin(name string, addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if len(s.pins) > maxPins {
		for a, names := range s.pins {
			for n, until := range names {
				if now.After(until) {
					delete(names, n)
				}
			}
			if len(names) == 0 {
				delete(s.pins, a)
			}
		}
	}
	for _, a := range addrs {
		if len(s.pins) > maxPins {
			return
		}
		if s.pins[a] == nil {
			s.pins[a] = map[string]time.Time{}
		}
		s.pins[a][name] = now.Add(pinTTL)
	}
}

// pinned reports whether the sandbox resolved name to a through us.
func (s *sandbox) pinned(name string, a netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.pins[a][name]
	return ok && time.Now().Before(until)
}

// bucket is a token bucket.
type bucket struct {
	mu                  sync.Mutex
	rate, burst, tokens float64
	last                time.Time
}

func (b *bucket) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.tokens += now.Sub(b.last).Seconds() * b.rate
	b.last = now
	if b.tokens > b.burst {
		b.tokens = b.burst
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
