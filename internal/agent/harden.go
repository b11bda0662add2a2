package agent

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// HardenSelf makes the agent, running as PID 1 of a sandbox, hard for the
// sandbox to attack. Call it right before Serve.
//
//   - The usual termination signals are caught and discarded, so root in
//     the sandbox cannot stop the agent with kill(1). They are caught with
//     signal.Notify rather than signal.Ignore on purpose: an ignored
//     disposition survives fork and exec, so every command would start with
//     SIGTERM and SIGPIPE ignored (breaking `kill`, `yes | head`, ...),
//     while a caught signal is reset to the default in the child. (Signals
//     without a handler are not delivered to a namespace's init from inside
//     the namespace anyway; SIGKILL and SIGSTOP never are.)
//   - The agent is made non-dumpable, so sandbox processes cannot read its
//     memory through /proc/1/mem or ptrace it.
//   - CAP_SYS_PTRACE and CAP_NET_RAW leave the capability bounding set of every thread, so
//     no command the agent starts can gain it. This needs a binary built
//     with CGO_ENABLED=0 (syscall.AllThreadsSyscall refuses with ENOTSUP
//     under cgo); in a cgo build the step is skipped without an error.
func HardenSelf() error {
	// A full buffer drops signals; nobody reads this channel by design.
	signal.Notify(make(chan os.Signal, 1),
		syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("agent: prctl(PR_SET_DUMPABLE): %w", err)
	}
	// CAP_NET_RAW goes too: raw and packet sockets are the classic tool for
	// spoofing and sniffing, and nothing a sandbox should do needs them.
	for _, c := range []uintptr{unix.CAP_SYS_PTRACE, unix.CAP_NET_RAW} {
		_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0)
		if errno != 0 && !errors.Is(errno, syscall.ENOTSUP) {
			return fmt.Errorf("agent: drop capability %d from the bounding set: %w", c, errno)
		}
	}
	// In the background: it takes a few milliseconds that sandbox start-up
	// should not wait for.
	go reserveThreads(reservedThreads)
	return nil
}

// reservedThreads is how many OS threads the agent creates up front.
const reservedThreads = 4

// reserveThreads makes the Go runtime create n OS threads now and keep them
// idle. The agent shares the sandbox's pids limit with its commands: under a
// fork bomb no new thread can be made, and a Go program that cannot get a
// thread when it needs one dies. Threads parked by the runtime are reused,
// never freed, so this is the agent's reserve.
func reserveThreads(n int) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A blocking syscall pins its thread; the scheduler starts
			// another for the goroutines still waiting to run.
			ts := unix.NsecToTimespec(int64(20 * time.Millisecond))
			unix.Nanosleep(&ts, nil)
		}()
	}
	wg.Wait()
}
