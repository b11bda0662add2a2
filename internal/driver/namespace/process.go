package namespace

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/spawner"

	"golang.org/x/sys/unix"
)

// process is a sandbox's PID 1 as seen from the host: our own child (reaped
// by a goroutine so no zombie stays behind), the fork helper's child, or,
// after a node restart, someone else's child; the last two are watched and
// signalled through a pidfd.
type process struct {
	pid     int
	done    chan struct{} // closed once PID 1 has exited
	exitErr error         // child or spawned only; valid after done

	cmd *exec.Cmd // child

	mu    sync.Mutex
	pidfd *os.File // re-attached; nil once released
}

func newChild(cmd *exec.Cmd) *process {
	p := &process{pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	return p
}

// errGone means the recorded process no longer exists (or its pid now
// belongs to another process).
var errGone = errors.New("process gone")

// openVerified opens a pidfd on pid and checks that it is still the process
// that started at startTime (clock ticks, so only coarse) as the first
// process of pid namespace pidNS (unique while it lives); the pidfd then
// pins that exact process.
func openVerified(pid int, startTime, pidNS uint64) (*process, error) {
	if pid <= 1 {
		return nil, fmt.Errorf("%w: bad pid %d", errGone, pid)
	}
	fd, err := unix.PidfdOpen(pid, unix.O_NONBLOCK) // PIDFD_NONBLOCK
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("%w: pid %d not running", errGone, pid)
		}
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	st, zombie, err := procStat(pid)
	ns, nsErr := pidNamespace(pid)
	if err != nil || nsErr != nil || st != startTime || ns != pidNS || zombie {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("%w: pid %d was reused or has exited", errGone, pid)
	}
	p := &process{pid: pid, done: make(chan struct{}), pidfd: os.NewFile(uintptr(fd), "pidfd")}
	if err := p.watch(nil); err != nil {
		_ = p.pidfd.Close()
		return nil, err
	}
	return p, nil
}

// newSpawned is a PID 1 the fork helper started: the helper is its parent
// and reaps it, the driver watches and signals it through the pidfd the
// helper passed back, like a re-attached one, and gets its exit status
// from the helper.
func newSpawned(sp *spawner.Process) (*process, error) {
	p := &process{pid: sp.Pid, done: make(chan struct{}), pidfd: sp.PidFD}
	if err := p.watch(func() { p.exitErr = sp.Exit(time.Second) }); err != nil {
		sp.Release()
		return nil, err
	}
	return p, nil
}

// watch closes p.done once the pidfd turns readable (the process exited),
// after calling exited if set; release stops it.
func (p *process) watch(exited func()) error {
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return err
	}
	// A pidfd turns readable when the process exits; the runtime's poller
	// waits for that without tying up a thread.
	go func() {
		err := rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(fds, 0)
			return n > 0
		})
		if err == nil {
			if exited != nil {
				exited()
			}
			close(p.done)
		}
	}()
	return nil
}

// kill sends SIGKILL to PID 1, which takes the whole pid namespace with it.
func (p *process) kill() error {
	if p.cmd != nil {
		err := p.cmd.Process.Signal(unix.SIGKILL)
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd == nil {
		return nil
	}
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.PidfdSendSignal(int(fd), unix.SIGKILL, nil, 0)
	}); err != nil {
		return err
	}
	if errors.Is(serr, unix.ESRCH) {
		return nil
	}
	return serr
}

// release drops the pidfd of a re-attached process.
func (p *process) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd != nil {
		_ = p.pidfd.Close()
		p.pidfd = nil
	}
}

// procStat returns a process's start time (clock ticks after boot, field 22
// of /proc/<pid>/stat) and whether it is a zombie.
func procStat(pid int) (start uint64, zombie bool, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, err
	}
	// The command name may contain anything, ")" included; fields resume
	// after the last ")".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return 0, false, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("malformed /proc/%d/stat: %w", pid, err)
	}
	return start, string(f[0]) == "Z" || string(f[0]) == "X", nil
}

// pidNamespace returns the inode of the pid namespace pid lives in.
func pidNamespace(pid int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/pid", &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func procStartTime(pid int) (uint64, error) {
	st, _, err := procStat(pid)
	return st, err
}
