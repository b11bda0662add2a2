package seccomp

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/space-sandbox/space/internal/threadstatus"
	"golang.org/x/sys/unix"
)

// Install sets no_new_privs and installs the filter on every thread of the
// calling process (SECCOMP_FILTER_FLAG_TSYNC also carries no_new_privs to
// the other threads). It cannot be undone; every process started afterwards
// inherits it.
func Install() error {
	filter, err := Filter()
	if err != nil {
		return err
	}
	return install(filter)
}

// InstallSignalGuard installs SignalGuard(fence) as Install does.
func InstallSignalGuard(fence uint32) error {
	filter, err := SignalGuard(fence)
	if err != nil {
		return err
	}
	return install(filter)
}

func install(filter []unix.SockFilter) error {
	// prctl and seccomp must run on the same thread: no_new_privs is per task.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: set no_new_privs: %w", err)
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("seccomp: install filter: %w", errno)
	}
	if r != 0 {
		// With TSYNC a positive result is the id of a thread that could not
		// be synchronised; nothing was installed.
		return fmt.Errorf("seccomp: thread %d could not be synchronised", r)
	}
	return Verify()
}

// Verify checks, in the kernel's view of every thread of the process, that
// no_new_privs is set and a seccomp filter is installed: Install is not
// taken on trust.
func Verify() error {
	return threadstatus.Each([]string{"NoNewPrivs", "Seccomp"}, func(tid string, st map[string]string) error {
		if st["NoNewPrivs"] != "1" || st["Seccomp"] != "2" {
			return fmt.Errorf("seccomp: thread %s runs with NoNewPrivs %q, Seccomp %q after install, want 1 and 2 (filter)",
				tid, st["NoNewPrivs"], st["Seccomp"])
		}
		return nil
	})
}
