// Package netns gives each sandbox its network: one veth pair whose peer is
// created directly inside the sandbox's network namespace (by PID), one /30
// from a configurable pool (GW = .1 on the host side, the sandbox = .2), a
// default route via GW, and host-side nftables rules (one table, one chain
// per sandbox reached through a verdict map keyed by the host veth's name)
// that admit only the sandbox's own IPv4 source address, redirect DNS to the
// gateway's resolver and every TCP connection to its transparent proxy, and
// drop and count everything else. The rules live on the host: root inside
// the sandbox owns its netns (user namespace) and could rewrite any rule
// placed there.
//
// Everything is done in-process over netlink (vishvananda/netlink,
// google/nftables): the `ip` and `nft` commands cost tens of milliseconds.
package netns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config configures a Manager.
type Config struct {
	// Pool is the IPv4 range cut into one /30 per sandbox; default 10.200.0.0/16.
	Pool netip.Prefix
	// IfPrefix starts every host-side veth name (at most 6 characters);
	// default "spx". Two managers on one host need different prefixes.
	IfPrefix string
	// Table is the nftables inet table; default "space".
	Table string
	// DNSPort and ProxyPort are where the gateway listens on each GW
	// address; defaults 53 and 15001.
	DNSPort, ProxyPort uint16
	// GuestIf names the interface inside the sandbox; default "eth0".
	GuestIf string
	// IPv6 gives each sandbox an IPv6 address from Pool6 and a default
	// route through its gateway as well: IPv6Auto (""; when the host has
	// an IPv6 default route), IPv6On or IPv6Off. New resolves it to on or
	// off. Off, the sandbox has IPv6 disabled and no IPv6 route.
	IPv6 string
	// Pool6 is the IPv6 range cut into one /112 per sandbox (slot n gets
	// <Pool6>::n:1 for GW and ::n:2 for the sandbox); default
	// fd73:7061:6365::/48. It must be /96 or shorter.
	Pool6 netip.Prefix
	// ClaimDir is where managers on this host record what they own
	// (DefaultClaimDir if empty); Owner names this one in those records
	// and in errors (e.g. the server's data dir).
	ClaimDir, Owner string
	Logf            func(string, ...any)
}

// Config.IPv6 values.
const (
	IPv6Auto = "auto"
	IPv6On   = "on"
	IPv6Off  = "off"
)

// HostHasIPv6 reports whether this host (its current network namespace)
// has an IPv6 default route, which IPv6Auto takes to mean the gateway can
// reach the IPv6 internet.
func HostHasIPv6() bool {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return false
	}
	for _, r := range rs {
		if r.Dst == nil || (r.Dst.IP.IsUnspecified() && r.Dst.Mask != nil && func() bool { o, _ := r.Dst.Mask.Size(); return o == 0 }()) {
			return true
		}
	}
	return false
}

// Link is one sandbox's network.
type Link struct {
	ID     string     // the driver instance id
	Slot   int        // index of the /30 in the pool
	HostIf string     // host-side veth name
	Host   netip.Addr // GW: the host side, where the gateway listens
	Guest  netip.Addr // the sandbox's only address
	// The MACs the host assigned to the host end and the sandbox's end;
	// the host's neighbour entry for Guest is pinned to GuestMAC (R16).
	HostMAC, GuestMAC net.HardwareAddr
	// Host6 and Guest6 are GW's and the sandbox's IPv6 addresses (one
	// /112); invalid when IPv6 is off.
	Host6, Guest6 netip.Addr
}

// Manager owns the pool, the veths and the nftables table.
type Manager struct {
	cfg   Config
	claim *os.File // holds this manager's claim on its host-wide names (claim.go)
	slots int
	ifRE  *regexp.Regexp

	mu    sync.Mutex
	links map[string]*Link // by instance id
	used  map[int]string   // slot -> instance id
	next  int              // round-robin cursor: slots are reused as late as possible
}

// ErrExhausted is returned when the pool has no free /30.
var ErrExhausted = errors.New("netns: address pool exhausted")

// New checks the configuration and makes sure the nftables table exists.
func New(cfg Config) (*Manager, error) {
	if !cfg.Pool.IsValid() {
		cfg.Pool = netip.MustParsePrefix("10.200.0.0/16")
	}
	cfg.Pool = cfg.Pool.Masked()
	if !cfg.Pool.Addr().Is4() || cfg.Pool.Bits() > 30 || cfg.Pool.Bits() < 8 {
		return nil, fmt.Errorf("netns: pool %s must be an IPv4 prefix between /8 and /30", cfg.Pool)
	}
	if cfg.IfPrefix == "" {
		cfg.IfPrefix = "spx"
	}
	if len(cfg.IfPrefix) > 6 || !regexp.MustCompile(`^[a-z][a-z0-9]*$`).MatchString(cfg.IfPrefix) {
		return nil, fmt.Errorf("netns: interface prefix %q must be 1-6 of [a-z0-9]", cfg.IfPrefix)
	}
	if cfg.Table == "" {
		cfg.Table = "space"
	}
	if cfg.DNSPort == 0 {
		cfg.DNSPort = 53
	}
	if cfg.ProxyPort == 0 {
		cfg.ProxyPort = 15001
	}
	if cfg.GuestIf == "" {
		cfg.GuestIf = "eth0"
	}
	switch cfg.IPv6 {
	case "", IPv6Auto:
		cfg.IPv6 = IPv6Off
		if HostHasIPv6() {
			cfg.IPv6 = IPv6On
		}
	case IPv6On, IPv6Off:
	default:
		return nil, fmt.Errorf("netns: ipv6 %q must be auto, on or off", cfg.IPv6)
	}
	if !cfg.Pool6.IsValid() {
		cfg.Pool6 = netip.MustParsePrefix("fd73:7061:6365::/48")
	}
	cfg.Pool6 = cfg.Pool6.Masked()
	if !cfg.Pool6.Addr().Is6() || cfg.Pool6.Addr().Is4In6() || cfg.Pool6.Bits() > 96 {
		return nil, fmt.Errorf("netns: IPv6 pool %s must be an IPv6 prefix of /96 or shorter", cfg.Pool6)
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.IPv6 == IPv6On && 112-cfg.Pool6.Bits() < 30-cfg.Pool.Bits() {
		return nil, fmt.Errorf("netns: IPv6 pool %s has fewer /112s than the pool %s has /30s", cfg.Pool6, cfg.Pool)
	}
	claimFile, err := claimHost(cfg)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:   cfg,
		claim: claimFile,
		slots: 1 << (30 - cfg.Pool.Bits()),
		ifRE:  regexp.MustCompile(`^` + cfg.IfPrefix + `([0-9a-f]{1,8})$`),
		links: map[string]*Link{},
		used:  map[int]string{},
	}
	if err := m.ensureTable(); err != nil {
		m.Unclaim()
		return nil, err
	}
	return m, nil
}

// Unclaim gives up the manager's claim on its pools, table and interface
// prefix (its process exiting does the same). Call it once the manager is
// no longer used.
func (m *Manager) Unclaim() {
	if m.claim != nil {
		_ = os.Remove(m.claim.Name())
		_ = m.claim.Close()
		m.claim = nil
	}
}

// Config returns the effective configuration.
func (m *Manager) Config() Config { return m.cfg }

func (m *Manager) slotLink(id string, slot int) *Link {
	base := m.cfg.Pool.Addr().As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	n += uint32(slot) * 4
	a := func(v uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	l := &Link{ID: id, Slot: slot, HostIf: m.cfg.IfPrefix + strconv.FormatInt(int64(slot), 16), Host: a(n + 1), Guest: a(n + 2)}
	l.HostMAC, l.GuestMAC = linkMAC(macHost, l.Host), linkMAC(macGuest, l.Guest)
	if m.cfg.IPv6 == IPv6On {
		// The pool is /96 or shorter: its low 32 bits are free, and New
		// checked that every slot fits.
		b := m.cfg.Pool6.Addr().As16()
		low := binary.BigEndian.Uint64(b[8:]) + uint64(slot)<<16
		binary.BigEndian.PutUint64(b[8:], low|1)
		l.Host6 = netip.AddrFrom16(b)
		binary.BigEndian.PutUint64(b[8:], low|2)
		l.Guest6 = netip.AddrFrom16(b)
	}
	return l
}

func (m *Manager) alloc(id string) (*Link, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.links[id]; l != nil {
		return nil, fmt.Errorf("netns: %s already has a network", id)
	}
	for i := 0; i < m.slots; i++ {
		s := (m.next + i) % m.slots
		if _, busy := m.used[s]; !busy {
			m.next = s + 1
			l := m.slotLink(id, s)
			m.used[s] = id
			m.links[id] = l
			return l, nil
		}
	}
	return nil, ErrExhausted
}

func (m *Manager) free(id string) *Link {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.links[id]
	if l != nil {
		delete(m.links, id)
		delete(m.used, l.Slot)
	}
	return l
}

// Get returns a sandbox's link.
func (m *Manager) Get(id string) (*Link, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.links[id]
	return l, ok
}

// Setup gives the sandbox whose PID 1 is pid its network and rules. The
// rules are in place when it returns; on error nothing is left behind.
func (m *Manager) Setup(ctx context.Context, id string, pid int) (*Link, error) {
	ns, err := vns.GetFromPid(pid)
	if err != nil {
		return nil, fmt.Errorf("netns: sandbox netns: %w", err)
	}
	defer ns.Close()
	return m.setupIn(ctx, id, ns)
}

// setupIn is Setup for the network namespace ns.
func (m *Manager) setupIn(ctx context.Context, id string, ns vns.NsHandle) (_ *Link, err error) {
	l, err := m.alloc(id)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			m.cleanup(l, true)
			m.free(id)
		}
	}()
	// IPv6 off inside before the peer exists, so it never even sends
	// router solicitations (the host drops v6 regardless). With IPv6 on:
	// no link-local address, no RA, no autoconfiguration, no DAD; the
	// host assigns the one address.
	sandboxV6 := [][2]string{{"all/disable_ipv6", "1"}, {"default/disable_ipv6", "1"}}
	if l.Guest6.IsValid() {
		sandboxV6 = [][2]string{{"default/addr_gen_mode", "1"}, {"default/accept_ra", "0"}, {"all/accept_ra", "0"},
			{"default/autoconf", "0"}, {"default/accept_dad", "0"}, {"default/accept_redirects", "0"}, {"all/accept_redirects", "0"}}
	}
	if err := inNetnsHandle(ns, func() error {
		for _, kv := range sandboxV6 {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+kv[0], []byte(kv[1]), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("netns: disable ipv6 in sandbox: %w", err)
	}
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: l.HostIf, Alias: id, MTU: 1500, HardwareAddr: l.HostMAC},
		PeerName:         m.cfg.GuestIf,
		PeerHardwareAddr: l.GuestMAC,
		PeerNamespace:    netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		if !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("netns: create veth: %w", err)
		}
		// A destroyed sandbox's veth can outlive its netns briefly.
		if old, lerr := netlink.LinkByName(l.HostIf); lerr == nil {
			_ = netlink.LinkDel(old)
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return nil, fmt.Errorf("netns: create veth: %w", err)
		}
	}
	host, err := netlink.LinkByName(l.HostIf)
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	if err := netlink.LinkSetAlias(host, id); err != nil {
		return nil, fmt.Errorf("netns: alias: %w", err)
	}
	// IPv6 on the host end is enabled but addressless (addr_gen_mode 1: no
	// link-local, no RA/autoconf, no forwarding): a sandbox that turns
	// IPv6 back on reaches nothing, and its packets get as far as the
	// prerouting hook, where the pre chain drops and counts them
	// (v6_drop). With disable_ipv6=1 the kernel would discard them before
	// any hook, unseen (R3, R19). Order matters: addr_gen_mode first.
	for _, kv := range [][2]string{
		{"ipv6/conf/" + l.HostIf + "/addr_gen_mode", "1"},
		{"ipv6/conf/" + l.HostIf + "/accept_ra", "0"},
		{"ipv6/conf/" + l.HostIf + "/autoconf", "0"},
		{"ipv6/conf/" + l.HostIf + "/forwarding", "0"},
		{"ipv6/conf/" + l.HostIf + "/disable_ipv6", "0"},
		{"ipv4/conf/" + l.HostIf + "/rp_filter", "1"},
		{"ipv4/conf/" + l.HostIf + "/proxy_arp", "0"},
		{"ipv4/conf/" + l.HostIf + "/send_redirects", "0"},
		// ARP answered only for an address of this link (the nft ingress
		// chain already admits only requests for GW), announcements
		// ignored; unsolicited neighbour advertisements too (R16).
		{"ipv4/conf/" + l.HostIf + "/arp_ignore", "1"},
		{"ipv4/conf/" + l.HostIf + "/arp_announce", "2"},
		{"ipv4/conf/" + l.HostIf + "/drop_gratuitous_arp", "1"},
		{"ipv6/conf/" + l.HostIf + "/drop_unsolicited_na", "1"},
	} {
		if err := os.WriteFile("/proc/sys/net/"+kv[0], []byte(kv[1]), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("netns: sysctl %s: %w", kv[0], err)
		}
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipnet(l.Host, 30)}); err != nil {
		return nil, fmt.Errorf("netns: host address: %w", err)
	}
	if l.Host6.IsValid() {
		if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipnet6(l.Host6, 112), Flags: unix.IFA_F_NODAD}); err != nil {
			return nil, fmt.Errorf("netns: host IPv6 address: %w", err)
		}
	}
	if err := pinNeighbour(host, l); err != nil {
		return nil, err
	}
	// Rules before the link is up: nothing can pass unfiltered.
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("netns: nftables: %w", err)
	}
	defer c.CloseLasting()
	// A link-layer chain left by an earlier sandbox of this slot that was
	// never released goes first: since Linux 6.16 a netdev chain outlives
	// its device and would hook this new veth of the same name.
	if chains, err := m.l2Chains(c); err == nil && chains[l2Chain(l.HostIf)] {
		m.delL2(c, l.HostIf)
	}
	if err := m.addSandbox(c, l); err != nil {
		return nil, fmt.Errorf("netns: nftables: %w", err)
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("netns: nftables: %w", err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	defer h.Close()
	peer, err := h.LinkByName(m.cfg.GuestIf)
	if err != nil {
		return nil, fmt.Errorf("netns: peer: %w", err)
	}
	if err := h.AddrAdd(peer, &netlink.Addr{IPNet: ipnet(l.Guest, 30)}); err != nil {
		return nil, fmt.Errorf("netns: guest address: %w", err)
	}
	if err := h.LinkSetUp(peer); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		_ = h.LinkSetUp(lo)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: l.Host.AsSlice()}); err != nil {
		return nil, fmt.Errorf("netns: default route: %w", err)
	}
	if l.Guest6.IsValid() {
		if err := h.AddrAdd(peer, &netlink.Addr{IPNet: ipnet6(l.Guest6, 112), Flags: unix.IFA_F_NODAD}); err != nil {
			return nil, fmt.Errorf("netns: guest IPv6 address: %w", err)
		}
		_, def, _ := net.ParseCIDR("::/0")
		if err := h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Dst: def, Gw: l.Host6.AsSlice()}); err != nil {
			return nil, fmt.Errorf("netns: IPv6 default route: %w", err)
		}
	}
	return l, nil
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

func ipnet6(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 128)}
}

// inNetns runs fn on a thread that has joined pid's network namespace.
func inNetns(pid int, fn func() error) error {
	target, err := vns.GetFromPid(pid)
	if err != nil {
		return err
	}
	defer target.Close()
	return inNetnsHandle(target, fn)
}

// cleanup removes a link's rules and, if asked, its host veth (which
// otherwise goes with the sandbox's netns).
func (m *Manager) cleanup(l *Link, delLink bool) {
	c, err := nftables.New()
	if err == nil {
		defer c.CloseLasting()
		if chains, err := m.sandboxChains(c); err == nil {
			if chains[preChain(l.HostIf)] || chains[inChain(l.HostIf)] || chains[l2Chain(l.HostIf)] {
				m.delSandbox(c, l.HostIf, chains)
				if err := c.Flush(); err != nil {
					m.cfg.Logf("netns: %s: remove rules: %v", l.ID, err)
				}
			}
		}
	}
	if delLink {
		if link, err := netlink.LinkByName(l.HostIf); err == nil && link.Attrs().Alias == l.ID {
			_ = netlink.LinkDel(link)
		}
	}
}

// Release removes a sandbox's rules and frees its addresses. The veth goes
// with the sandbox's netns when its PID 1 dies; deleting it here would cost
// ~20 ms of RCU wait for nothing. Unknown ids are not an error.
func (m *Manager) Release(id string) {
	if l := m.free(id); l != nil {
		m.cleanup(l, false)
	}
}

// Adopt re-registers the network of a sandbox that survived a restart of
// the node process, found by the alias its host veth carries.
func (m *Manager) Adopt(id string) (*Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	for _, link := range links {
		a := link.Attrs()
		mm := m.ifRE.FindStringSubmatch(a.Name)
		if mm == nil || a.Alias != id {
			continue
		}
		slot, err := strconv.ParseInt(mm[1], 16, 32)
		if err != nil || int(slot) >= m.slots {
			continue
		}
		l := m.slotLink(id, int(slot))
		m.mu.Lock()
		if other, busy := m.used[l.Slot]; busy && other != id {
			m.mu.Unlock()
			return nil, fmt.Errorf("netns: slot %d of %s is taken by %s", l.Slot, id, other)
		}
		m.used[l.Slot], m.links[id] = id, l
		m.mu.Unlock()
		return l, nil
	}
	return nil, fmt.Errorf("netns: no network found for %s", id)
}

// Sweep removes veths and rules of every sandbox not in keep (instance
// ids). Run it at start, after the driver's own sweep.
func (m *Manager) Sweep(keep map[string]bool) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	live := map[string]bool{}
	for _, link := range links {
		a := link.Attrs()
		if !m.ifRE.MatchString(a.Name) {
			continue
		}
		if keep[a.Alias] {
			live[a.Name] = true
			continue
		}
		m.mu.Lock()
		_, mine := m.links[a.Alias]
		m.mu.Unlock()
		if mine {
			live[a.Name] = true
			continue
		}
		m.cfg.Logf("netns: sweep: removing veth %s of %s", a.Name, a.Alias)
		_ = netlink.LinkDel(link)
	}
	m.mu.Lock()
	for _, l := range m.links {
		live[l.HostIf] = true
	}
	m.mu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netns: nftables: %w", err)
	}
	defer c.CloseLasting()
	chains, err := m.sandboxChains(c)
	if err != nil {
		return fmt.Errorf("netns: nftables: %w", err)
	}
	stale := map[string]bool{}
	for name := range chains {
		ifname := name[2:]
		if !live[ifname] {
			stale[ifname] = true
		}
	}
	for ifname := range stale {
		m.cfg.Logf("netns: sweep: removing rules of %s", ifname)
		m.delSandbox(c, ifname, chains)
	}
	if len(stale) > 0 {
		if err := c.Flush(); err != nil {
			return fmt.Errorf("netns: sweep rules: %w", err)
		}
	}
	return nil
}

// Counters returns a sandbox's packet counters by reason (e.g. spoof_drop,
// udp_drop, frag_drop, v6_drop, tcp, dns).
func (m *Manager) Counters(id string) (map[string]uint64, error) {
	l, ok := m.Get(id)
	if !ok {
		return nil, fmt.Errorf("netns: %s has no network", id)
	}
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	return m.counters(c, l.HostIf)
}

// Destroy removes the whole table and every veth of this manager's prefix
// (tests; a node keeps its table across restarts).
func (m *Manager) Destroy() error {
	defer m.Unclaim()
	links, _ := netlink.LinkList()
	for _, link := range links {
		if m.ifRE.MatchString(link.Attrs().Name) {
			_ = netlink.LinkDel(link)
		}
	}
	return m.removeTable()
}
