package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestCheckPublic(t *testing.T) {
	pool := netip.MustParsePrefix("10.200.0.0/16")
	host := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8:1::/64")}
	ok := []string{"198.18.0.0/15", "198.51.100.0/24", "10.1.0.0/16", "172.16.0.0/12", "2001:db8::/48", "fc00::/8"}
	for _, s := range ok {
		if err := checkPublic([]netip.Prefix{netip.MustParsePrefix(s)}, pool, host); err != nil {
			t.Errorf("%s refused: %v", s, err)
		}
	}
	for s, want := range map[string]string{
		"169.254.169.254/32": "metadata",
		"169.254.0.0/16":     "metadata",
		"0.0.0.0/0":          "this network",
		"127.0.0.0/8":        "loopback",
		"127.0.0.1/32":       "loopback",
		"10.0.0.0/8":         "sandbox pool",
		"10.200.3.0/24":      "sandbox pool",
		"192.0.2.0/25":       "this host",
		"::1/128":            "loopback",
		"fd00:ec2::254/128":  "metadata",
		"fd00::/8":           "metadata",
		"::/0":               "IPv6",
		"::ffff:0.0.0.0/96":  "IPv4-mapped",
		"64:ff9b::/96":       "NAT64",
		"2002::/16":          "6to4",
		"fe80::/64":          "link-local",
		"2001:db8:1::/48":    "this host",
		"224.0.0.0/3":        "multicast",
	} {
		err := checkPublic([]netip.Prefix{netip.MustParsePrefix(s)}, pool, host)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %v (want an error naming it and %q)", s, err, want)
		}
	}
	if err := checkPublic([]netip.Prefix{netip.MustParsePrefix("198.18.0.1/15")}, pool, host); err == nil {
		t.Error("a prefix with host bits set was accepted")
	}
}

func TestPublicAndInternalRanges(t *testing.T) {
	f := &ipFilter{
		deny:   mustPrefixes("10.200.0.0/16", "198.18.99.0/24", "8.8.4.0/24", "192.0.2.0/24"),
		public: mustPrefixes("198.18.0.0/15", "10.1.0.0/16", "2001:db8::/32"),
	}
	internal := []string{"127.0.0.1", "169.254.169.254", "10.200.0.1", "10.0.0.1", "10.2.0.1", "198.18.99.7",
		"8.8.4.4", "192.0.2.53", "0.0.0.0", "255.255.255.255", "224.0.0.1", "203.0.113.1", "::1", "fd00:ec2::254",
		"2001:db8::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254"}
	public := []string{"198.18.0.10", "198.19.255.254", "10.1.2.3", "8.8.8.8", "::ffff:198.18.0.10"}
	for _, s := range internal {
		if !f.internal(netip.MustParseAddr(s)) {
			t.Errorf("%s is not internal", s)
		}
	}
	for _, s := range public {
		if f.internal(netip.MustParseAddr(s)) {
			t.Errorf("%s is internal", s)
		}
	}
	in, pub := f.ranges()
	if len(pub) != 3 || pub[0].String() != "198.18.0.0/15" {
		t.Errorf("public: %v", pub)
	}
	// The listed internal set is exactly what internal() says: probe the
	// first, last and next addresses of every range involved.
	var probes []netip.Addr
	for _, ps := range [][]netip.Prefix{in, f.deny, f.public, reserved} {
		for _, p := range ps {
			first := p.Masked().Addr()
			last := lastAddr(p)
			probes = append(probes, first, first.Prev(), last, last.Next())
		}
	}
	for _, a := range probes {
		if !a.IsValid() || a.Is4In6() {
			continue
		}
		listed := false
		for _, p := range in {
			listed = listed || p.Contains(a)
		}
		if listed != f.internal(a) {
			t.Errorf("%s: listed internal %v, internal() %v (ranges %v)", a, listed, f.internal(a), in)
		}
	}
	for i := 1; i < len(in); i++ {
		if in[i-1].Overlaps(in[i]) {
			t.Errorf("ranges overlap: %s %s", in[i-1], in[i])
		}
	}
	for _, c := range []struct {
		p    string
		want bool
	}{{"10.0.0.0/8", false}, {"10.0.0.0/16", true}, {"169.254.169.254/32", true}, {"198.18.0.0/15", false},
		{"198.18.99.0/24", true}, {"192.168.0.0/16", true}, {"8.8.8.0/24", false}, {"::/0", true}} {
		if got := f.covered(netip.MustParsePrefix(c.p)); got != c.want {
			t.Errorf("covered(%s) = %v", c.p, got)
		}
	}
	if !AlwaysInternal(netip.MustParsePrefix("169.254.169.254/32")) || !AlwaysInternal(netip.MustParsePrefix("127.0.0.0/8")) ||
		AlwaysInternal(netip.MustParsePrefix("10.0.0.0/8")) || AlwaysInternal(netip.MustParsePrefix("0.0.0.0/0")) {
		t.Error("AlwaysInternal")
	}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func TestSubtract(t *testing.T) {
	got := subtract(netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("198.18.99.0/24"))
	n := uint64(0)
	for _, p := range got {
		if p.Overlaps(netip.MustParsePrefix("198.18.99.0/24")) {
			t.Errorf("%s overlaps what was subtracted", p)
		}
		n += 1 << (32 - p.Bits())
	}
	if n != 1<<17-1<<8 || len(got) != 9 {
		t.Errorf("%d prefixes holding %d addresses: %v", len(got), n, got)
	}
	if got := subtract(netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("0.0.0.0/0")); len(got) != 0 {
		t.Errorf("all of it: %v", got)
	}
	if got := subtract(netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("11.0.0.0/8")); len(got) != 1 {
		t.Errorf("disjoint: %v", got)
	}
}
