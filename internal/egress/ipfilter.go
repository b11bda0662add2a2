package egress

import (
	"net"
	"net/netip"
)

// reserved are never dialled, in any mode (R15): loopback, RFC 1918,
// CGNAT, link-local and metadata, "this network", multicast, reserved and
// broadcast, benchmarking and documentation ranges (the latter can be
// declared public for the offline test harness), and every IPv6 address
// (the gateway's upstream is IPv4-only).
var reserved = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
	"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
)

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
	public []netip.Prefix // reserved ranges declared public (test harness only)
}

func newIPFilter(deny, public []netip.Prefix) *ipFilter {
	f := &ipFilter{deny: append([]netip.Prefix(nil), deny...), public: public}
	// The host's own networks (its LAN) are internal too.
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if p, err := netip.ParsePrefix(ipn.String()); err == nil && p.Addr().Is4() {
					f.deny = append(f.deny, p.Masked())
				}
			}
		}
	}
	return f
}

// internal reports whether a must never be dialled for a sandbox.
func (f *ipFilter) internal(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() || a.IsUnspecified() {
		return true
	}
	for _, p := range f.deny {
		if p.Contains(a) {
			return true
		}
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
	return a == netip.AddrFrom4([4]byte{255, 255, 255, 255})
}
