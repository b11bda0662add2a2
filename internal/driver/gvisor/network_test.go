package gvisor

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
	"github.com/space-sandbox/space/internal/netns"
)

// testNet is the host side of the sandboxes' networks in these tests: the
// real netns.Manager (veth, addresses, nftables rules that send every TCP
// connection to a proxy port on the sandbox's gateway address), with a
// stand-in proxy that answers any HTTP request with who asked and for
// which original destination.
type testNet struct {
	t   testing.TB
	m   *netns.Manager
	cfg netns.Config

	mu    sync.Mutex
	links map[string]*netns.Link
}

const testProxyPort = 15001

func newTestNet(t testing.TB) *testNet {
	t.Helper()
	pid := os.Getpid()
	cfg := netns.Config{
		// Unique per test process: other test binaries may run beside us.
		Pool:      netip.MustParsePrefix(fmt.Sprintf("10.232.%d.0/24", pid%250)),
		IfPrefix:  fmt.Sprintf("gv%d", pid%10000),
		Table:     fmt.Sprintf("space-gvtest-%d", pid),
		DNSPort:   5353,
		ProxyPort: testProxyPort,
		Logf:      t.Logf,
	}
	m, err := netns.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Destroy(); err != nil {
			t.Errorf("netns destroy: %v", err)
		}
	})
	return &testNet{t: t, m: m, cfg: cfg, links: map[string]*netns.Link{}}
}

// hook is the driver's Options.Network: the link, then the stand-in proxy
// on its gateway address.
func (n *testNet) hook(ctx context.Context, id, nsPath string) error {
	l, err := n.m.SetupPath(ctx, id, nsPath)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort(l.Host.String(), fmt.Sprint(testProxyPort)))
	if err != nil {
		n.m.Release(id)
		return err
	}
	n.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				dst, _ := netns.OriginalDst(c.(*net.TCPConn))
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				body := fmt.Sprintf("from %s for %s", c.RemoteAddr().(*net.TCPAddr).IP, dst)
				fmt.Fprintf(c, "HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			}()
		}
	}()
	n.mu.Lock()
	n.links[id] = l
	n.mu.Unlock()
	return nil
}

func (n *testNet) link(id string) *netns.Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.links[id]
	if l == nil {
		n.t.Fatalf("no link for %s", id)
	}
	return l
}

// fetch asserts that an HTTP request from inside inst to an arbitrary
// address reaches the host's proxy, from the sandbox's address, with the
// original destination intact (the transparent redirect works through
// gVisor's netstack).
func fetch(t *testing.T, inst driver.Instance, l *netns.Link) {
	t.Helper()
	out := drivertest.MustSh(t, inst, "wget -qO- http://198.51.100.7:8080/x")
	if want := fmt.Sprintf("from %s for 198.51.100.7:8080", l.Guest); out != want {
		t.Errorf("fetch from %s: got %q, want %q", inst.ID(), out, want)
	}
}

// vethGone waits until the host side of a sandbox's veth has gone (with the
// sandbox's netns).
func vethGone(t *testing.T, l *netns.Link) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := net.InterfaceByName(l.HostIf); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("veth %s of %s still exists after destroy", l.HostIf, l.ID)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNetworkHook runs a sandbox over a network the hook makes in the
// driver's netns (runsc --network=sandbox), sweeps another one, re-adopts
// it on a fresh driver, and checks that destroying it leaves no mount,
// netns, veth or rule.
func TestNetworkHook(t *testing.T) {
	requireRunsc(t)
	n := newTestNet(t)
	opts := testOptions(t, shortDir(t))
	opts.Network = n.hook
	d := newDriver(t, opts)
	inst := create(t, d, "net", driver.Limits{})
	l := n.link("net")
	t.Logf("network setup %v (of %v)", inst.Timing().Network, inst.Timing().Total)
	if inst.st.Network != "sandbox" || inst.st.NetNS != filepath.Join(d.sandboxDir("net"), netnsName) {
		t.Errorf("state: network %q netns %q", inst.st.Network, inst.st.NetNS)
	}
	fetch(t, inst, l)
	// Inside, the only interface besides lo is the veth's peer: the sandbox
	// cannot see or reach the host's interfaces.
	if out := drivertest.MustSh(t, inst, "cat /proc/net/dev"); !strings.Contains(out, "eth0") || strings.Contains(out, l.HostIf) {
		t.Errorf("interfaces inside: %s", out)
	}

	// Sweep at a node's start (a new manager over the same table) removes
	// a sandbox it is not told to keep, and that sandbox's rules; the kept
	// one is untouched.
	create(t, d, "swept", driver.Limits{})
	gone := n.link("swept")
	keep := map[string]bool{"net": true}
	if err := d.Sweep(testCtx(t), keep); err != nil {
		t.Fatal(err)
	}
	n.m.Unclaim() // the restarted node's predecessor is gone, and its claim
	restarted, err := netns.New(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restarted.Unclaim)
	if err := restarted.Sweep(keep); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(d, "swept"); len(left) > 0 {
		t.Errorf("sweep left behind: %v", left)
	}
	vethGone(t, gone)
	// Counters list one entry per counting rule: none once the chains went.
	if c, _ := n.m.Counters("swept"); len(c) > 0 {
		t.Errorf("swept sandbox's rules are still there: %v", c)
	}
	if c, err := n.m.Counters("net"); err != nil || len(c) == 0 {
		t.Errorf("kept sandbox's rules: %v %v", c, err)
	}
	fetch(t, inst, l)

	// A restarted node re-adopts it with its network.
	d2 := newDriver(t, opts)
	again, err := d2.Attach(testCtx(t), "net")
	if err != nil {
		t.Fatal(err)
	}
	fetch(t, again, l)

	if err := again.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	n.m.Release("net") // what egress.Network.WrapDriver does
	if left := leftovers(d2, "net"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	vethGone(t, l)
}

// TestNetworkFailedHook: a hook that fails fails Create and leaves nothing.
func TestNetworkFailedHook(t *testing.T) {
	requireRunsc(t)
	opts := testOptions(t, shortDir(t))
	opts.Network = func(ctx context.Context, id, nsPath string) error {
		if _, err := os.Stat(nsPath); err != nil {
			t.Errorf("hook called without the netns: %v", err)
		}
		return fmt.Errorf("no addresses left")
	}
	d := newDriver(t, opts)
	_, err := d.Create(testCtx(t), driver.Spec{ID: "nonet", RootfsDir: rootfs})
	if err == nil || !strings.Contains(err.Error(), "no addresses left") {
		t.Fatalf("create: %v", err)
	}
	if left := leftovers(d, "nonet"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestNetworkCheckpointRestore restores a checkpointed sandbox into a new
// id with a new link (another address): the restored netstack must use the
// new netns, not the address it had at checkpoint.
func TestNetworkCheckpointRestore(t *testing.T) {
	requireRunsc(t)
	n := newTestNet(t)
	base := shortDir(t)
	opts := testOptions(t, base)
	opts.Network = n.hook
	d := newDriver(t, opts)
	inst := create(t, d, "ckn", driver.Limits{MemoryBytes: 256 << 20})
	fetch(t, inst, n.link("ckn"))
	layer, _ := inst.WritableLayer()
	img := filepath.Join(base, "image")
	if err := inst.Checkpoint(testCtx(t), img); err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(base, "layer")
	if out, err := exec.Command("cp", "-a", layer.Dir, saved).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	n.m.Release("ckn")
	vethGone(t, n.link("ckn"))
	re, err := d.Restore(testCtx(t), driver.Spec{ID: "ckn-re", RootfsDir: rootfs, Limits: driver.Limits{MemoryBytes: 256 << 20}, InitLayer: drivertest.CopyLayer(saved, layer.UIDBase)}, img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = re.Destroy(context.Background()) })
	l := n.link("ckn-re")
	if l.Guest == n.link("ckn").Guest {
		t.Fatalf("restore got the same address %v; the test needs another", l.Guest)
	}
	fetch(t, re, l)
}

// TestSelfTest: the self-test runs a sandbox over an empty root and leaves
// nothing; with a runsc that cannot start sandboxes it fails.
func TestSelfTest(t *testing.T) {
	requireRunsc(t)
	opts := testOptions(t, shortDir(t))
	opts.Network = func(ctx context.Context, id, nsPath string) error {
		t.Errorf("self-test asked for a network")
		return nil
	}
	d := newDriver(t, opts)
	if err := d.SelfTest(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(d, selfTestID); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if _, err := os.Stat(filepath.Join(opts.StateDir, ".selftest-root")); err == nil {
		t.Error("self-test root left behind")
	}
	// A runsc that answers everything but cannot run a sandbox.
	fake := filepath.Join(shortDir(t), "runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nfor a; do case $a in --version) echo runsc version fake;; run) exit 1;; esac; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bad := testOptions(t, shortDir(t))
	bad.Runsc = fake
	if err := newDriver(t, bad).SelfTest(testCtx(t)); err == nil {
		t.Error("self-test passed with a runsc that runs nothing")
	}
}

// BenchmarkCreateDestroyNetwork is BenchmarkCreateDestroy with a network
// (netns made by the driver, link and rules by netns.Manager).
func BenchmarkCreateDestroyNetwork(b *testing.B) {
	requireRunsc(b)
	n := newTestNet(b)
	drivertest.Bench(b, drivertest.Env{Rootfs: rootfs}, shortDir(b), func(dir string) driver.Driver {
		opts := testOptions(b, dir)
		opts.Network = n.hook
		return newDriver(b, opts)
	})
}
