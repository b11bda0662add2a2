package egress

import (
	"net/netip"
	"testing"
)

// TestInternalIPv6: with IPv6 on, global unicast is public and everything
// else internal (R15): loopback, unspecified, the IPv4-embedding forms
// (mapped, compatible, NAT64, 6to4, Teredo), ULA (metadata fd00:ec2::254
// included), link- and site-local, multicast, documentation, the sandbox
// pool; public ranges can open documentation space, never metadata or
// link-local. With IPv6 off every IPv6 address is internal.
func TestInternalIPv6(t *testing.T) {
	pool6 := netip.MustParsePrefix("fd73:7061:6365::/48")
	on, err := New(Config{Upstream: netip.MustParseAddrPort("192.0.2.53:53"), IPv6: true, Pool6: pool6,
		Public: []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		a        string
		internal bool
	}{
		{"2606:4700::1111", false}, {"2a00:1450:4001::200e", false}, {"2001:db8:1::5", false},
		{"::", true}, {"::1", true}, {"::ffff:8.8.8.8", false}, {"::ffff:10.0.0.1", true}, {"::8.8.8.8", true},
		{"64:ff9b::808:808", true}, {"64:ff9b:1::1", true}, {"2002:808:808::1", true}, {"2001:0:4136:e378::1", true},
		{"fd00:ec2::254", true}, {"fc00::1", true}, {"fd73:7061:6365::2", true}, {"fe80::1", true}, {"fec0::1", true},
		{"ff02::1", true}, {"ff05::2", true}, {"2001:db8::66", true}, {"3fff::1", true}, {"100::1", true},
		{"2001:2::1", true}, {"2001:10::1", true}, {"4000::1", true}, {"5f00::1", true},
	} {
		if got := on.filter.internal(netip.MustParseAddr(c.a)); got != c.internal {
			t.Errorf("IPv6 on: internal(%s) = %v, want %v", c.a, got, c.internal)
		}
	}
	off, err := New(Config{Upstream: netip.MustParseAddrPort("192.0.2.53:53")})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"2606:4700::1111", "2a00:1450:4001::200e"} {
		if !off.filter.internal(netip.MustParseAddr(a)) {
			t.Errorf("IPv6 off: %s is not internal", a)
		}
	}
	in, _ := on.Ranges()
	for _, p := range in {
		if p.Contains(netip.MustParseAddr("2606:4700::1111")) {
			t.Errorf("the internal set %v holds public IPv6 (%s)", in, p)
		}
	}
	if _, err := New(Config{Upstream: netip.MustParseAddrPort("192.0.2.53:53"), IPv6: true, Pool6: pool6,
		Public: []netip.Prefix{netip.MustParsePrefix("fd73::/16")}}); err == nil {
		t.Errorf("a public range over the IPv6 sandbox pool was accepted")
	}
}
