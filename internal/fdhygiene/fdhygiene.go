// Package fdhygiene keeps descriptors from crossing into sandboxes by
// accident.
//
// A process inherits every descriptor its parent held without
// close-on-exec: a supervisor, shell or CI runner that leaks one would hand
// a host file, pipe or socket to every sandbox the server starts. Two
// layers stop that: the server and the node mark everything they inherit
// close-on-exec at start (MarkInherited), and a sandbox's first process
// closes whatever still reached it that it was not meant to have
// (CloseStrays).
package fdhygiene

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// MarkInherited sets close-on-exec on every descriptor from 3 up. Call it
// first thing in a long-running host process: descriptors it opens itself
// are close-on-exec already (Go opens everything with O_CLOEXEC), and
// os/exec clears the flag only on the ExtraFiles it passes on purpose.
func MarkInherited() error {
	err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	// Kernels before 5.11 lack CLOSE_RANGE_CLOEXEC: flag each one.
	fds, lerr := list()
	if lerr != nil {
		return fmt.Errorf("fdhygiene: close_range: %v; list: %w", err, lerr)
	}
	for _, fd := range fds {
		if fd < 3 {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && err != unix.EBADF {
			return fmt.Errorf("fdhygiene: mark %d: %w", fd, err)
		}
	}
	return nil
}

// CloseStrays closes every descriptor from 3 up that is not in keep and
// does not have close-on-exec set, and returns the numbers it closed.
//
// Right after exec, a descriptor without close-on-exec can only have come
// from the parent; the Go runtime's own (epoll, pipes, the binary's memfd)
// carry O_CLOEXEC, so they are left alone. Call it early in a sandbox's
// first process, before anything else opens files.
func CloseStrays(keep ...int) ([]int, error) {
	fds, err := list()
	if err != nil {
		return nil, err
	}
	var closed []int
next:
	for _, fd := range fds {
		if fd < 3 {
			continue
		}
		for _, k := range keep {
			if fd == k {
				continue next
			}
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil {
			continue // closed since the listing (the listing's own fd)
		}
		if flags&unix.FD_CLOEXEC != 0 {
			continue
		}
		if err := unix.Close(fd); err != nil {
			return closed, fmt.Errorf("fdhygiene: close %d: %w", fd, err)
		}
		closed = append(closed, fd)
	}
	return closed, nil
}

// list returns the process's open descriptors. The directory's own
// descriptor is in the listing but closed by the time the caller looks.
func list() ([]int, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("fdhygiene: %w", err)
	}
	names, err := d.Readdirnames(-1)
	_ = d.Close()
	if err != nil {
		return nil, fmt.Errorf("fdhygiene: %w", err)
	}
	fds := make([]int, 0, len(names))
	for _, n := range names {
		if fd, err := strconv.Atoi(n); err == nil {
			fds = append(fds, fd)
		}
	}
	return fds, nil
}
