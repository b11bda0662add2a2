//go:build linux && amd64

package seccomp

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// run interprets the subset of classic BPF the assembler emits.
func run(t *testing.T, prog []unix.SockFilter, nr int32, arch uint32, arg0 uint64) uint32 {
	t.Helper()
	var data [64]byte
	binary.LittleEndian.PutUint32(data[0:], uint32(nr))
	binary.LittleEndian.PutUint32(data[4:], arch)
	binary.LittleEndian.PutUint64(data[16:], arg0)
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			acc = binary.LittleEndian.Uint32(data[in.K:])
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			pc += int(pick(acc == in.K, in.Jt, in.Jf))
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
	for _, nr := range deniedAMD64 {
		if got := run(t, prog, int32(nr), x86, 0); got != retEPERM {
			t.Errorf("denied syscall %d: got %#x", nr, got)
		}
	}
}

const helperEnv = "SPACE_SECCOMP_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helper())
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
		if got != want {
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

func TestInstall(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if strings.TrimSpace(string(out)) != "DONE" {
		t.Fatalf("helper reported:\n%s", out)
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
