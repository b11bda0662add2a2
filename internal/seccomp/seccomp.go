// Package seccomp builds and installs the syscall filter every sandbox runs
// under. The filter is a hand-assembled classic BPF program: it kills the
// process on a foreign architecture, refuses the x32 ABI, answers EPERM for
// syscalls that reach kernel attack surface a sandbox never needs (modules,
// kexec, bpf, perf, keyrings, ptrace, mount API, namespaces, io_uring, ...)
// and ENOSYS for clone3, whose flags live in memory a filter cannot inspect,
// so libc falls back to clone, whose flags it can. Sockets are limited to the
// families a sandbox uses (unix, IPv4, IPv6, and netlink for routing and
// socket diagnostics only): every other family and netlink protocol gets the
// answer of a kernel built without it. docs/security.md has the table.
package seccomp

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// ErrUnsupported is returned on architectures the filter has no table for.
var ErrUnsupported = errors.New("seccomp: architecture not supported")

// Offsets into struct seccomp_data.
const (
	offNr      = 0
	offArch    = 4
	offArg0Low = 16 // low 32 bits of args[0] (little endian)
	offArg1Low = 24 // low 32 bits of args[1]
	offArg2Low = 32 // low 32 bits of args[2]
)

// Return values.
const (
	retKill   = unix.SECCOMP_RET_KILL_PROCESS
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	// What a kernel without the family or netlink protocol answers, so
	// programs take their "not available here" path (libaudit, for one,
	// treats EPROTONOSUPPORT as "no audit").
	retEAFNOSUPPORT    = unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)
	retEPROTONOSUPPORT = unix.SECCOMP_RET_ERRNO | uint32(unix.EPROTONOSUPPORT)
)

// Socket families a sandbox may open (socket(2)'s first argument; the
// kernel reads it as an int, so the low 32 bits are all of it). Everything
// else (AF_PACKET, AF_ALG, AF_VSOCK, AF_KEY, AF_TIPC, AF_RDS, AF_XDP,
// AF_BLUETOOTH, AF_CAN, ...) is EAFNOSUPPORT: a sandbox has no use for
// them and several have had local privilege-escalation bugs.
var allowedFamilies = []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}

// Netlink protocols a sandbox may open: rtnetlink (`ip addr`, getifaddrs,
// Go's net.Interfaces; writes need CAP_NET_ADMIN, which commands lack) and
// sock_diag (`ss`). NETLINK_NETFILTER (nf_tables), XFRM, GENERIC, AUDIT,
// KOBJECT_UEVENT, CONNECTOR, RDMA, CRYPTO, ... are EPROTONOSUPPORT.
var allowedNetlink = []uint32{unix.NETLINK_ROUTE, unix.NETLINK_SOCK_DIAG}

// x32 syscalls carry this bit in their number on x86_64.
const x32SyscallBit = 0x40000000

// cloneNewMask is every CLONE_NEW* flag that fits clone(2)'s flags word
// (CLONE_NEWTIME overlaps the exit-signal byte and is only usable through
// clone3/unshare, both refused outright).
const cloneNewMask = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// Personalities a sandbox may select: the ones Docker's default profile
// allows (PER_LINUX, PER_LINUX32, UNAME26 and their mix) plus the query value.
var allowedPersonalities = []uint32{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// table is what one architecture contributes to the filter.
type table struct {
	auditArch   uint32
	x32Bit      uint32 // 0 when the arch has no x32-style alias ABI
	clone       uint32
	clone3      uint32
	personality uint32
	socket      uint32
	socketpair  uint32
	denied      []uint32 // answered with EPERM
	// For SignalGuard: syscalls whose target id is args[0] and signal
	// args[1] (sig1) or args[2] (sig2), and pidfd_open.
	signalSig1, signalSig2 []uint32
	pidfdOpen              uint32
}

// Filter returns the filter program for the running architecture.
func Filter() ([]unix.SockFilter, error) {
	t, ok := nativeTable()
	if !ok {
		return nil, ErrUnsupported
	}
	return build(t)
}

// build assembles the program:
//
//	arch != native            → KILL_PROCESS
//	nr has the x32 bit        → EPERM
//	clone with CLONE_NEW*     → EPERM
//	clone3                    → ENOSYS
//	personality(not allowed)  → EPERM
//	socket(family not allowed)      → EAFNOSUPPORT
//	socket(AF_NETLINK, not allowed) → EPROTONOSUPPORT
//	socketpair(not AF_UNIX)         → EAFNOSUPPORT
//	nr in denied              → EPERM
//	otherwise                 → ALLOW
func build(t table) ([]unix.SockFilter, error) {
	var a assembler
	a.ld(offArch)
	a.jeq(t.auditArch, "", "kill")
	a.ld(offNr)
	if t.x32Bit != 0 {
		a.jset(t.x32Bit, "eperm", "")
	}
	a.jeq(t.clone, "clone", "")
	a.jeq(t.clone3, "enosys", "")
	a.jeq(t.personality, "personality", "")
	a.jeq(t.socket, "socket", "")
	a.jeq(t.socketpair, "socketpair", "")
	for _, nr := range t.denied {
		a.jeq(nr, "eperm", "")
	}
	a.ret(retAllow)

	a.label("clone")
	a.ld(offArg0Low)
	a.jset(cloneNewMask, "eperm", "allow")

	a.label("socket")
	a.ld(offArg0Low)
	for _, f := range allowedFamilies {
		a.jeq(f, "allow", "")
	}
	a.jeq(unix.AF_NETLINK, "", "eafnosupport")
	a.ld(offArg2Low)
	for _, p := range allowedNetlink {
		a.jeq(p, "allow", "")
	}
	a.ret(retEPROTONOSUPPORT)

	a.label("socketpair")
	a.ld(offArg0Low)
	a.jeq(unix.AF_UNIX, "allow", "eafnosupport")

	a.label("personality")
	a.ld(offArg0Low)
	for _, p := range allowedPersonalities {
		a.jeq(p, "allow", "")
	}
	a.label("eperm")
	a.ret(retEPERM)
	a.label("allow")
	a.ret(retAllow)
	a.label("enosys")
	a.ret(retENOSYS)
	a.label("eafnosupport")
	a.ret(retEAFNOSUPPORT)
	a.label("kill")
	a.ret(retKill)
	return a.assemble()
}

// assembler is a tiny classic-BPF assembler with forward-only labels; ""
// as a jump target means "next instruction".
type assembler struct {
	ins    []insn
	labels map[string]int
}

type insn struct {
	code   uint16
	k      uint32
	jt, jf string
}

func (a *assembler) ld(off uint32) {
	a.ins = append(a.ins, insn{code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, k: off})
}

func (a *assembler) jeq(k uint32, jt, jf string) {
	a.ins = append(a.ins, insn{code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, k: k, jt: jt, jf: jf})
}

func (a *assembler) jge(k uint32, jt, jf string) {
	a.ins = append(a.ins, insn{code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, k: k, jt: jt, jf: jf})
}

func (a *assembler) jset(k uint32, jt, jf string) {
	a.ins = append(a.ins, insn{code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, k: k, jt: jt, jf: jf})
}

func (a *assembler) ret(k uint32) {
	a.ins = append(a.ins, insn{code: unix.BPF_RET | unix.BPF_K, k: k})
}

func (a *assembler) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.ins)
}

func (a *assembler) assemble() ([]unix.SockFilter, error) {
	if len(a.ins) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program too long (%d instructions)", len(a.ins))
	}
	out := make([]unix.SockFilter, len(a.ins))
	for i, in := range a.ins {
		jt, err := a.offset(i, in.jt)
		if err != nil {
			return nil, err
		}
		jf, err := a.offset(i, in.jf)
		if err != nil {
			return nil, err
		}
		out[i] = unix.SockFilter{Code: in.code, K: in.k, Jt: jt, Jf: jf}
	}
	return out, nil
}

func (a *assembler) offset(from int, label string) (uint8, error) {
	if label == "" {
		return 0, nil
	}
	to, ok := a.labels[label]
	if !ok {
		return 0, fmt.Errorf("seccomp: undefined label %q", label)
	}
	d := to - from - 1
	if d < 0 || d > 255 {
		return 0, fmt.Errorf("seccomp: jump to %q out of range (%d)", label, d)
	}
	return uint8(d), nil
}
