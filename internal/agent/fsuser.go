package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fsUser is who a file request acts as. The zero value is the agent itself.
type fsUser struct {
	name string
	acct account
	// become is set when the request must run with acct's identity rather
	// than the agent's (the agent is root and acct is not).
	become bool
}

// fileUser resolves who a file request acts as: the "user" query parameter,
// else the configured default user (the template's), else the agent itself
// (root). A non-root agent can act only as itself, as with commands.
func (s *Server) fileUser(r *http.Request) (fsUser, error) {
	name := r.URL.Query().Get("user")
	if name == "" {
		name = s.config().User
	}
	if name == "" {
		return fsUser{}, nil
	}
	acct, err := lookupUser(s.opts.etcDir, name)
	if err != nil {
		return fsUser{}, newAPIError(http.StatusBadRequest, CodeUnknownUser, "%v", err)
	}
	euid := os.Geteuid()
	if euid != 0 {
		if int(acct.UID) != euid {
			return fsUser{}, newAPIError(http.StatusForbidden, CodePermissionDenied, "agent is not root and cannot act as %q", truncate(name, 64))
		}
		return fsUser{name: name, acct: acct}, nil
	}
	return fsUser{name: name, acct: acct, become: acct.UID != 0 || acct.GID != 0}, nil
}

// do runs fn with u's identity: on an OS thread of its own whose
// effective uid, gid and supplementary groups are u's, so the kernel checks
// every path fn touches (search permission on each directory, symlinks,
// sticky directories, ownership) as it would for u's commands, and what fn
// creates belongs to u. Only path operations need it: a descriptor opened
// in fn keeps its access after do returns.
//
// Credentials are per thread in Linux (and in gVisor); the raw syscalls
// below change this thread only, where Go's syscall.Setresuid would change
// every thread. A locked thread never runs other goroutines, and the Go
// runtime starts new threads from a clean template thread rather than
// cloning a locked one. A thread whose identity cannot be put back is never
// unlocked, so it exits with its goroutine.
func (u fsUser) do(fn func() error) error {
	if !u.become {
		return u.explain(fn())
	}
	if strconv.IntSize != 64 {
		// 32-bit ABIs take 16-bit ids in these syscall numbers.
		return newAPIError(http.StatusNotImplemented, CodeInternal, "acting as another user is not supported on this architecture")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		egid, groups, err := threadIDs()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("agent: read thread credentials: %w", err)
			return
		}
		restore := func() {
			if setThreadIDs(0, egid, groups) == nil && threadIs(0, egid, groups) {
				runtime.UnlockOSThread()
			}
		}
		if err := setThreadIDs(u.acct.UID, u.acct.GID, u.acct.Groups); err != nil {
			restore()
			errc <- fmt.Errorf("agent: act as %q: %w", u.name, err)
			return
		}
		defer func() {
			if v := recover(); v != nil {
				restore()
				errc <- fmt.Errorf("agent: panic acting as %q: %v", u.name, v)
			}
		}()
		err = fn()
		restore()
		errc <- err
	}()
	return u.explain(<-errc)
}

// explain adds the user to a permission error, so a 403 says whose
// permission was missing.
func (u fsUser) explain(err error) error {
	if err == nil || u.name == "" {
		return err
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && (errno == syscall.EACCES || errno == syscall.EPERM) {
		return &userPermError{err: err, user: u.name}
	}
	return err
}

// userPermError is a permission error met while acting as user; it keeps
// the errno for the status mapping.
type userPermError struct {
	err  error
	user string
}

func (e *userPermError) Error() string {
	var pe *fs.PathError
	if errors.As(e.err, &pe) {
		return fmt.Sprintf("%s %s: %v for user %q", pe.Op, pe.Path, pe.Err, truncate(e.user, 64))
	}
	return fmt.Sprintf("%v (as user %q)", e.err, truncate(e.user, 64))
}

func (e *userPermError) Unwrap() error { return e.err }

// setThreadIDs sets the calling thread's supplementary groups, effective
// gid and effective uid, in that order (the uid last: it drops the
// capabilities the other two need). Real and saved ids stay root's, so
// setting euid 0 again restores the thread's capabilities.
func setThreadIDs(uid, gid uint32, groups []uint32) error {
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	keep := ^uintptr(0) // -1: leave unchanged
	if uid == 0 {
		// Back to root first: the groups and gid need its capabilities.
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
			return e
		}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
		return e
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
		return e
	}
	if uid != 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
			return e
		}
	}
	return nil
}

// threadIDs returns the calling thread's effective gid and groups.
func threadIDs() (uint32, []uint32, error) {
	egid, _, _ := unix.RawSyscall(unix.SYS_GETEGID, 0, 0, 0)
	n, _, e := unix.RawSyscall(unix.SYS_GETGROUPS, 0, 0, 0)
	if e != 0 {
		return 0, nil, e
	}
	groups := make([]uint32, n+1) // +1: never a nil pointer
	n, _, e = unix.RawSyscall(unix.SYS_GETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[0])), 0)
	if e != 0 {
		return 0, nil, e
	}
	return uint32(egid), groups[:n], nil
}

// threadIs reports whether the calling thread has euid uid, egid gid and
// exactly groups.
func threadIs(uid, gid uint32, groups []uint32) bool {
	euid, _, _ := unix.RawSyscall(unix.SYS_GETEUID, 0, 0, 0)
	egid, got, err := threadIDs()
	return err == nil && uint32(euid) == uid && egid == gid && slices.Equal(got, groups)
}
