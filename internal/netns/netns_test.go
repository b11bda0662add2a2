package netns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/netns/netnstest"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

// guest starts a process in a new network namespace, standing in for a
// sandbox's PID 1 (as root it has CAP_NET_RAW and CAP_NET_ADMIN there, more
// than a real sandbox).
func guest(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

func newManager(t *testing.T) *Manager {
	t.Helper()
	netnstest.RequireRoot(t)
	if !netnstest.Inside() {
		t.Skip("runs only inside its private network namespace")
	}
	m, err := New(Config{Pool: netip.MustParsePrefix("10.201.0.0/24"), IfPrefix: "tst", Table: "space-test", DNSPort: 5353, ProxyPort: 15001})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Destroy(); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	return m
}

func TestSetupFilterAndRelease(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	pid := guest(t)
	t0 := time.Now()
	l, err := m.Setup(ctx, "sbx-a", pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("setup took %v: %+v", time.Since(t0), *l)
	if l.Host != netip.MustParseAddr("10.201.0.1") || l.Guest != netip.MustParseAddr("10.201.0.2") {
		t.Fatalf("addresses %v %v", l.Host, l.Guest)
	}
	// The gateway's stand-ins on GW.
	tcpLn, err := net.Listen("tcp4", net.JoinHostPort(l.Host.String(), "15001"))
	if err != nil {
		t.Fatal(err)
	}
	defer tcpLn.Close()
	udpLn, err := net.ListenPacket("udp4", net.JoinHostPort(l.Host.String(), "5353"))
	if err != nil {
		t.Fatal(err)
	}
	defer udpLn.Close()
	// A host service that must stay unreachable.
	hostSvc, err := net.Listen("tcp4", "127.0.0.1:7777")
	if err != nil {
		t.Fatal(err)
	}
	defer hostSvc.Close()

	accepted := make(chan string, 4)
	go func() {
		for {
			c, err := tcpLn.Accept()
			if err != nil {
				return
			}
			dst, _ := OriginalDst(c.(*net.TCPConn))
			accepted <- c.RemoteAddr().String() + ">" + dst.String()
			c.Close()
		}
	}()
	err = inNetns(pid, func() error {
		// TCP to anywhere ends at the proxy, with the original destination.
		c, err := net.DialTimeout("tcp4", "192.0.2.99:80", 2*time.Second)
		if err != nil {
			return err
		}
		c.Close()
		// UDP 53 to anywhere ends at the resolver.
		u, err := net.Dial("udp4", "192.0.2.99:53")
		if err != nil {
			return err
		}
		u.Write([]byte("dns?"))
		u.Close()
		// Other UDP is dropped.
		for _, p := range []int{123, 443, 9999} {
			u, err := net.Dial("udp4", "192.0.2.99:"+strconv.Itoa(p))
			if err == nil {
				u.Write([]byte("x"))
				u.Close()
			}
		}
		// A fragmented datagram to port 53 is dropped before reassembly.
		if u, err := net.Dial("udp4", "192.0.2.99:53"); err == nil {
			syscall.SetsockoptInt(fd(u), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
			u.Write(make([]byte, 4000))
			u.Close()
		}
		// A spoofed source address never gets through.
		peer, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(peer, &netlink.Addr{IPNet: ipnet(netip.MustParseAddr("10.201.0.6"), 32)}); err != nil {
			return err
		}
		d := net.Dialer{Timeout: 500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: net.ParseIP("10.201.0.6")}}
		if c, err := d.Dial("tcp4", "192.0.2.99:80"); err == nil {
			c.Close()
			return errors.New("spoofed connection got through")
		}
		// ICMP and another IP protocol (GRE) from the real address.
		for _, proto := range []int{unix.IPPROTO_ICMP, 47} {
			if s, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, proto); err == nil {
				unix.Sendto(s, []byte{8, 0, 0, 0, 0, 1, 0, 1}, 0, &unix.SockaddrInet4{Addr: [4]byte{192, 0, 2, 99}})
				unix.Close(s)
			}
		}
		// IPv6 turned back on by root inside: it must reach the host's
		// rules (and be dropped there, counted), not vanish unseen.
		os.WriteFile("/proc/sys/net/ipv6/conf/all/disable_ipv6", []byte("0"), 0)
		os.WriteFile("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", []byte("0"), 0)
		netlink.AddrAdd(peer, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd00:5a::2"), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD})
		if u, err := net.Dial("udp6", "[fd00:5a::1]:9999"); err == nil {
			u.Write([]byte("v6"))
			u.Close()
		}
		time.Sleep(200 * time.Millisecond)
		return nil
	})
	if err != nil {
		out, _ := exec.Command("nft", "list", "ruleset").CombinedOutput()
		ctr, _ := m.Counters("sbx-a")
		t.Fatalf("%v\n%s\n%v", err, out, ctr)
	}
	select {
	case got := <-accepted:
		if got != "10.201.0.2:"+got[len("10.201.0.2:"):] || got[len(got)-len("192.0.2.99:80"):] != "192.0.2.99:80" {
			t.Fatalf("accepted %s", got)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("proxy stand-in got no connection")
	}
	buf := make([]byte, 64)
	udpLn.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, from, err := udpLn.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "dns?" {
		t.Fatalf("resolver stand-in: %q from %v, %v", buf[:n], from, err)
	}
	ctr, err := m.Counters("sbx-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("counters: %v", ctr)
	for _, k := range []string{"udp_drop", "spoof_drop", "frag_drop", "tcp", "dns", "icmp_drop", "proto_drop", "v6_drop"} {
		if ctr[k] == 0 {
			t.Errorf("counter %s = 0", k)
		}
	}
	if ctr["udp_drop"] < 3 {
		t.Errorf("udp_drop = %d, want >= 3", ctr["udp_drop"])
	}

	m.Release("sbx-a")
	c, _ := m.sandboxChainsNow()
	if len(c) != 0 {
		t.Fatalf("chains left after release: %v", c)
	}
}

func fd(c net.Conn) int {
	raw, _ := c.(*net.UDPConn).SyscallConn()
	var out int
	raw.Control(func(f uintptr) { out = int(f) })
	return out
}

func TestSweepAndAdopt(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	p1, p2 := guest(t), guest(t)
	if _, err := m.Setup(ctx, "sbx-keep", p1); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Setup(ctx, "sbx-gone", p2); err != nil {
		t.Fatal(err)
	}
	// A new manager (a restarted node) knows nothing until it adopts.
	m2, err := New(m.Config())
	if err != nil {
		t.Fatal(err)
	}
	l, err := m2.Adopt("sbx-keep")
	if err != nil {
		t.Fatal(err)
	}
	if l.Guest != netip.MustParseAddr("10.201.0.2") {
		t.Fatalf("adopted %+v", l)
	}
	if err := m2.Sweep(map[string]bool{"sbx-keep": true}); err != nil {
		t.Fatal(err)
	}
	chains, _ := m2.sandboxChainsNow()
	if len(chains) != 2 || !chains["s-tst0"] || !chains["i-tst0"] {
		t.Fatalf("chains after sweep: %v", chains)
	}
	if _, err := netlink.LinkByName("tst1"); err == nil {
		t.Fatal("veth of the swept sandbox is still there")
	}
	// The next sandbox does not reuse the freed slot at once.
	l3, err := m2.Setup(ctx, "sbx-new", guest(t))
	if err != nil {
		t.Fatal(err)
	}
	if l3.Slot == 0 {
		t.Fatalf("slot of a live sandbox reused: %+v", l3)
	}
}

func BenchmarkSetupRelease(b *testing.B) {
	netnstest.RequireRoot(b)
	if !netnstest.Inside() {
		b.Skip("runs only inside its private network namespace")
	}
	m, err := New(Config{Pool: netip.MustParsePrefix("10.201.0.0/16"), IfPrefix: "bnc", Table: "space-bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Destroy()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		cmd := exec.Command("sleep", "10")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		id := "sbx-" + strconv.Itoa(i)
		b.StartTimer()
		if _, err := m.Setup(context.Background(), id, cmd.Process.Pid); err != nil {
			b.Fatal(err)
		}
		m.Release(id)
		b.StopTimer()
		// Reaped after the loop: a dying netns's teardown holds locks the
		// next setup needs, which would be measured here otherwise.
		defer cmd.Wait()
		defer cmd.Process.Kill()
	}
}
