package egress

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// reserved are never dialled, in any mode (R15): loopback, RFC 1918,
// CGNAT, link-local and metadata, "this network", multicast, reserved and
// broadcast, benchmarking and documentation ranges; in IPv6 everything
// outside global unicast (2000::/3: so loopback, the IPv4-embedding forms,
// discard, ULA, link- and site-local, multicast), the IETF protocol
// assignments (2001::/23: Teredo, benchmarking, ORCHID), documentation
// (2001:db8::/32, 3fff::/20) and 6to4. Without IPv6 (Config.IPv6 off)
// every IPv6 address is internal. Config.Public (the operator's
// --egress-public-ranges) may declare parts of them public, except the
// ranges in never.
var reserved = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
	"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"::/3", "4000::/2", "8000::/1", "2001::/23", "2001:db8::/32", "2002::/16", "3fff::/20",
)

// never are internal whatever Config.Public says: a public range that
// overlaps one of them (or the sandbox pool, or a network of the host's
// own interfaces) is refused when the gateway starts.
var never = []struct {
	p    netip.Prefix
	what string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\": 0.0.0.0 reaches the host itself"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local and cloud metadata, 169.254.169.254"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("::1/128"), "IPv6 loopback"},
	{netip.MustParsePrefix("::/96"), "the unspecified and IPv4-compatible IPv6 addresses"},
	{netip.MustParsePrefix("::ffff:0:0/96"), "IPv4-mapped IPv6 (embeds an IPv4 address)"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64 (embeds an IPv4 address)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local NAT64 (embeds an IPv4 address)"},
	{netip.MustParsePrefix("2001::/32"), "Teredo (embeds an IPv4 address)"},
	{netip.MustParsePrefix("2002::/16"), "6to4 (embeds an IPv4 address)"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "cloud metadata (IPv6)"},
	{netip.MustParsePrefix("fe80::/10"), "IPv6 link-local"},
	{netip.MustParsePrefix("ff00::/8"), "IPv6 multicast"},
}

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// ipFilter decides which upstream addresses are internal.
type ipFilter struct {
	deny   []netip.Prefix // always internal: pool, host networks, configured
	public []netip.Prefix // reserved ranges declared public (Config.Public)
	v6     bool           // the gateway dials IPv6 (Config.IPv6); else every IPv6 address is internal
}

func newIPFilter(deny, public []netip.Prefix) *ipFilter {
	f := &ipFilter{deny: append([]netip.Prefix(nil), deny...), public: public}
	// The host's own networks (its LAN) are internal too.
	f.deny = append(f.deny, hostNetworks()...)
	return f
}

// hostNetworks are the networks of the host's interface addresses.
func hostNetworks() []netip.Prefix {
	var out []netip.Prefix
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if p, err := netip.ParsePrefix(ipn.String()); err == nil && !slices.Contains(out, p.Masked()) {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}

// checkPublic refuses public ranges that overlap what is always internal:
// the ranges in never, the sandbox pool and the host's own networks.
func checkPublic(public []netip.Prefix, pool netip.Prefix, host []netip.Prefix) error {
	for _, p := range public {
		if !p.IsValid() || p != p.Masked() {
			return fmt.Errorf("public range %s (--egress-public-ranges): not a network address/prefix length", p)
		}
		for _, n := range never {
			if p.Overlaps(n.p) {
				return fmt.Errorf("public range %s (--egress-public-ranges) overlaps %s (%s), which is never public", p, n.p, n.what)
			}
		}
		if pool.IsValid() && p.Overlaps(pool) {
			return fmt.Errorf("public range %s (--egress-public-ranges) overlaps the sandbox pool %s (--egress-pool), which is never public", p, pool)
		}
		for _, h := range host {
			if p.Overlaps(h) {
				return fmt.Errorf("public range %s (--egress-public-ranges) overlaps %s, a network of this host's own interfaces, which is never public", p, h)
			}
		}
	}
	return nil
}

// internal reports whether a must never be dialled for a sandbox.
func (f *ipFilter) internal(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsUnspecified() {
		return true
	}
	for _, n := range never {
		if n.p.Contains(a) {
			return true
		}
	}
	for _, p := range f.deny {
		if p.Contains(a) {
			return true
		}
	}
	if !a.Is4() && !f.v6 {
		return true // no IPv6 here: public IPv6 ranges are accepted and checked, and take effect with IPv6 on
	}
	for _, p := range f.public {
		if p.Contains(a) {
			return false
		}
	}
	for _, p := range reserved {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// allIPv6 stands for "every IPv6 address is internal" in ranges.
var allIPv6 = netip.MustParsePrefix("::/0")

// ranges returns the effective internal set, as a sorted list of
// disjoint prefixes (exactly the addresses internal reports), and the
// configured public ranges.
func (f *ipFilter) ranges() (internal, public []netip.Prefix) {
	var in []netip.Prefix
	if !f.v6 {
		in = append(in, allIPv6)
	}
	for _, n := range never {
		in = append(in, n.p)
	}
	in = append(in, f.deny...)
	for _, r := range reserved {
		rest := []netip.Prefix{r}
		for _, p := range f.public {
			var next []netip.Prefix
			for _, x := range rest {
				next = append(next, subtract(x, p)...)
			}
			rest = next
		}
		in = append(in, rest...)
	}
	return minimal(in), append([]netip.Prefix(nil), f.public...)
}

// covered reports whether every address of p is internal.
func (f *ipFilter) covered(p netip.Prefix) bool {
	in, _ := f.ranges()
	return coveredBy(p, in)
}

// coveredBy reports whether the prefixes in set cover every address of p.
func coveredBy(p netip.Prefix, set []netip.Prefix) bool {
	rest := []netip.Prefix{p.Masked()}
	for _, s := range set {
		var next []netip.Prefix
		for _, x := range rest {
			next = append(next, subtract(x, s)...)
		}
		if rest = next; len(rest) == 0 {
			return true
		}
	}
	return len(rest) == 0
}

// AlwaysInternal reports whether every address of p is internal under
// any gateway configuration (the ranges no public range may touch).
func AlwaysInternal(p netip.Prefix) bool {
	set := make([]netip.Prefix, len(never))
	for i, n := range never {
		set[i] = n.p
	}
	return coveredBy(p, set)
}

// subtract returns the addresses of p that are not in q, as prefixes.
func subtract(p, q netip.Prefix) []netip.Prefix {
	p, q = p.Masked(), q.Masked()
	if !p.Overlaps(q) {
		return []netip.Prefix{p}
	}
	if q.Bits() <= p.Bits() {
		return nil // q holds all of p
	}
	lo, hi := halves(p)
	if lo.Overlaps(q) {
		return append(subtract(lo, q), hi)
	}
	return append([]netip.Prefix{lo}, subtract(hi, q)...)
}

// halves splits p (not a single address) into its two halves.
func halves(p netip.Prefix) (lo, hi netip.Prefix) {
	bits := p.Bits() + 1
	lo = netip.PrefixFrom(p.Addr(), bits)
	b := p.Addr().AsSlice()
	b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	a, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(a, bits)
}

// minimal sorts ps and drops the prefixes another one contains, leaving
// disjoint prefixes.
func minimal(ps []netip.Prefix) []netip.Prefix {
	ps = slices.Clone(ps)
	for i := range ps {
		ps[i] = ps[i].Masked()
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var out []netip.Prefix
	for _, p := range ps {
		if n := len(out); n > 0 && out[n-1].Overlaps(p) {
			continue // sorted: the earlier, shorter one contains p
		}
		out = append(out, p)
	}
	return out
}
