package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
	// A new manager (a restarted node) knows nothing until it adopts. The
	// old one's process would be gone, and its claim with it.
	m.Unclaim()
	m2, err := New(m.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m2.Unclaim)
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
	if len(chains) != 3 || !chains["s-tst0"] || !chains["i-tst0"] || !chains["l-tst0"] {
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

// TestLinkLayer: the host assigns both MACs, pins the sandbox's in its
// neighbour table, answers ARP only for GW and drops (and counts) frames
// from any other source MAC, other ARP and other ethertypes (R2, R16).
func TestLinkLayer(t *testing.T) {
	m := newManager(t)
	pid := guest(t)
	l, err := m.Setup(context.Background(), "sbx-l2", pid)
	if err != nil {
		t.Fatal(err)
	}
	mac, static, err := m.Neighbour("sbx-l2")
	if err != nil || !static || mac.String() != l.GuestMAC.String() {
		t.Fatalf("host neighbour for %s: %v static=%v (%v), want %v static", l.Guest, mac, static, err, l.GuestMAC)
	}
	if host, err := netlink.LinkByName(l.HostIf); err != nil || host.Attrs().HardwareAddr.String() != l.HostMAC.String() {
		t.Fatalf("host veth MAC: %v %v, want %v", host, err, l.HostMAC)
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort(l.Host.String(), "15001"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	forged, _ := net.ParseMAC("02:00:00:00:00:99")
	other := netip.MustParseAddr("10.201.0.5")
	var before map[string]uint64
	err = inNetns(pid, func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if got := eth.Attrs().HardwareAddr.String(); got != l.GuestMAC.String() {
			return fmt.Errorf("sandbox MAC %s, want %s", got, l.GuestMAC)
		}
		// The normal path: ARP for GW is answered, TCP reaches the proxy.
		c, err := net.DialTimeout("tcp4", "192.0.2.99:80", 2*time.Second)
		if err != nil {
			return fmt.Errorf("with the assigned MAC: %w", err)
		}
		c.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if before, err = m.Counters("sbx-l2"); err != nil {
		t.Fatal(err)
	}
	err = inNetns(pid, func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		// Hand-built frames, as a VM guest's kernel can send them.
		s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		defer unix.Close(s)
		to := &unix.SockaddrLinklayer{Ifindex: eth.Attrs().Index, Halen: 6}
		copy(to.Addr[:], l.HostMAC)
		send := func(f []byte) error { return unix.Sendto(s, f, 0, to) }
		bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		// Announcement: the sandbox's address at a forged MAC (frame
		// source the assigned MAC, so only the ARP rule can catch it).
		if err := send(arpFrame(bcast, l.GuestMAC, 2, forged, l.Guest, bcast, l.Guest)); err != nil {
			return err
		}
		// A request for another address (host scan) and one from a
		// forged sender address.
		if err := send(arpFrame(bcast, l.GuestMAC, 1, l.GuestMAC, l.Guest, nil, other)); err != nil {
			return err
		}
		if err := send(arpFrame(bcast, l.GuestMAC, 1, l.GuestMAC, other, nil, l.Host)); err != nil {
			return err
		}
		// A VLAN-tagged frame and an unknown ethertype.
		vlan := append(append(append([]byte{}, l.HostMAC...), l.GuestMAC...), 0x81, 0x00, 0x00, 0x05, 0x08, 0x00)
		if err := send(append(vlan, make([]byte, 40)...)); err != nil {
			return err
		}
		if err := send(append(append(append([]byte{}, l.HostMAC...), l.GuestMAC...), append([]byte{0x88, 0xb5}, make([]byte, 46)...)...)); err != nil {
			return err
		}
		// Root inside changes its MAC: everything it sends now is dropped.
		if err := netlink.LinkSetHardwareAddr(eth, forged); err != nil {
			return err
		}
		neighs, _ := netlink.NeighList(eth.Attrs().Index, netlink.FAMILY_V4)
		for _, n := range neighs {
			netlink.NeighDel(&n)
		}
		if c, err := net.DialTimeout("tcp4", "192.0.2.99:80", time.Second); err == nil {
			c.Close()
			return errors.New("connected with a forged MAC")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	after, err := m.Counters("sbx-l2")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("counters before %v after %v", before, after)
	if before["arp"] == 0 {
		t.Errorf("no ARP request for GW was admitted: %v", before)
	}
	if d := after["arp_drop"] - before["arp_drop"]; d < 3 {
		t.Errorf("arp_drop grew by %d, want >= 3", d)
	}
	if d := after["l2_drop"] - before["l2_drop"]; d < 2 {
		t.Errorf("l2_drop grew by %d, want >= 2", d)
	}
	if after["mac_drop"] == before["mac_drop"] {
		t.Errorf("mac_drop did not grow")
	}
	mac, static, err = m.Neighbour("sbx-l2")
	if err != nil || !static || mac.String() != l.GuestMAC.String() {
		t.Fatalf("host neighbour after the attack: %v static=%v (%v), want %v static", mac, static, err, l.GuestMAC)
	}
	m.Release("sbx-l2")
	if c, _ := m.sandboxChainsNow(); len(c) != 0 {
		t.Fatalf("chains left after release: %v", c)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// arpFrame builds an Ethernet/IPv4 ARP frame.
func arpFrame(dst, src net.HardwareAddr, op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	if tha == nil {
		tha = make(net.HardwareAddr, 6)
	}
	f := append(append(append([]byte{}, dst...), src...), 0x08, 0x06)
	f = append(f, 0, 1, 8, 0, 6, 4, byte(op>>8), byte(op))
	s4, t4 := spa.As4(), tpa.As4()
	f = append(append(append(append(f, sha...), s4[:]...), tha...), t4[:]...)
	return append(f, make([]byte, 18)...) // pad to 60 bytes
}

// TestIPv6: with IPv6 on, the sandbox gets one address from the IPv6 pool
// and a default route via GW6; TCP and DNS over IPv6 end at GW6's
// listeners like IPv4 (with the original destination), the host pins the
// sandbox's IPv6 neighbour, and a foreign source, other UDP and ICMPv6 are
// dropped and counted. With IPv6 off the sandbox has no IPv6 route at all.
func TestIPv6(t *testing.T) {
	netnstest.RequireRoot(t)
	if !netnstest.Inside() {
		t.Skip("runs only inside its private network namespace")
	}
	off := newManager(t)
	if off.Config().IPv6 != IPv6Off {
		t.Fatalf("auto without an IPv6 default route: %s, want off", off.Config().IPv6)
	}
	pidOff := guest(t)
	lOff, err := off.Setup(context.Background(), "sbx-v4", pidOff)
	if err != nil {
		t.Fatal(err)
	}
	if lOff.Guest6.IsValid() {
		t.Fatalf("IPv6 address with IPv6 off: %v", lOff.Guest6)
	}
	if err := inNetns(pidOff, func() error {
		if rs, _ := netlink.RouteList(nil, netlink.FAMILY_V6); len(rs) != 0 {
			return fmt.Errorf("IPv6 routes in the sandbox with IPv6 off: %v", rs)
		}
		if _, err := net.DialTimeout("tcp6", "[2001:db8::99]:80", time.Second); err == nil || !errors.Is(err, unix.ENETUNREACH) && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("tcp6 with IPv6 off: %v, want network unreachable", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	off.Release("sbx-v4")

	m, err := New(Config{Pool: netip.MustParsePrefix("10.202.0.0/24"), IfPrefix: "tsix", Table: "space-test6", DNSPort: 5353, ProxyPort: 15001,
		IPv6: IPv6On, Pool6: netip.MustParsePrefix("fd00:6:6::/64")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy() })
	pid := guest(t)
	l, err := m.Setup(context.Background(), "sbx-v6", pid)
	if err != nil {
		t.Fatal(err)
	}
	if l.Host6 != netip.MustParseAddr("fd00:6:6::1") || l.Guest6 != netip.MustParseAddr("fd00:6:6::2") {
		t.Fatalf("IPv6 addresses %v %v", l.Host6, l.Guest6)
	}
	tcpLn, err := net.Listen("tcp6", net.JoinHostPort(l.Host6.String(), "15001"))
	if err != nil {
		t.Fatal(err)
	}
	defer tcpLn.Close()
	udpLn, err := net.ListenPacket("udp6", net.JoinHostPort(l.Host6.String(), "5353"))
	if err != nil {
		t.Fatal(err)
	}
	defer udpLn.Close()
	accepted := make(chan string, 4)
	go func() {
		for {
			c, err := tcpLn.Accept()
			if err != nil {
				return
			}
			dst, err := OriginalDst(c.(*net.TCPConn))
			accepted <- fmt.Sprintf("%s>%s %v", c.RemoteAddr(), dst, err)
			c.Close()
		}
	}()
	err = inNetns(pid, func() error {
		c, err := net.DialTimeout("tcp6", "[2001:db8::99]:80", 2*time.Second)
		if err != nil {
			return err
		}
		c.Close()
		u, err := net.Dial("udp6", "[2001:db8::99]:53")
		if err != nil {
			return err
		}
		u.Write([]byte("dns6?"))
		u.Close()
		for _, p := range []string{"123", "443"} {
			if u, err := net.Dial("udp6", "[2001:db8::99]:"+p); err == nil {
				u.Write([]byte("x"))
				u.Close()
			}
		}
		if s, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6); err == nil {
			unix.Sendto(s, []byte{128, 0, 0, 0, 0, 1, 0, 1}, 0, &unix.SockaddrInet6{Addr: netip.MustParseAddr("2001:db8::99").As16()})
			unix.Close(s)
		}
		peer, _ := netlink.LinkByName("eth0")
		if err := netlink.AddrAdd(peer, &netlink.Addr{IPNet: ipnet6(netip.MustParseAddr("fd00:6:6::6"), 128), Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		d := net.Dialer{Timeout: 500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: net.ParseIP("fd00:6:6::6")}}
		if c, err := d.Dial("tcp6", "[2001:db8::99]:80"); err == nil {
			c.Close()
			return errors.New("spoofed IPv6 connection got through")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-accepted:
		if got != "[fd00:6:6::2]:"+got[len("[fd00:6:6::2]:"):] || !strings.HasSuffix(got, ">[2001:db8::99]:80 <nil>") {
			t.Fatalf("accepted %s", got)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("proxy stand-in got no IPv6 connection")
	}
	buf := make([]byte, 64)
	udpLn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, _, err := udpLn.ReadFrom(buf); err != nil || string(buf[:n]) != "dns6?" {
		t.Fatalf("resolver stand-in over IPv6: %q, %v", buf[:n], err)
	}
	ctr, err := m.Counters("sbx-v6")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("counters: %v", ctr)
	for _, k := range []string{"nd", "nd_in", "tcp", "dns", "udp_drop", "icmp_drop", "spoof_drop"} {
		if ctr[k] == 0 {
			t.Errorf("counter %s = 0", k)
		}
	}
	if ctr["v6_drop"] != 0 {
		t.Errorf("v6_drop = %d with IPv6 on", ctr["v6_drop"])
	}
	host, _ := netlink.LinkByName(l.HostIf)
	ns, _ := netlink.NeighList(host.Attrs().Index, netlink.FAMILY_V6)
	pinned := false
	for _, n := range ns {
		pinned = pinned || n.IP.Equal(l.Guest6.AsSlice()) && n.State&netlink.NUD_PERMANENT != 0 && n.HardwareAddr.String() == l.GuestMAC.String()
	}
	if !pinned {
		t.Errorf("no static IPv6 neighbour for %s: %v", l.Guest6, ns)
	}
}
