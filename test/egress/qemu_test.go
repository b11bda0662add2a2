package egress_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/bench"
	"github.com/space-sandbox/space/internal/driver/qemu"
	"github.com/space-sandbox/space/internal/vmimage"
)

// qemuGuest is the guest's own address on its virtio link (fixed by the
// qemu driver; QEMU's namespace masquerades it to the sandbox's address).
const qemuGuest = "169.254.0.2"

// qemuPlan is the subset of the red-team catalogue TestEgressQemu runs:
// per mode, the cases in the order they run in one VM of that mode (a VM
// boot costs 5–12 s under TCG, so one sandbox serves every case of its
// mode; each case starts its own oracles). The cases that change the
// guest's own network come last: RT-44 (IPv6 on), RT-42 (extra
// addresses on eth0), RT-03 (the default route replaced), and RT-17
// (/etc/hosts) is undone right after it runs.
var qemuPlan = []struct {
	mode string
	ids  []string
}{
	{modeB, []string{"RT-01", "RT-05", "RT-07", "RT-09", "RT-10", "RT-11", "RT-38", "RT-39", "RT-40", "RT-45", "RT-44", "RT-42", "RT-03"}},
	{modeA, []string{"RT-01", "RT-05", "RT-07", "RT-10", "RT-17", "RT-19", "RT-21", "RT-24", "RT-38", "RT-39", "RT-40", "RT-42", "RT-03"}},
	// The peer itself (open mode, already booted): host services and
	// metadata where the policy lets everything public through.
	{modeO, []string{"RT-38", "RT-39"}},
}

// qemuMutates are the cases that change the guest's own network or
// files on purpose (routes, addresses on eth0, /etc/hosts): qemuRestore
// puts the guest back after each, so the next case starts clean.
var qemuMutates = map[string]bool{"RT-03": true, "RT-17": true, "RT-42": true, "RT-44": true}

// qemuRestore undoes what qemuMutates' cases did in the guest.
func (e *env) qemuRestore(t *testing.T, sb sbx) {
	t.Helper()
	out := e.exec(t, sb, "/bin/busybox", "sh", "-c", `ip() { /bin/busybox ip "$@"; }
/bin/busybox sed -i '/`+attackerIP+`/d' /etc/hosts
ip route del 198.51.100.0/24 2>/dev/null
ip route replace default via 169.254.0.1 dev eth0
for a in $(ip -4 addr show eth0 | /bin/busybox grep -o 'inet [0-9.]*/[0-9]*' | /bin/busybox cut -d' ' -f2); do
  [ "$a" = `+qemuGuest+`/30 ] || ip addr del "$a" dev eth0
done
for a in $(ip -6 addr show eth0 2>/dev/null | /bin/busybox grep -o 'inet6 [0-9a-f:]*/[0-9]*' | /bin/busybox cut -d' ' -f2); do
  ip addr del "$a" dev eth0
done
ip -4 addr show eth0 | /bin/busybox grep -c 'inet '; ip -4 route`)
	if !strings.HasPrefix(out, "1\n") || !strings.Contains(out, "default via 169.254.0.1") {
		t.Fatalf("could not restore the guest's network: %q", out)
	}
}

// guestRoot runs the red-team client in sb's guest with every capability
// (see guestRootSh): the "guest-root" execution.
func (e *env) guestRoot(t *testing.T, sb sbx, args ...string) string {
	t.Helper()
	q := []string{"/bin/rt"}
	for _, a := range args {
		q = append(q, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	out := e.guestRootSh(t, sb, strings.Join(q, " "))
	t.Logf("[guest-root] rt %s -> %s", strings.Join(args, " "), out)
	return out
}

// guestRootSh runs a shell command line in sb's guest as a process of the
// guest kernel's own: root with the full capability set, which the
// agent's commands lack (no CAP_NET_RAW). Guest root takes it the way any
// root owning a kernel can: core_pattern names a pipe helper, a process
// dumps core, and the kernel starts the helper (from kthreadd, so outside
// the agent's bounding set; in the guest's root, the sandbox's). Its
// output comes back through a file in /tmp.
func (e *env) guestRootSh(t *testing.T, sb sbx, cmdline string) string {
	t.Helper()
	p := "/tmp/gr-" + nonce()[:8]
	drive := `cat >` + p + `.sh <<'SPACE_EOF'
exec </dev/null >` + p + `.out 2>&1
/bin/busybox sh -c '` + strings.ReplaceAll(cmdline, "'", `'\''`) + `'
echo $? >` + p + `.rc
SPACE_EOF
echo '|/bin/busybox sh ` + p + `.sh' >/proc/sys/kernel/core_pattern || exit 1
ulimit -c unlimited
/bin/busybox sh -c 'kill -SEGV $$' 2>/dev/null
i=0; while [ ! -s ` + p + `.rc ] && [ $i -lt 600 ]; do /bin/busybox sleep 0.05; i=$((i+1)); done
echo core >/proc/sys/kernel/core_pattern
[ -s ` + p + `.rc ] || { echo "guest-root: the helper never finished"; exit 1; }
cat ` + p + `.out; rm -f ` + p + `.*`
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := e.cl.Exec(ctx, sb.Sandbox, []string{"/bin/busybox", "sh", "-c", drive}, func(b []byte) { out.Write(b) })
	if err != nil {
		t.Fatalf("guest-root %q: %v", cmdline, err)
	}
	s := strings.TrimSpace(out.String() + string(res.Stderr))
	if res.ExitCode != 0 {
		t.Fatalf("guest-root %q: exit %d: %s", cmdline, res.ExitCode, s)
	}
	return s
}

// capsOf parses a /proc/PID/status capability mask.
func capsOf(hex string) uint64 {
	v, _ := strconv.ParseUint(hex, 16, 64)
	return v
}

// qemuSkip says why this host cannot boot qemu sandboxes ("" if it can),
// as internal/driver/qemu's tests decide.
func qemuSkip() string {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "qemu-system-x86_64 not installed (scripts/vm-deps.sh)"
	}
	if _, _, err := vmimage.FindKernel("/boot", "/lib/modules"); err != nil {
		return err.Error()
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return "mkfs.ext4 not installed (e2fsprogs)"
	}
	return ""
}

// TestEgressQemu is issue #7's acceptance: root inside a qemu sandbox (a
// TCG microVM: its own kernel, raw sockets, every capability) reaches
// nothing but the agent transport and the gateway. It starts `space
// server --driver qemu` with egress over the same fake internet as
// TestEgress and runs a subset of the red-team catalogue (qemuPlan) in
// three VMs: the peer (open mode, also its open-mode cases), one blocked
// and one allowlist sandbox, booted at once. The packet-level cases run
// twice: from the agent's command (root, CAP_NET_ADMIN, no CAP_NET_RAW)
// and as guest-root (every capability, taken from the guest kernel: see
// guestRootSh). The verdicts are the catalogue's own (runCaseIn), with
// qemuVerdict's evidence rules for what QEMU's namespace changes; the
// table goes to SPACE_RT_REPORT_QEMU (default
// $TMPDIR/space-redteam-report-qemu.md).
func TestEgressQemu(t *testing.T) {
	if why := qemuSkip(); why != "" {
		t.Skip("qemu driver: " + why)
	}
	start := time.Now()
	// A descriptor this process holds without close-on-exec, as a careless
	// supervisor would leave one: the in-process server marks it at start,
	// so no QEMU process may hold it (issue 22).
	leakR, leakW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer leakR.Close()
	defer leakW.Close()
	if _, err := unix.FcntlInt(leakW.Fd(), unix.F_SETFD, 0); err != nil {
		t.Fatal(err)
	}
	leakTarget, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", leakW.Fd()))
	e := startOpts(t, startOptions{driver: qemu.Name, noWarmPool: true})
	var info struct {
		Driver string `json:"driver"`
		Egress bool   `json:"egress"`
	}
	if code := e.api(t, "GET", "/v1/info", nil, &info); code != 200 || info.Driver != qemu.Name || !info.Egress {
		t.Fatalf("GET /v1/info: %d %+v, want the qemu driver with egress", code, info)
	}
	rep := &report{}
	defer func() {
		md := rep.markdown()
		t.Logf("qemu red-team table (%v in all):\n%s", time.Since(start).Round(time.Second), md)
		path := os.Getenv("SPACE_RT_REPORT_QEMU")
		if path == "" {
			path = filepath.Join(os.TempDir(), "space-redteam-report-qemu.md")
		}
		os.MkdirAll(filepath.Dir(path), 0o755)
		head := fmt.Sprintf("<!-- generated by TestEgressQemu (test/egress) at %s; runs per case and mode: 1; driver qemu (TCG), one VM per mode -->\n\n", time.Now().UTC().Format(time.RFC3339))
		if err := os.WriteFile(path, []byte(head+md), 0o644); err != nil {
			t.Errorf("write the qemu report: %v", err)
		} else {
			t.Logf("qemu red-team report written to %s", path)
		}
	}()

	// Three boots at once (the create API is asynchronous).
	t0 := time.Now()
	pols := map[string]any{modeO: e.policy(modeO, ""), modeB: nil, modeA: e.policy(modeA, "")}
	ops := map[string]string{}
	sbs := map[string]sbx{}
	for _, m := range []string{modeO, modeB, modeA} {
		sbs[m], ops[m] = e.createAsync(t, pols[m])
	}
	for _, m := range []string{modeO, modeB, modeA} {
		sbs[m] = e.waitCreated(t, sbs[m], ops[m], 3*time.Minute)
	}
	t.Logf("3 qemu sandboxes booted in %v", time.Since(t0).Round(100*time.Millisecond))
	if holders := fdHolders(leakTarget); len(holders) > 0 {
		t.Errorf("processes other than the test hold its leaked descriptor %s: %v", leakTarget, holders)
	}

	// Commands the agent starts run as root with CAP_NET_ADMIN but without
	// CAP_NET_RAW (the agent drops it from the bounding set, as in every
	// driver). Root in a VM owns its kernel, though: the "guest-root"
	// execution runs the client from a kernel usermode helper with every
	// capability (raw sockets included), the real "VM guest on the link".
	for _, m := range []string{modeB, modeA} {
		out := e.exec(t, sbs[m], "/bin/busybox", "sh", "-c", "/bin/busybox id -u; /bin/busybox grep CapEff /proc/self/status; /bin/busybox ip -4 addr show eth0")
		if f := strings.Fields(out); len(f) < 3 || f[0] != "0" || !strings.Contains(out, "inet "+qemuGuest+"/30") || capsOf(f[2])&(1<<unix.CAP_NET_ADMIN) == 0 {
			t.Fatalf("%s VM: the agent's commands are not root with CAP_NET_ADMIN on the guest's virtio link: %q", m, out)
		}
		out = e.guestRootSh(t, sbs[m], "/bin/busybox grep CapEff /proc/self/status")
		if f := strings.Fields(out); len(f) < 2 || capsOf(f[1])&(1<<unix.CAP_NET_RAW) == 0 {
			t.Fatalf("%s VM: guest-root lacks CAP_NET_RAW (%q): the guest-root cases would test nothing", m, out)
		}
	}

	t.Run("catalogue", func(t *testing.T) {
		e.startPeerOn(t, sbs[modeO])
		e.checkOracles(t)
		cases := map[string]rtCase{}
		for _, c := range e.catalogue() {
			if _, dup := cases[c.id]; !dup {
				cases[c.id] = c
			}
		}
		for _, p := range qemuPlan {
			for _, id := range p.ids {
				c, ok := cases[id]
				if !ok || c.run == nil {
					t.Fatalf("qemuPlan names %s, which the catalogue does not run", id)
				}
				execs := []string{"sandbox"}
				if c.guest {
					execs = append(execs, "guest-root")
				}
				for _, ex := range execs {
					t.Run(fmt.Sprintf("%s/%s/%s", id, p.mode, ex), func(t *testing.T) {
						rep.add(e.runCaseIn(t, c, p.mode, ex, sbs[p.mode]))
					})
					if qemuMutates[id] {
						e.qemuRestore(t, sbs[p.mode])
					}
				}
			}
		}
		// RT-04 (a TestEgress extra, not in the catalogue): the allowed
		// name's shared IP with another tenant's Host, and the positive
		// controls through the gateway (HTTP, terminated TLS, a subdomain
		// rule) in the same VM.
		t.Run("RT-04/allowlist/sandbox", func(t *testing.T) {
			sb := sbs[modeA]
			ok := func(s string) bool { return strings.Contains(s, "registry ok") }
			ctrl := ok(e.run(t, sb, "http", "registry.test:80", "registry.test", "/simple/")) &&
				ok(e.run(t, sb, "tls", "registry.test:443", "registry.test", "registry.test", "/simple/")) &&
				ok(e.run(t, sb, "tls", "files.registry.test:443", "files.registry.test", "files.registry.test", "/x"))
			n := nonce()
			seq := e.seq(t, sb)
			e.run(t, sb, "http", "registry.test:80", "evil-cdn.test", "/flag?n="+n)
			deny := e.logAfter(t, sb, seq).denied("not_allowed")
			o := outcome{mode: modeA, exec: "sandbox", id: "RT-04", title: "shared IP, other Host (extra)", class: "N", verdict: "PASS", why: "not_allowed; controls: HTTP, TLS, *.registry.test"}
			switch {
			case e.wan.attackerSaw(n) || e.wan.asked(n) || e.wan.sawEvent(n):
				o.verdict, o.why = "FAIL-B", "the attacker tenant saw NONCE"
			case !deny || !ctrl:
				o.verdict, o.why = "INVALID", fmt.Sprintf("denial logged %v, positive controls %v", deny, ctrl)
			}
			if o.verdict != "PASS" {
				t.Errorf("RT-04 (allowlist): %s — %s", o.verdict, o.why)
			}
			rep.add(o)
		})
	})
	// Every VM is still alive after the attacks (none crashed its way out
	// of a verdict).
	for m, sb := range sbs {
		if out := e.exec(t, sb, "/bin/busybox", "echo", "alive"); out != "alive" {
			t.Errorf("%s VM after the catalogue: %q", m, out)
		}
	}
}

// createAsync asks for a sandbox and returns it (no instance yet) with
// its create operation's id.
func (e *env) createAsync(t *testing.T, network any) (sbx, string) {
	t.Helper()
	var ans struct {
		Operation struct{ ID string } `json:"operation"`
		Sandbox   struct{ ID string } `json:"sandbox"`
		Session   struct {
			Token   string `json:"token"`
			DataURL string `json:"data_url"`
		} `json:"session"`
	}
	body := map[string]any{"template": "rt"}
	if network != nil {
		body["network"] = network
	}
	if code := e.api(t, "POST", "/v1/sandboxes", body, &ans); code != http.StatusAccepted {
		t.Fatalf("create: %d", code)
	}
	return sbx{Sandbox: bench.Sandbox{ID: ans.Sandbox.ID, Token: ans.Session.Token, DataURL: strings.TrimRight(ans.Session.DataURL, "/")}}, ans.Operation.ID
}

// waitCreated waits up to limit for sb's create operation op.
func (e *env) waitCreated(t *testing.T, sb sbx, op string, limit time.Duration) sbx {
	t.Helper()
	deadline := time.Now().Add(limit)
	var st struct {
		State string
		Error *struct{ Message string }
	}
	for {
		e.api(t, "GET", "/v1/operations/"+op+"?wait=30s", nil, &st)
		if st.State == "succeeded" || st.State == "failed" || time.Now().After(deadline) {
			break
		}
	}
	if st.State != "succeeded" {
		t.Fatalf("create operation %s: %s %+v", op, st.State, st.Error)
	}
	var rec struct{ Instance string }
	e.api(t, "GET", "/v1/sandboxes/"+sb.ID, nil, &rec)
	sb.instance = rec.Instance
	return sb
}

// isQEMU reports whether the server under test runs the qemu driver.
func (e *env) isQEMU() bool { return e.srv != nil && e.srv.Node().DriverName() == qemu.Name }

// qemuVerdict adjusts a case's denial evidence under the qemu driver
// (nothing under any other): RT-42 by qemuSpoof; the rest, when no denial
// was found, by qemuDenied or qemuNA.
func (r *run) qemuVerdict(id string) {
	if !r.e.isQEMU() || r.veth == nil || r.tap == nil || r.exec == "netns-guest" {
		return
	}
	if id == "RT-42" {
		r.qemuSpoof()
		return
	}
	if r.deny || r.na != "" {
		return
	}
	if note := r.qemuDenied(id); note != "" {
		r.deny, r.note = true, note
		return
	}
	r.na = r.qemuNA(id)
}

// qemuSpoof decides RT-42 under qemu. The host's spoof counter also grows
// for replies QEMU's namespace un-NATs to a forged address and routes
// back out of the veth (source: the far end), which are no evidence about
// the guest's forged packets. So the counter counts only if the veth
// capture holds a packet whose source is one of the case's forged
// sources (the peer's, the gateway's, the upstream resolver's address):
// such a packet reached the host and its rules dropped it. If none did,
// the guest's forged packets (tap capture) were all masqueraded by QEMU's
// namespace, the spoof counter cannot apply, and the run is N/A with
// that evidence (or INVALID if the guest put none on its link).
func (r *run) qemuSpoof() {
	time.Sleep(200 * time.Millisecond)
	r.veth.Close()
	r.tap.Close()
	forged := map[netip.Addr]bool{}
	for _, a := range []string{r.e.peerAddr(), r.e.gwAddr(r.sb), upstreamDNS} {
		forged[netip.MustParseAddr(a)] = true
	}
	from := func(c *vethCapture) (out []string) {
		c.w.mu.Lock()
		defer c.w.mu.Unlock()
		for _, p := range c.w.packets {
			if !p.v6 && forged[p.src] {
				out = append(out, fmt.Sprintf("%s -> %s proto %d", p.src, p.dst, p.proto))
			}
		}
		return out
	}
	atHost, onTap := from(r.veth), from(r.tap)
	if len(atHost) > 0 {
		if r.deny {
			r.note = fmt.Sprintf("qemu: %d packets with a forged source reached the host veth and met spoof_drop (e.g. %s)", len(atHost), strings.Join(atHost[:min(2, len(atHost))], "; "))
		}
		return
	}
	r.deny = false // whatever spoof_drop counted, it was not the guest's forged packets
	if len(onTap) == 0 {
		return // nothing forged on the guest's link: INVALID
	}
	_, other := r.veth.summary()
	r.na = fmt.Sprintf("qemu: the guest put %d forged-source packets on its link (tap capture in QEMU's namespace, e.g. %s); QEMU's namespace masqueraded all of them to the sandbox's address: the veth capture holds none with a forged source, so the host's spoof counter cannot apply (%d other foreign-source packets there: replies QEMU's namespace routed back out of the veth, dropped by the host); O-WIRE/O-FLAG clean",
		len(onTap), strings.Join(onTap[:min(2, len(onTap))], "; "), len(other))
}

// qemuNA decides, for the qemu driver only, whether a packet-level case
// that the guest did express (root in the VM sends anything) could not
// meet the host counter its O-DENY names, because QEMU's own network
// namespace (outside the VM, table ip space-vm) dropped the packets
// first: IPv6 is disabled on the tap, source-routed packets are not
// forwarded. It needs both captures: the tap's shows the attack left the
// guest, the veth's that no packet of the attack's kind reached the host.
// It returns the N/A reason, or "" (the usual verdict applies).
func (r *run) qemuNA(id string) string {
	why := map[string]string{
		"RT-44": "IPv6 is disabled in QEMU's namespace (tap and all): none of the guest's IPv6 is forwarded, so the host's IPv6 counter cannot apply",
		"RT-09": "QEMU's namespace does not forward what the host's protocol/IP-options counters would count (source-routed packets are dropped by its kernel)",
		"RT-45": "QEMU's namespace reassembles the guest's fragments (conntrack) and forwards whole datagrams, so the host's fragment counter cannot apply",
	}[id]
	if why == "" {
		return ""
	}
	time.Sleep(200 * time.Millisecond) // let the capture drain
	r.veth.Close()
	n, attack := r.veth.summary()
	if len(attack) > 0 {
		return "" // such packets reached the host: its rules must have counted them
	}
	r.tap.Close()
	tn, sent := r.tap.summary()
	if len(sent) == 0 {
		return "" // the guest expressed nothing: no reason to excuse the missing denial
	}
	return fmt.Sprintf("qemu: guest root put the attack on its link (tap capture in QEMU's namespace: %d packets, %d of the attack's kind, e.g. %s); %s; veth capture: %d packets from the sandbox, none of another protocol, with IP options, fragmented, IPv6 or with a forged source; O-WIRE/O-FLAG clean",
		tn, len(sent), strings.Join(sent[:min(2, len(sent))], "; "), why, n)
}

// qemuDenied is RT-09's denial evidence under qemu when the host counted
// the attempt under another of its rules: QEMU's namespace forwards some
// of the guest's packets of other IP protocols (UDP-Lite, seen) without
// masquerading them, so they reach the host with the guest's own source
// (169.254.0.2) and its anti-spoofing rule drops them before the
// protocol rule. It needs both the host's spoof counter and the veth
// capture showing such packets (another protocol, a foreign source);
// it returns the note for the verdict, or "".
func (r *run) qemuDenied(id string) string {
	if id != "RT-09" || r.delta("nft_spoof_drop") == 0 {
		return ""
	}
	time.Sleep(200 * time.Millisecond)
	r.veth.Close()
	_, attack := r.veth.summary()
	var seen []string
	for _, a := range attack {
		// "source SRC -> DST proto N" with N not TCP, UDP or ICMP
		f := strings.Fields(a)
		if len(f) == 6 && f[0] == "source" && f[4] == "proto" && f[5] != "6" && f[5] != "17" && f[5] != "1" {
			seen = append(seen, a)
		}
	}
	if len(seen) == 0 {
		return ""
	}
	return fmt.Sprintf("qemu: refused by the host's anti-spoofing rule (spoof_drop +%d): QEMU's namespace forwarded the guest's packets unmasqueraded (veth capture: %s)",
		r.delta("nft_spoof_drop"), strings.Join(seen[:min(2, len(seen))], "; "))
}

// qemuNetns is QEMU's network namespace for sb, for a capture on the tap:
// that of the QEMU process the driver recorded in the sandbox's
// state.json (<data>/qemu/<instance>/). Not netnsOf: other tests on the
// host may run sandboxes whose eth0 holds the same pool address.
func (e *env) qemuNetns(t *testing.T, sb sbx) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.cfg.DataDir, qemu.Name, sb.instance, "state.json"))
	if err != nil {
		t.Fatalf("qemu state of %s: %v", sb.instance, err)
	}
	var st struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.PID <= 0 {
		t.Fatalf("qemu state of %s: pid %d, %v", sb.instance, st.PID, err)
	}
	return fmt.Sprintf("/proc/%d/ns/net", st.PID)
}

// captureTap records what the guest puts on its tap, inside QEMU's
// namespace (a packet socket made there on a locked thread).
func (e *env) captureTap(t *testing.T, sb sbx) *vethCapture {
	t.Helper()
	nsPath := e.qemuNetns(t, sb)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := vns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	target, err := vns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if err := vns.Set(target); err != nil {
		t.Fatal(err)
	}
	defer vns.Set(orig)
	lk, err := netlink.LinkByName("vmtap0")
	if err != nil {
		t.Fatalf("vmtap0 in %s: %v", nsPath, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatalf("packet socket: %v", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: lk.Attrs().Index}); err != nil {
		unix.Close(fd)
		t.Fatalf("bind to vmtap0: %v", err)
	}
	return startCapture(fd, netip.MustParseAddr(qemuGuest))
}

// startCapture reads packet socket fd (incoming packets only) until Close.
func startCapture(fd int, guest netip.Addr) *vethCapture {
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
	c := &vethCapture{w: &wire{fd: fd}, guest: guest, stop: make(chan struct{}), done: make(chan struct{})}
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
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype != unix.PACKET_OUTGOING {
				c.w.add(htons(ll.Protocol), buf[:n])
			}
		}
	}()
	return c
}

// fdHolders lists the processes other than this one with a descriptor on
// target (a readlink form such as pipe:[123]). It only reads /proc.
func fdHolders(target string) []string {
	var out []string
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range pids {
		if p == fmt.Sprintf("/proc/%d", os.Getpid()) {
			continue
		}
		ents, _ := os.ReadDir(p + "/fd")
		for _, e := range ents {
			if l, err := os.Readlink(p + "/fd/" + e.Name()); err == nil && l == target {
				comm, _ := os.ReadFile(p + "/comm")
				out = append(out, p+" ("+strings.TrimSpace(string(comm))+")")
			}
		}
	}
	return out
}
