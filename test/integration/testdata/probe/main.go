// Command probe runs inside a sandbox and tries the escape surface the
// sandbox must deny. It prints one JSON object: probe name → error text
// ("" means the call succeeded).
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func errStr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func main() {
	res := map[string]string{}
	target := ""
	if len(os.Args) > 1 {
		target = os.Args[1]
	}
	os.MkdirAll("/tmp/probe-mnt", 0o755)
	res["mount_tmpfs"] = errStr(unix.Mount("none", "/tmp/probe-mnt", "tmpfs", 0, ""))
	res["mount_proc"] = errStr(unix.Mount("proc", "/tmp/probe-mnt", "proc", 0, ""))
	_, _, e := unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)
	res["init_module"] = errno(e)
	_, _, e = unix.Syscall(unix.SYS_FINIT_MODULE, 0, 0, 0)
	res["finit_module"] = errno(e)
	_, _, e = unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
	res["kexec_load"] = errno(e)
	attr := make([]byte, 128)
	_, _, e = unix.Syscall(unix.SYS_BPF, 0 /* BPF_MAP_CREATE */, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
	res["bpf"] = errno(e)
	_, _, e = unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, uintptr(unsafe.Pointer(&attr[0])), 0, ^uintptr(0), ^uintptr(0), 0, 0)
	res["perf_event_open"] = errno(e)
	_, _, e = unix.Syscall(unix.SYS_KEYCTL, 0, 0, 0)
	res["keyctl"] = errno(e)
	_, _, e = unix.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0)
	res["userfaultfd"] = errno(e)
	res["unshare_user"] = errStr(unix.Unshare(unix.CLONE_NEWUSER))
	res["unshare_mount"] = errStr(unix.Unshare(unix.CLONE_NEWNS))
	_, _, e = unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1, 0, 0, 0, 0)
	res["ptrace_agent"] = errno(e)
	f, err := os.Open("/proc/1/mem")
	if err == nil {
		buf := make([]byte, 1)
		_, err = f.ReadAt(buf, 0x400000)
		f.Close()
	}
	res["read_agent_mem"] = errStr(err)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err == nil {
		unix.Close(fd)
	}
	res["raw_packet_socket"] = errStr(err)
	// Netlink families and interfaces a sandbox has no use for (seccomp,
	// and the user namespace's root lacks CAP_NET_ADMIN).
	for name, proto := range map[string]int{"netlink_netfilter": unix.NETLINK_NETFILTER, "netlink_xfrm": unix.NETLINK_XFRM, "netlink_generic": unix.NETLINK_GENERIC} {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW, proto)
		if err == nil {
			unix.Close(fd)
		}
		res[name] = errStr(err)
	}
	fd, err = unix.Socket(unix.AF_ALG, unix.SOCK_SEQPACKET, 0)
	if err == nil {
		unix.Close(fd)
	}
	res["alg_socket"] = errStr(err)
	res["veth_create"] = errStr(netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"}))
	if lo, err := netlink.LinkByName("lo"); err != nil {
		res["addr_add"] = "lo: " + err.Error()
	} else {
		res["addr_add"] = errStr(netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 9, 9, 9), Mask: net.CIDRMask(32, 32)}}))
	}
	if target != "" {
		c, err := net.DialTimeout("tcp", target, 2*time.Second)
		if err == nil {
			c.Close()
		}
		res["connect_host"] = errStr(err)
	}
	ifs, _ := net.Interfaces()
	names := ""
	for _, i := range ifs {
		names += i.Name + " "
	}
	res["interfaces"] = names
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}

func errno(e unix.Errno) string {
	if e == 0 {
		return ""
	}
	return e.Error()
}
