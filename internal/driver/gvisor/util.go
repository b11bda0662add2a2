package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// procStartTime returns field 22 of /proc/<pid>/stat, which with the pid
// identifies a process across pid reuse.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// isZombie reports whether pid has exited but is not reaped yet (its
// parent, often the host's init, reaps it when it gets to it).
func isZombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

func killPid(pid int) error { return unix.Kill(pid, unix.SIGKILL) }

// logTail quotes the last 2 KiB of the log at path, reading no more.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 2048)
	off := int64(0)
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(len(b)) {
		off = fi.Size() - int64(len(b))
	}
	n, _ := f.ReadAt(b, off)
	b = b[:n]
	if len(b) == 0 {
		return ""
	}
	return "; " + filepath.Base(path) + ": " + strings.TrimSpace(string(b))
}

func splitLines(s string) []string  { return strings.Split(strings.TrimSpace(s), "\n") }
func splitFields(s string) []string { return strings.Fields(s) }

// unescapeOctal undoes mountinfo's \ooo escapes.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeOtherCgroupDirs removes (rmdir only: never a non-empty group) the
// dirs runsc made for id in every cgroup hierarchy: <mount>/<own path>/
// <base>/<id> for each of this process's cgroup paths.
func removeOtherCgroupDirs(base, id string) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return
	}
	own := map[string]bool{"/": true}
	for _, line := range splitLines(string(cg)) {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
			own[parts[2]] = true
		}
	}
	for _, line := range splitLines(string(mi)) {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		pf, sf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(sf) < 1 || (sf[0] != "cgroup" && sf[0] != "cgroup2") {
			continue
		}
		mp := unescapeOctal(pf[4])
		for p := range own {
			_ = unix.Rmdir(filepath.Join(mp, p, base, id))
		}
	}
}

// ensureTraversable adds search permission for others to dir and every
// parent lacking it: runsc's gofer runs as the sandbox's root, an
// unprivileged "other" user on the host, and has to walk these paths.
func ensureTraversable(dir string, logf func(string, ...any)) error {
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("gvisor: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(p, fi.Mode()|0o001); err != nil {
				return fmt.Errorf("gvisor: %w", err)
			}
			logf("gvisor: added o+x to %s so sandboxes can reach their files", p)
		}
		if p == "/" {
			return nil
		}
	}
}

func fileUID(fi os.FileInfo) uint32 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return ^uint32(0)
}

// watchExit returns a channel closed when process pid (not our child: runsc
// daemonizes the sandbox) exits, and a stop func that releases the watch.
// It waits on a pidfd through the runtime's poller, so a watch costs no
// thread.
func watchExit(pid int, start uint64) (<-chan struct{}, error) {
	done := make(chan struct{})
	pfd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	// The pid may have been reused between the caller's check and here.
	if t, err := procStartTime(pid); err != nil || t != start {
		unix.Close(pfd)
		close(done)
		return done, nil
	}
	f := os.NewFile(uintptr(pfd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	go func() {
		defer close(done)
		// Read waits for readability (the process exited) between calls.
		_ = rc.Read(func(fd uintptr) bool {
			n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0
		})
		f.Close()
	}()
	return done, nil
}
