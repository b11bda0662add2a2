package agent

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"github.com/space-sandbox/space/internal/seccomp"
	"github.com/space-sandbox/space/internal/threadstatus"
	"golang.org/x/sys/unix"
)

// Capabilities the agent takes out of the bounding set of every thread, so
// no command it starts can hold them, whatever its uid or file capabilities:
//   - CAP_SYS_PTRACE: with it sandbox root could ptrace the agent or open
//     its /proc/1/mem, environ and descriptors, non-dumpable or not;
//   - CAP_NET_RAW: raw and packet sockets are the spoofing and sniffing
//     tool and nothing a sandbox should do needs them (ping uses ICMP
//     datagram sockets);
//   - CAP_NET_ADMIN (namespace sandboxes only): root in the sandbox's user
//     namespace otherwise administers its own network namespace, which
//     opens nf_tables, link creation (veth, tunnels), qdiscs and xfrm,
//     the kernel surface of most recent user-namespace escalations. A VM
//     guest keeps it: its kernel is the guest's own and its commands
//     configure the guest's link.
var (
	namespaceDrops = []uintptr{unix.CAP_SYS_PTRACE, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN}
	vmDrops        = []uintptr{unix.CAP_SYS_PTRACE, unix.CAP_NET_RAW}
)

// ErrCgoBuild is the failure of a hardening step that needs a binary built
// with CGO_ENABLED=0: syscall.AllThreadsSyscall, which applies a change to
// every thread of the process, refuses with ENOTSUP when cgo is linked in
// (C code may have made threads the Go runtime cannot reach).
var ErrCgoBuild = errors.New("agent built with cgo: a capability cannot be dropped on every thread (build it with CGO_ENABLED=0)")

// HardenSelf makes the agent, running as PID 1 of a namespace-driver
// sandbox, hard for the sandbox to attack, and checks that every step took
// effect: it fails, and the sandbox must not serve, if one did not. Call it
// before installing the seccomp filter (sandboxinit runs it first thing).
//
//   - The usual termination signals (terminationSignals) get the kernel's
//     default disposition back from the Go runtime, whose handler would
//     exit on them: the kernel does not deliver a signal without a handler
//     to a PID namespace's init at all (SIGKILL and SIGSTOP from outside
//     only), so root in the sandbox cannot stop the agent with kill(1),
//     nor can a hangup or a broken pipe. A default disposition is what
//     commands should start with, and they do (an ignored one would
//     survive fork and exec: every command would start with SIGTERM and
//     SIGPIPE ignored, breaking `kill`, `yes | head`, ...). This used to be
//     signal.Notify, which costs the runtime a thread and a round trip to
//     it per signal (0.1-2.9 ms of a cold create, issue 25).
//   - The agent is made non-dumpable, so sandbox processes cannot read its
//     memory through /proc/1/mem or ptrace it.
//   - CAP_SYS_PTRACE, CAP_NET_RAW and CAP_NET_ADMIN leave the capability
//     bounding set of every thread (namespaceDrops).
func HardenSelf() error { return harden(namespaceDrops) }

// HardenVM is HardenSelf for the agent as PID 1 of a VM guest: the same,
// except that commands keep CAP_NET_ADMIN over the guest's own kernel.
func HardenVM() error { return harden(vmDrops) }

// terminationSignals are what sandbox root could stop PID 1 with, had it
// a handler that exits.
var terminationSignals = []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP,
	syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE}

// catchSignals catches and discards the usual termination signals, for an
// agent that is not a PID namespace's init (gVisor's; see HardenSelf for
// why Notify and not Ignore).
func catchSignals() {
	// A full buffer drops signals; nobody reads this channel by design.
	sigs := make([]os.Signal, len(terminationSignals))
	for i, s := range terminationSignals {
		sigs[i] = s
	}
	signal.Notify(make(chan os.Signal, 1), sigs...)
}

// defaultSignals sets terminationSignals to SIG_DFL in the kernel, for the
// whole process, beneath the Go runtime (which installed its handler for
// each at start and is not told: nothing in the agent asks it for these
// signals again). verifyHardened reads the result back.
func defaultSignals() error {
	var act [4]uint64 // struct sigaction, zero: SIG_DFL, no flags, empty mask
	for _, s := range terminationSignals {
		if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(s),
			uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); errno != 0 {
			return fmt.Errorf("agent: default disposition of %v: %w", s, errno)
		}
	}
	return nil
}

// gvisorReservedThreads is how many OS threads the agent makes before its
// signal guard goes up under gVisor: the guard covers the thread ids that
// exist then, so the more of its threads the agent has made, the fewer it
// makes later outside the guard.
const gvisorReservedThreads = 16

// HardenGVisor protects the agent as PID 1 of a gVisor sandbox, whose
// kernel, unlike Linux, delivers SIGKILL from inside a PID namespace to its
// init (`kill -9 1` would end the sandbox). The agent makes its threads
// up front, then installs seccomp.SignalGuard with the fence just above
// the highest thread id it has: signals (but SIGURG and 0) and pidfd_open
// aimed below the fence are refused, for the agent and every command it
// starts, whose ids are all higher. A thread the Go runtime makes later
// gets an id above the fence and is not covered (docs/security.md). Run
// outside a PID namespace (development on a host) it does nothing.
// Capabilities need no dropping here: the container's are set by the
// driver (gvisor.caps).
func HardenGVisor() error {
	if os.Getpid() != 1 {
		return nil
	}
	catchSignals()
	reserveThreads(gvisorReservedThreads)
	// The fence needs the thread ids only: the listing, not every
	// thread's status file (about a millisecond each in gVisor).
	tids, err := threadstatus.TIDs()
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	var fence uint64
	for _, tid := range tids {
		n, err := strconv.ParseUint(tid, 10, 32)
		if err != nil {
			return fmt.Errorf("agent: thread id %q: %w", tid, err)
		}
		fence = max(fence, n+1)
	}
	if err := seccomp.InstallSignalGuard(uint32(fence)); err != nil {
		return fmt.Errorf("agent: signal guard: %w", err)
	}
	return nil
}

func harden(drops []uintptr) error {
	if err := defaultSignals(); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("agent: prctl(PR_SET_DUMPABLE): %w", err)
	}
	for _, c := range drops {
		_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0)
		if errno == syscall.ENOTSUP {
			return fmt.Errorf("agent: drop capability %d from the bounding set: %w", c, ErrCgoBuild)
		}
		if errno != 0 {
			return fmt.Errorf("agent: drop capability %d from the bounding set: %w", c, errno)
		}
	}
	if err := verifyHardened(drops); err != nil {
		return err
	}
	// In the background: it takes a few milliseconds that sandbox start-up
	// should not wait for.
	go reserveThreads(reservedThreads)
	return nil
}

// verifyHardened reads back what harden did, from the kernel's view of
// every thread: nothing is taken on trust from the calls' results.
func verifyHardened(drops []uintptr) error {
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		return fmt.Errorf("agent: still dumpable after PR_SET_DUMPABLE 0 (%d, %v)", d, err)
	}
	var mask, sigs uint64
	for _, c := range drops {
		mask |= 1 << c
	}
	for _, s := range terminationSignals {
		sigs |= 1 << (s - 1)
	}
	return threadstatus.Each([]string{"CapBnd", "CapInh", "CapAmb", "SigCgt", "SigIgn"}, func(tid string, st map[string]string) error {
		for _, key := range []string{"SigCgt", "SigIgn"} {
			v, err := threadstatus.Hex(st, key)
			if err != nil {
				return fmt.Errorf("agent: thread %s: %w", tid, err)
			}
			if v&sigs != 0 {
				return fmt.Errorf("agent: thread %s: signals %#x still in %s after resetting them to the default", tid, v&sigs, key)
			}
		}
		for _, key := range []string{"CapBnd", "CapInh", "CapAmb"} {
			v, err := threadstatus.Hex(st, key)
			if err != nil {
				return fmt.Errorf("agent: thread %s: %w", tid, err)
			}
			if v&mask != 0 {
				return fmt.Errorf("agent: thread %s still has capabilities %#x in %s after dropping them", tid, v&mask, key)
			}
		}
		return nil
	})
}

// reservedThreads is how many OS threads the agent creates up front.
const reservedThreads = 4

// reserveThreads makes the Go runtime create n OS threads now and keep them
// idle. The agent shares the sandbox's pids limit with its commands: under a
// fork bomb no new thread can be made, and a Go program that cannot get a
// thread when it needs one dies. Threads parked by the runtime are reused,
// never freed, so this is the agent's reserve.
func reserveThreads(n int) {
	// Each goroutine locks itself to its thread and waits there: a locked
	// thread runs nothing else, so the runtime starts a new thread for
	// the next goroutine at once (a sleeping syscall instead waits for
	// the runtime's monitor to notice, tens of ms in gVisor). Unlocked
	// before they return, the threads stay as the runtime's idle ones.
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	for i := 0; i < n; i++ {
		locked.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
	done.Wait()
}
