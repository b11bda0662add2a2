package netns

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h).
const ip6tSOOriginalDst = 80

// OriginalDst returns where a connection redirected by the nat chain was
// addressed before the redirect (SO_ORIGINAL_DST, or IP6T_SO_ORIGINAL_DST
// for a connection over IPv6).
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	v6 := false
	if la, ok := c.LocalAddr().(*net.TCPAddr); ok && la.IP.To4() == nil {
		v6 = true
	}
	var (
		sa   unix.RawSockaddrInet4
		sa6  unix.RawSockaddrInet6
		serr error
	)
	err = raw.Control(func(fd uintptr) {
		level, opt, p, size := uintptr(unix.SOL_IP), uintptr(unix.SO_ORIGINAL_DST), unsafe.Pointer(&sa), uint32(unsafe.Sizeof(sa))
		if v6 {
			level, opt, p, size = unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa6), uint32(unsafe.Sizeof(sa6))
		}
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, level, opt, uintptr(p), uintptr(unsafe.Pointer(&size)), 0)
		if e != 0 {
			serr = e
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	if v6 {
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa6.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom16(sa6.Addr), port), nil
	}
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port), nil
}
