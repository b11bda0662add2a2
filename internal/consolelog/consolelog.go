// Package consolelog gives a sandbox's console output a host file the
// sandbox cannot grow past a bound. A console is written by the sandbox at
// will (gVisor: PID 1's stdout and stderr, which root inside can reopen
// through /proc/1/fd; a VM: its serial port, which guest root can write
// to), so the file lives on a tmpfs of Bytes of its own under the
// sandbox's state dir: past that, writes fail with ENOSPC and the host
// keeps what came first (start-up messages, which error reports quote).
// Its pages are charged to the memory cgroup of the writer (the sandbox's
// runsc or VMM), so they count against the sandbox's memory.
package consolelog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Bytes is the most a sandbox's console dir holds.
const Bytes = 1 << 20

// Dir is the console mount under a sandbox's state dir.
const Dir = "console"

// Path is the console file name in the console mount of the sandbox
// whose state dir is dir.
func Path(dir, name string) string { return filepath.Join(dir, Dir, name) }

// Mount makes <dir>/console a tmpfs of Bytes, unless it is one already
// (a restart of the same sandbox).
func Mount(dir string) error {
	mnt := filepath.Join(dir, Dir)
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("consolelog: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		return nil
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=16,mode=0700", Bytes)
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("consolelog: mount tmpfs on %s: %w", mnt, err)
	}
	return nil
}

// Unmount lazily unmounts <dir>/console, if mounted, so the state dir can
// be removed; a missing mount is not an error.
func Unmount(dir string) error {
	mnt := filepath.Join(dir, Dir)
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("consolelog: unmount %s: %w", mnt, err)
	}
	return nil
}
