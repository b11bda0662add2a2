package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/egress/policy"
	"github.com/space-sandbox/space/internal/netns"
	"github.com/space-sandbox/space/internal/netns/netnstest"
)

// Addresses of the fake internet the network test builds in its private
// network namespace (documentation range, declared public to the gateway).
const (
	upAddr  = "198.51.100.10" // HTTP server "up.test"
	dnsAddr = "198.51.100.53" // authoritative for up.test
)

// fakeNet is an upstream HTTP server and resolver on loopback, plus a
// canary listener on every host address.
type fakeNet struct {
	upHits, canaryHits atomic.Int64
}

func startFakeNet(t *testing.T) *fakeNet {
	t.Helper()
	f := &fakeNet{}
	// On the private namespace's loopback (this kernel has no dummy
	// links): local to the gateway, which dials from here.
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{upAddr, dnsAddr} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a), Mask: net.CIDRMask(32, 32)}}
		if err := netlink.AddrAdd(lo, addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netlink.AddrDel(lo, addr) })
	}
	serve := func(addr string, h http.HandlerFunc) {
		l, err := net.Listen("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	serve(upAddr+":80", func(w http.ResponseWriter, r *http.Request) {
		f.upHits.Add(1)
		fmt.Fprint(w, "upstream-ok")
	})
	// Anything that reaches this port unproxied has escaped the rules.
	serve("0.0.0.0:18080", func(w http.ResponseWriter, r *http.Request) {
		f.canaryHits.Add(1)
		fmt.Fprint(w, "canary")
	})
	pc, err := net.ListenPacket("udp4", dnsAddr+":53")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := dnsAnswer(buf[:n]); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	return f
}

// dnsAnswer answers A up.test with upAddr and everything else NXDOMAIN.
func dnsAnswer(msg []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	found := strings.EqualFold(q.Name.String(), "up.test.")
	if found && q.Type == dnsmessage.TypeA {
		_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 0},
			dnsmessage.AResource{A: netip.MustParseAddr(upAddr).As4()})
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	if !found {
		out[3] |= 3 // NXDOMAIN
	}
	return out
}

// fetchUp resolves up.test through the gateway and fetches it over plain
// HTTP with busybox tools; it prints the upstream's body on success.
const fetchUp = `nslookup up.test ` + dnsAddr + ` >/dev/null 2>&1; printf 'GET / HTTP/1.0\r\nHost: up.test\r\n\r\n' | nc -w 5 ` + upAddr + ` 80 2>&1 | grep -o upstream-ok || echo failed`

// TestVM boots one VM with a NIC behind the egress gateway and checks on
// it what the conformance suite does not: the host cgroup budget, the
// network (blocked, then an allowlist), pause/resume, bulk output over
// the mux, and checkpoint/restore (a file and a running process survive
// into a VM restored after the original is gone, whose network works
// again through its own link).
func TestVM(t *testing.T) {
	requireVM(t)
	if !netnstest.Inside() {
		t.Skip("runs only inside its private network namespace")
	}
	n, err := egress.NewNetwork(
		netns.Config{Pool: netip.MustParsePrefix("10.201.0.0/24"), IfPrefix: "sqt", Table: "space-qemu-test"},
		egress.Config{Upstream: netip.MustParseAddrPort(dnsAddr + ":53"), Public: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	// After the gateway: it counts the addresses the host has when it
	// starts as internal, and the fake upstream must not be one of them.
	fake := startFakeNet(t)
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.Network = n.Setup
	d := newDriver(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	t0 := time.Now()
	inst, err := d.Create(ctx, driver.Spec{ID: "vm-a", Hostname: "box-a", RootfsDir: rootfs,
		Limits: driver.Limits{MemoryBytes: 128 << 20, CPUMillis: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Destroy(context.Background()); n.Release("vm-a") })
	t.Logf("create: %v, timing %+v, accel %s", time.Since(t0), inst.Timing(), d.Accel())
	vm := inst.(*Instance)

	// The host budget: guest RAM (limit + guest overhead) + TCG buffer +
	// QEMU's own; CPU quota as asked; QEMU in the group.
	memDir := vm.st.Cgroups.Memory
	wantMem := int64(128+guestOverheadMiB+qemuOverheadMiB) << 20
	if d.Accel() == "tcg" {
		wantMem += tcgBufferMiB << 20
	}
	if got := readInt(t, filepath.Join(memDir, "memory.limit_in_bytes")); got != wantMem {
		t.Errorf("host memory limit %d, want %d", got, wantMem)
	}
	if got := readInt(t, filepath.Join(vm.st.Cgroups.CPU, "cpu.cfs_quota_us")); got != 100000 {
		t.Errorf("cpu quota %d, want 100000", got)
	}
	if procs, _ := os.ReadFile(filepath.Join(memDir, "cgroup.procs")); !strings.Contains(" "+strings.Join(strings.Fields(string(procs)), " ")+" ", " "+strconv.Itoa(vm.PID())+" ") {
		t.Errorf("QEMU (%d) is not in its cgroup: %q", vm.PID(), procs)
	}
	// SetLimits: growing past the boot size is refused; shrinking moves
	// the balloon (the guest's MemTotal drops) and the host budget and
	// quota follow; growing back restores both.
	memTotal := func() int {
		kb, _ := strconv.Atoi(drivertest.MustSh(t, inst, "grep MemTotal /proc/meminfo | grep -o '[0-9]*'"))
		return kb
	}
	memBefore := memTotal()
	if err := inst.SetLimits(ctx, driver.Limits{MemoryBytes: 1 << 30, CPUMillis: 1000}); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("SetLimits past the boot size: %v", err)
	}
	if err := inst.SetLimits(ctx, driver.Limits{MemoryBytes: 96 << 20, CPUMillis: 500}); err != nil {
		t.Fatalf("SetLimits shrink: %v", err)
	}
	if got, want := readInt(t, filepath.Join(memDir, "memory.limit_in_bytes")), wantMem-32<<20; got != want {
		t.Errorf("host memory limit after shrink %d, want %d", got, want)
	}
	if got := readInt(t, filepath.Join(vm.st.Cgroups.CPU, "cpu.cfs_quota_us")); got != 50000 {
		t.Errorf("cpu quota after SetLimits %d, want 50000", got)
	}
	if after := memTotal(); after > memBefore-30<<10 {
		t.Errorf("guest MemTotal %d kB after shrinking by 32 MiB (was %d kB)", after, memBefore)
	}
	if err := inst.SetLimits(ctx, driver.Limits{MemoryBytes: 128 << 20, CPUMillis: 1000}); err != nil {
		t.Fatalf("SetLimits grow back: %v", err)
	}
	if got := readInt(t, filepath.Join(memDir, "memory.limit_in_bytes")); got != wantMem {
		t.Errorf("host memory limit after growing back %d, want %d", got, wantMem)
	}
	if after := memTotal(); after < memBefore-1<<10 {
		t.Errorf("guest MemTotal %d kB after growing back (was %d kB)", after, memBefore)
	}
	if got := drivertest.MustSh(t, inst, "echo hello; hostname; ip -4 addr show eth0 | grep -o 'inet [0-9./]*'"); got != "hello\nbox-a\ninet 169.254.0.2/30" {
		t.Errorf("exec output %q", got)
	}

	// Network, blocked (the default): nothing gets out, not even DNS.
	if got := drivertest.MustSh(t, inst, fetchUp+"; nc -w 2 "+upAddr+" 18080 </dev/null; nc -w 2 169.254.0.1 18080 </dev/null; true"); strings.Contains(got, "upstream-ok") || strings.Contains(got, "canary") {
		t.Errorf("blocked sandbox reached something: %q", got)
	}
	if fake.upHits.Load() != 0 || fake.canaryHits.Load() != 0 {
		t.Errorf("blocked sandbox reached the upstream (%d) or the canary (%d)", fake.upHits.Load(), fake.canaryHits.Load())
	}
	// An allowlist: the upstream is reachable through the gateway, and
	// nothing else is.
	allow := func(id string) {
		p, err := policy.Parse("allowlist", []string{"up.test:80"})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.GW.SetPolicy(id, p); err != nil {
			t.Fatal(err)
		}
	}
	allow("vm-a")
	if got := drivertest.MustSh(t, inst, fetchUp); got != "upstream-ok" {
		t.Errorf("allowlisted fetch: %q", got)
	}
	if got := drivertest.MustSh(t, inst, "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 "+upAddr+" 18080; true"); strings.Contains(got, "canary") {
		t.Errorf("allowlisted sandbox reached the canary: %q", got)
	}
	if fake.upHits.Load() != 1 || fake.canaryHits.Load() != 0 {
		t.Errorf("upstream hits %d (want 1), canary hits %d", fake.upHits.Load(), fake.canaryHits.Load())
	}

	// Concurrent connections and a large output over the one port.
	errs := make(chan error, 4)
	for k := range 4 {
		go func() {
			out, _, err := drivertest.Sh(ctx, inst, fmt.Sprintf("echo c%d", k))
			if err == nil && strings.TrimSpace(out) != fmt.Sprintf("c%d", k) {
				err = fmt.Errorf("conn %d: %q", k, out)
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if out, _, err := drivertest.Sh(ctx, inst, "dd if=/dev/zero bs=1024 count=1024 2>/dev/null | busybox od -An -v | busybox wc -c"); err != nil || strings.TrimSpace(out) != "3735552" {
		t.Errorf("bulk output: %q %v", out, err)
	}

	// Pause: the agent does not answer until resumed.
	tp := time.Now()
	if err := vm.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	pauseT := time.Since(tp)
	pctx, pcancel := context.WithTimeout(ctx, 700*time.Millisecond)
	if _, _, err := drivertest.Sh(pctx, inst, "true"); err == nil {
		t.Error("a paused VM ran a command")
	}
	pcancel()
	tr := time.Now()
	if err := vm.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	t.Logf("pause %v, resume %v", pauseT, time.Since(tr))
	drivertest.MustSh(t, inst, "true")

	// Checkpoint with a file and a counting process, then restore after
	// the original is gone.
	// The count is renamed into place: a read never sees the file
	// truncated mid-write (that read as 0 once and failed the check below).
	drivertest.MustSh(t, inst, "echo data > /root/f; (i=0; while :; do i=$((i+1)); echo $i > /root/count.new; mv /root/count.new /root/count; sleep 0.1; done) >/dev/null 2>&1 &")
	drivertest.MustSh(t, inst, "sleep 0.5")
	ck := filepath.Join(dir, "ckpt")
	tc := time.Now()
	if err := vm.Checkpoint(ctx, ck); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	ckT := time.Since(tc)
	t.Logf("host memory peak of the VM: %d MiB of %d", readInt(t, filepath.Join(memDir, "memory.max_usage_in_bytes"))>>20, wantMem>>20)
	fi, _ := os.Stat(filepath.Join(ck, ckptMemory))
	di, _ := os.Stat(filepath.Join(ck, ckptUpper))
	t.Logf("checkpoint %v, memory image %d MiB, disk data %d KiB", ckT, fi.Size()>>20, di.Size()>>10)
	// The original is left paused, and runs on when resumed.
	pctx, pcancel = context.WithTimeout(ctx, 700*time.Millisecond)
	if _, _, err := drivertest.Sh(pctx, inst, "true"); err == nil {
		t.Error("a checkpointed VM ran a command before Resume")
	}
	pcancel()
	// Pause on the checkpointed VM (what the node does for a sandbox
	// that was paused before the snapshot) keeps it paused, and Resume
	// still brings it (and its disks) back.
	if err := vm.Pause(ctx); err != nil {
		t.Fatalf("pause after checkpoint: %v", err)
	}
	if err := vm.Resume(ctx); err != nil {
		t.Fatalf("resume after checkpoint: %v", err)
	}
	drivertest.MustSh(t, inst, "echo after > /root/after-ckpt && sync")
	before, _ := strconv.Atoi(drivertest.MustSh(t, inst, "cat /root/count"))
	if err := inst.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	n.Release("vm-a")
	if left := leftovers(d, "vm-a"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}

	d2 := newDriver(t, o) // as after a node restart
	tt := time.Now()
	re, err := d2.Restore(ctx, driver.Spec{ID: "vm-r", RootfsDir: rootfs, Limits: driver.Limits{CPUMillis: 1000}}, ck)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Cleanup(func() { _ = re.Destroy(context.Background()); n.Release("vm-r") })
	t.Logf("restore to agent ready: %v", time.Since(tt))
	if got := drivertest.MustSh(t, re, "cat /root/f; hostname"); got != "data\nbox-a" {
		t.Errorf("restored files: %q", got)
	}
	c1, _ := strconv.Atoi(drivertest.MustSh(t, re, "cat /root/count"))
	drivertest.MustSh(t, re, "sleep 0.5")
	c2, _ := strconv.Atoi(drivertest.MustSh(t, re, "cat /root/count"))
	// The loop resumed where it was saved (not from 1), and runs on.
	if c1 < 3 || c2 <= c1 || c1 > before+5 {
		t.Errorf("counter: %d at checkpoint-ish, %d then %d after restore", before, c1, c2)
	}
	allow("vm-r")
	if got := drivertest.MustSh(t, re, fetchUp); got != "upstream-ok" {
		t.Errorf("fetch from the restored VM: %q", got)
	}
	// A second restore of the same checkpoint is a fork: its own disk,
	// its own processes, alive beside the first.
	fork, err := d2.Restore(ctx, driver.Spec{ID: "vm-f", RootfsDir: rootfs}, ck)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Cleanup(func() { _ = fork.Destroy(context.Background()); n.Release("vm-f") })
	drivertest.MustSh(t, re, "echo only-r > /root/g")
	if got := drivertest.MustSh(t, fork, "cat /root/f; cat /root/g 2>/dev/null; true"); got != "data" {
		t.Errorf("fork sees %q", got)
	}
	if err := fork.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	n.Release("vm-f")
	if left := leftovers(d2, "vm-f"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if err := re.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	n.Release("vm-r")
	if left := leftovers(d2, "vm-r"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	// The veths go with QEMU's network namespaces.
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left = nil
		links, _ := netlink.LinkList()
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "sqt") {
				left = append(left, l.Attrs().Name)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("veths left behind: %v", left)
	}
}

func readInt(t *testing.T, p string) int64 {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// BenchmarkLifecycle measures, per iteration, boot to agent ready, pause,
// resume, checkpoint (a running VM, 256 MiB guest), restore to agent
// ready (the original destroyed first) and reports their medians.
func BenchmarkLifecycle(b *testing.B) {
	requireVM(b)
	dir := b.TempDir()
	o := testOptions(b, dir)
	o.Logf = func(string, ...any) {}
	d := newDriver(b, o)
	ctx := context.Background()
	var creates, pauses, resumes, ckpts, restores []time.Duration
	var image int64
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bench-%d", i)
		t0 := time.Now()
		inst, err := d.Create(ctx, driver.Spec{ID: id, RootfsDir: rootfs})
		if err != nil {
			b.Fatal(err)
		}
		creates = append(creates, time.Since(t0))
		vm := inst.(*Instance)
		t1 := time.Now()
		if err := vm.Pause(ctx); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := vm.Resume(ctx); err != nil {
			b.Fatal(err)
		}
		pauses, resumes = append(pauses, t2.Sub(t1)), append(resumes, time.Since(t2))
		drivertest.MustSh(b, inst, "echo x > /root/x")
		ck := filepath.Join(dir, "ck-"+id)
		t3 := time.Now()
		if err := vm.Checkpoint(ctx, ck); err != nil {
			b.Fatal(err)
		}
		ckpts = append(ckpts, time.Since(t3))
		if fi, err := os.Stat(filepath.Join(ck, ckptMemory)); err == nil {
			image = fi.Size()
		}
		if err := inst.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		re, err := d.Restore(ctx, driver.Spec{ID: id + "-r", RootfsDir: rootfs}, ck)
		if err != nil {
			b.Fatal(err)
		}
		restores = append(restores, time.Since(t4))
		if got := drivertest.MustSh(b, re, "cat /root/x"); got != "x" {
			b.Fatalf("restored file: %q", got)
		}
		if err := re.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		_ = os.RemoveAll(ck)
	}
	ms := func(d []time.Duration) float64 {
		s := append([]time.Duration(nil), d...)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	b.ReportMetric(ms(creates), "create-ms")
	b.ReportMetric(ms(pauses), "pause-ms")
	b.ReportMetric(ms(resumes), "resume-ms")
	b.ReportMetric(ms(ckpts), "checkpoint-ms")
	b.ReportMetric(ms(restores), "restore-ms")
	b.ReportMetric(float64(image>>20), "image-MiB")
}
