package agent

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair. The master is non-blocking so it goes
// through Go's poller (reads can be interrupted by Close and writes can have
// deadlines); the slave stays blocking, as the command expects of its tty.
// It does not use creack/pty because that puts the master in blocking mode.
func openPTY(cols, rows uint16) (master, slave *os.File, err error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	fail := func(err error) (*os.File, *os.File, error) {
		unix.Close(mfd)
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		return fail(fmt.Errorf("unlock pty: %w", err))
	}
	if err := unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows}); err != nil {
		return fail(fmt.Errorf("set pty size: %w", err))
	}
	// TIOCGPTPEER opens the slave without a path lookup, so it works
	// whatever devpts instance /dev/pts is; fall back to the path.
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		n, err := unix.IoctlGetUint32(mfd, unix.TIOCGPTN)
		if err != nil {
			return fail(fmt.Errorf("pty number: %w", err))
		}
		fd, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("open pty slave: %w", err))
		}
		sfd = uintptr(fd)
	}
	return os.NewFile(uintptr(mfd), "/dev/ptmx"), os.NewFile(sfd, "pty-slave"), nil
}

// setPTYSize resizes the terminal; the kernel sends SIGWINCH to its
// foreground process group.
func setPTYSize(master *os.File, cols, rows uint16) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	}); err != nil {
		return err
	}
	return ioErr
}
