package fdhygiene

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// leak returns a descriptor without close-on-exec, as a careless parent
// would leave one.
func leak(t *testing.T) int {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "leak")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}

// childFDs lists the descriptors a child process sees.
func childFDs(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ls", "/proc/self/fd").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(out))
}

func TestMarkInherited(t *testing.T) {
	fd := leak(t)
	if !slices.Contains(childFDs(t), strconv.Itoa(fd)) {
		t.Fatalf("precondition: fd %d without close-on-exec should reach a child", fd)
	}
	if err := MarkInherited(); err != nil {
		t.Fatal(err)
	}
	if got := childFDs(t); slices.Contains(got, strconv.Itoa(fd)) {
		t.Fatalf("fd %d still reaches a child after MarkInherited: %v", fd, got)
	}
	// Marked, not closed: the process itself keeps using it.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		t.Fatalf("MarkInherited closed fd %d: %v", fd, err)
	}
}

func TestCloseStrays(t *testing.T) {
	stray := leak(t)
	kept := leak(t)
	f, err := os.Open("/dev/null") // close-on-exec, as the runtime's own are
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	closed, err := CloseStrays(kept)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(closed, stray) || slices.Contains(closed, kept) || slices.Contains(closed, int(f.Fd())) {
		t.Fatalf("closed %v; want %d closed, %d and %d kept", closed, stray, kept, f.Fd())
	}
	if _, err := unix.FcntlInt(uintptr(stray), unix.F_GETFD, 0); err != unix.EBADF {
		t.Fatalf("stray fd %d still open: %v", stray, err)
	}
	if _, err := unix.FcntlInt(uintptr(kept), unix.F_GETFD, 0); err != nil {
		t.Fatalf("kept fd %d: %v", kept, err)
	}
}
