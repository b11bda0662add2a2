//go:build linux && amd64

package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// run interprets the subset of classic BPF the assembler emits.
func run(t *testing.T, prog []unix.SockFilter, nr int32, arch uint32, args ...uint64) uint32 {
	t.Helper()
	var data [64]byte
	binary.LittleEndian.PutUint32(data[0:], uint32(nr))
	binary.LittleEndian.PutUint32(data[4:], arch)
	for i, a := range args {
		binary.LittleEndian.PutUint64(data[16+8*i:], a)
	}
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			acc = binary.LittleEndian.Uint32(data[in.K:])
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			pc += int(pick(acc == in.K, in.Jt, in.Jf))
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			pc += int(pick(acc >= in.K, in.Jt, in.Jf))
		case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			pc += int(pick(acc&in.K != 0, in.Jt, in.Jf))
		case unix.BPF_RET | unix.BPF_K:
			return in.K
		default:
			t.Fatalf("unexpected opcode %#x at %d", in.Code, pc)
		}
	}
	t.Fatal("program fell off the end")
	return 0
}

func pick(c bool, a, b uint8) uint8 {
	if c {
		return a
	}
	return b
}

func TestFilterDecisions(t *testing.T) {
	prog, err := Filter()
	if err != nil {
		t.Fatal(err)
	}
	const x86 = unix.AUDIT_ARCH_X86_64
	cases := []struct {
		name string
		nr   int32
		arch uint32
		arg0 uint64
		want uint32
	}{
		{"read", unix.SYS_READ, x86, 0, retAllow},
		{"execve", unix.SYS_EXECVE, x86, 0, retAllow},
		{"wrong arch", unix.SYS_READ, unix.AUDIT_ARCH_I386, 0, retKill},
		{"x32 read", x32SyscallBit | unix.SYS_READ, x86, 0, retEPERM},
		{"mount", unix.SYS_MOUNT, x86, 0, retEPERM},
		{"unshare", unix.SYS_UNSHARE, x86, 0, retEPERM},
		{"bpf", unix.SYS_BPF, x86, 0, retEPERM},
		{"keyctl", unix.SYS_KEYCTL, x86, 0, retEPERM},
		{"ptrace", unix.SYS_PTRACE, x86, 0, retEPERM},
		{"io_uring_setup", unix.SYS_IO_URING_SETUP, x86, 0, retEPERM},
		{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, x86, 0, retEPERM},
		{"clone3", unix.SYS_CLONE3, x86, 0, retENOSYS},
		{"clone fork", unix.SYS_CLONE, x86, uint64(unix.SIGCHLD), retAllow},
		{"clone thread", unix.SYS_CLONE, x86, unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES |
			unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM, retAllow},
		{"clone newuser", unix.SYS_CLONE, x86, unix.CLONE_NEWUSER | uint64(unix.SIGCHLD), retEPERM},
		{"clone newns", unix.SYS_CLONE, x86, unix.CLONE_NEWNS, retEPERM},
		{"clone newnet", unix.SYS_CLONE, x86, unix.CLONE_NEWNET, retEPERM},
		{"personality linux", unix.SYS_PERSONALITY, x86, 0, retAllow},
		{"personality query", unix.SYS_PERSONALITY, x86, 0xffffffff, retAllow},
		{"personality addr_no_randomize", unix.SYS_PERSONALITY, x86, 0x0040000, retEPERM},
	}
	for _, c := range cases {
		if got := run(t, prog, c.nr, c.arch, c.arg0); got != c.want {
			t.Errorf("%s: got %#x, want %#x", c.name, got, c.want)
		}
	}
	// socket(family, type, protocol) and socketpair(family, ...).
	sockets := []struct {
		name                  string
		nr                    int32
		family, typ, protocol uint64
		want                  uint32
	}{
		{"unix", unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0, retAllow},
		{"tcp", unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, 0, retAllow},
		{"udp6", unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_DGRAM, 0, retAllow},
		{"icmp ping", unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP, retAllow},
		{"rtnetlink", unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE, retAllow},
		{"sock_diag", unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_SOCK_DIAG, retAllow},
		{"netfilter", unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER, retEPROTONOSUPPORT},
		{"xfrm", unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_XFRM, retEPROTONOSUPPORT},
		{"generic", unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC, retEPROTONOSUPPORT},
		{"audit", unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT, retEPROTONOSUPPORT},
		{"uevent", unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT, retEPROTONOSUPPORT},
		// The kernel reads int arguments: high bits do not smuggle a family or protocol through.
		{"netfilter high bits", unix.SYS_SOCKET, 1<<32 | unix.AF_NETLINK, unix.SOCK_RAW, 1<<32 | unix.NETLINK_NETFILTER, retEPROTONOSUPPORT},
		{"packet", unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW, 0x0300, retEAFNOSUPPORT},
		{"alg", unix.SYS_SOCKET, unix.AF_ALG, unix.SOCK_SEQPACKET, 0, retEAFNOSUPPORT},
		{"vsock", unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0, retEAFNOSUPPORT},
		{"tipc", unix.SYS_SOCKET, unix.AF_TIPC, unix.SOCK_RDM, 0, retEAFNOSUPPORT},
		{"key", unix.SYS_SOCKET, unix.AF_KEY, unix.SOCK_RAW, 2, retEAFNOSUPPORT},
		{"socketpair unix", unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM, 0, retAllow},
		{"socketpair tipc", unix.SYS_SOCKETPAIR, unix.AF_TIPC, unix.SOCK_STREAM, 0, retEAFNOSUPPORT},
	}
	for _, c := range sockets {
		if got := run(t, prog, c.nr, x86, c.family, c.typ, c.protocol); got != c.want {
			t.Errorf("socket %s: got %#x, want %#x", c.name, got, c.want)
		}
	}
	for _, nr := range deniedAMD64 {
		if got := run(t, prog, int32(nr), x86, 0); got != retEPERM {
			t.Errorf("denied syscall %d: got %#x", nr, got)
		}
	}
}

func TestSignalGuardDecisions(t *testing.T) {
	const fence = 10
	prog, err := SignalGuard(fence)
	if err != nil {
		t.Fatal(err)
	}
	const x86 = unix.AUDIT_ARCH_X86_64
	kill9, urg := uint64(unix.SIGKILL), uint64(unix.SIGURG)
	cases := []struct {
		name string
		nr   int32
		args []uint64
		want uint32
	}{
		{"kill -9 1", unix.SYS_KILL, []uint64{1, kill9}, retEPERM},
		{"kill -TERM 1", unix.SYS_KILL, []uint64{1, uint64(unix.SIGTERM)}, retEPERM},
		{"kill -9 agent thread", unix.SYS_KILL, []uint64{fence - 1, kill9}, retEPERM},
		{"kill -0 1", unix.SYS_KILL, []uint64{1, 0}, retAllow},
		{"kill -9 command", unix.SYS_KILL, []uint64{fence, kill9}, retAllow},
		{"kill -9 -1", unix.SYS_KILL, []uint64{0xffffffff, kill9}, retAllow},
		{"kill -9 0", unix.SYS_KILL, []uint64{0, kill9}, retAllow},
		{"kill -9 -pgid", unix.SYS_KILL, []uint64{uint64(uint32(0xffffffff - 20)), kill9}, retAllow},
		// The kernel reads an int: high bits do not move the target.
		{"kill -9 1 high bits", unix.SYS_KILL, []uint64{1<<32 | 1, kill9}, retEPERM},
		{"tkill agent thread", unix.SYS_TKILL, []uint64{3, kill9}, retEPERM},
		{"tgkill agent", unix.SYS_TGKILL, []uint64{1, 3, kill9}, retEPERM},
		{"tgkill SIGURG (Go preemption)", unix.SYS_TGKILL, []uint64{1, 3, urg}, retAllow},
		{"tgkill command", unix.SYS_TGKILL, []uint64{fence + 5, fence + 5, kill9}, retAllow},
		{"rt_sigqueueinfo agent", unix.SYS_RT_SIGQUEUEINFO, []uint64{1, kill9}, retEPERM},
		{"rt_tgsigqueueinfo agent", unix.SYS_RT_TGSIGQUEUEINFO, []uint64{1, 1, kill9}, retEPERM},
		{"pidfd_open agent", unix.SYS_PIDFD_OPEN, []uint64{1}, retEPERM},
		{"pidfd_open command", unix.SYS_PIDFD_OPEN, []uint64{fence}, retAllow},
		{"read", unix.SYS_READ, nil, retAllow},
		{"mount (gVisor's answer)", unix.SYS_MOUNT, nil, retAllow},
	}
	for _, c := range cases {
		if got := run(t, prog, c.nr, x86, c.args...); got != c.want {
			t.Errorf("%s: got %#x, want %#x", c.name, got, c.want)
		}
	}
}

const (
	helperEnv = "SPACE_SECCOMP_TEST_HELPER"
	guardEnv  = "SPACE_SECCOMP_TEST_GUARD"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helper())
	}
	if os.Getenv(guardEnv) == "1" {
		os.Exit(guardHelper())
	}
	os.Exit(m.Run())
}

// helper runs in a re-executed test binary: it installs the filter and then
// probes the kernel. Each failed expectation is one line on stdout.
func helper() int {
	if err := Install(); err != nil {
		fmt.Println("install:", err)
		return 1
	}
	expect := func(name string, got, want error) {
		if !errors.Is(got, want) && got != want {
			fmt.Printf("%s: got %v, want %v\n", name, got, want)
		}
	}
	expect("mount", unix.Mount("none", "/tmp", "tmpfs", 0, ""), unix.EPERM)
	expect("unshare", unix.Unshare(unix.CLONE_NEWUSER), unix.EPERM)
	expect("setns", unix.Setns(0, 0), unix.EPERM)
	_, _, e := unix.Syscall(unix.SYS_BPF, 0, 0, 0)
	expect("bpf", e, unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_KEYCTL, 0, 0, 0)
	expect("keyctl", e, unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)
	expect("ptrace", e, unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
	expect("clone3", e, unix.ENOSYS)
	_, _, e = unix.RawSyscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0)
	expect("x32 getpid", e, unix.EPERM)
	_, _, e = unix.RawSyscall(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), 0, 0)
	expect("clone newuser", e, unix.EPERM)
	sock := func(name string, family, typ, proto int, want error) {
		fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, proto)
		if err == nil {
			unix.Close(fd)
		}
		expect(name, err, want)
	}
	sock("netlink netfilter", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER, unix.EPROTONOSUPPORT)
	sock("netlink xfrm", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_XFRM, unix.EPROTONOSUPPORT)
	sock("netlink generic", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC, unix.EPROTONOSUPPORT)
	sock("packet", unix.AF_PACKET, unix.SOCK_DGRAM, 0, unix.EAFNOSUPPORT)
	sock("alg", unix.AF_ALG, unix.SOCK_SEQPACKET, 0, unix.EAFNOSUPPORT)
	sock("rtnetlink", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE, nil)
	sock("tcp", unix.AF_INET, unix.SOCK_STREAM, 0, nil)
	sock("unix", unix.AF_UNIX, unix.SOCK_STREAM, 0, nil)
	if _, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
		fmt.Println("socketpair unix:", err)
	}
	// Reading rtnetlink still works (what `ip addr` does).
	if _, err := net.Interfaces(); err != nil {
		fmt.Println("rtnetlink dump:", err)
	}
	if err := Verify(); err != nil {
		fmt.Println("verify:", err)
	}
	if v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil || v != 1 {
		fmt.Println("no_new_privs not set:", v, err)
	}
	// Fork+exec must keep working, from Go (clone) and from a libc program
	// (which tries clone3 first and falls back on ENOSYS).
	if out, err := exec.Command("/bin/sh", "-c", "echo ok | cat").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
		fmt.Printf("fork+exec: %v %q\n", err, out)
	}
	// Child processes inherit the filter.
	if out, err := exec.Command("/bin/sh", "-c", "unshare -U true 2>&1; echo rc=$?").CombinedOutput(); err != nil || !strings.Contains(string(out), "rc=1") {
		fmt.Printf("inherited filter: %v %q\n", err, out)
	}
	fmt.Println("DONE")
	return 0
}

func TestInstall(t *testing.T) { runHelper(t, helperEnv) }

// runHelper re-executes the test binary with env set; the helper prints
// DONE, or one line per failed expectation.
func runHelper(t *testing.T, env string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "DONE" {
		t.Fatalf("helper: %v\n%s", err, out)
	}
}

func TestProgramFitsJumps(t *testing.T) {
	// The kernel rejects programs longer than BPF_MAXINSNS; keep ours small.
	prog, err := Filter()
	if err != nil {
		t.Fatal(err)
	}
	if len(prog) > 128 {
		t.Fatalf("filter has %d instructions", len(prog))
	}
}

// TestVerifyWithoutFilter: the check after Install can fail. This test
// process has no filter, so Verify must say so.
func TestVerifyWithoutFilter(t *testing.T) {
	if err := Verify(); err == nil {
		t.Fatal("Verify passed in a process without a seccomp filter")
	}
}

// guardHelper installs the signal guard with the fence at its own pid, so
// every lower pid (host init included) is refused and its children are not.
func guardHelper() int {
	if err := InstallSignalGuard(uint32(os.Getpid())); err != nil {
		fmt.Println("install:", err)
		return 1
	}
	if err := unix.Kill(1, unix.SIGCONT); err != unix.EPERM {
		fmt.Println("kill -CONT 1:", err)
	}
	if err := unix.Kill(1, 0); err != nil {
		fmt.Println("kill -0 1:", err)
	}
	if _, err := unix.PidfdOpen(1, 0); err != unix.EPERM {
		fmt.Println("pidfd_open 1:", err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		fmt.Println("start:", err)
		return 1
	}
	if err := cmd.Process.Kill(); err != nil {
		fmt.Println("kill child:", err)
	}
	_ = cmd.Wait()
	// A child inherits the guard.
	if out, _ := exec.Command("/bin/sh", "-c", "kill -CONT 1 2>&1; echo rc=$?").CombinedOutput(); !strings.Contains(string(out), "rc=1") {
		fmt.Printf("child kill -CONT 1: %q\n", out)
	}
	if err := Verify(); err != nil {
		fmt.Println("verify:", err)
	}
	fmt.Println("DONE")
	return 0
}

func TestSignalGuardInstall(t *testing.T) { runHelper(t, guardEnv) }
