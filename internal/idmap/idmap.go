// Package idmap gives a sandbox a view of a shared tree (a template's
// files) under its own host uid/gid range without copying or chowning
// anything: an idmapped mount (open_tree(OPEN_TREE_CLONE) +
// mount_setattr(MOUNT_ATTR_IDMAP)) whose user namespace maps the ids the
// files are stored with to the sandbox's range. util-linux's
// X-mount.idmap option is silently ignored by some mount(8) builds, so the
// syscalls are used directly.
package idmap

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A Mapping maps host ids From..From+Count-1 (how the files are stored) to
// To..To+Count-1 (how the sandbox's processes own them).
type Mapping struct {
	From, To, Count uint32
}

// Valid reports whether m is usable: non-empty, no overflow.
func (m Mapping) Valid() error {
	if m.Count == 0 || uint64(m.From)+uint64(m.Count) > 1<<32-1 || uint64(m.To)+uint64(m.Count) > 1<<32-1 {
		return fmt.Errorf("idmap: invalid mapping %d→%d (%d ids)", m.From, m.To, m.Count)
	}
	return nil
}

// Cache keeps one user namespace per mapping: making one costs a process
// start, and a sandbox's range is reused after it is freed. A namespace
// is kept alive by its open descriptor alone; Close releases them all.
type Cache struct {
	mu sync.Mutex
	ns map[Mapping]*os.File
}

// NewCache returns an empty cache.
func NewCache() *Cache { return &Cache{ns: map[Mapping]*os.File{}} }

// UserNS returns a descriptor of a user namespace with m (owned by the
// cache: do not close it).
func (c *Cache) UserNS(m Mapping) (*os.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.ns[m]; f != nil {
		return f, nil
	}
	f, err := NewUserNS(m)
	if err != nil {
		return nil, err
	}
	c.ns[m] = f
	return f, nil
}

// MountAt makes dst (a new dir) and attaches there a read-only view of
// src whose owners are mapped by m, through the cache's namespace for m.
func (c *Cache) MountAt(src, dst string, m Mapping) error {
	ns, err := c.UserNS(m)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("idmap: %w", err)
	}
	return Mount(src, dst, ns)
}

// Close closes every cached namespace descriptor.
func (c *Cache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for m, f := range c.ns {
		_ = f.Close()
		delete(c.ns, m)
	}
	return nil
}

// NewUserNS makes a user namespace whose ids m.From.. are host ids m.To..
// and returns a descriptor of it. A process is needed to create it (a
// multithreaded Go program cannot unshare a user namespace): the current
// executable is started traced, so it stops at its first instruction
// without running any code, in a namespace the runtime has already
// written the maps of; its namespace is opened and it is killed.
func NewUserNS(m Mapping) (*os.File, error) {
	if err := m.Valid(); err != nil {
		return nil, err
	}
	ids := []syscall.SysProcIDMap{{ContainerID: int(m.From), HostID: int(m.To), Size: int(m.Count)}}
	cmd := &exec.Cmd{
		Path: "/proc/self/exe",
		Args: []string{"space-idmap"},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:                 unix.CLONE_NEWUSER,
			UidMappings:                ids,
			GidMappings:                ids,
			GidMappingsEnableSetgroups: true,
			Ptrace:                     true,
			Pdeathsig:                  syscall.SIGKILL,
		},
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("idmap: user namespace %d→%d: %w", m.From, m.To, err)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil {
		return nil, fmt.Errorf("idmap: user namespace %d→%d: %w", m.From, m.To, err)
	}
	return f, nil
}

// Mount attaches a read-only clone of the tree at src at dst (an empty
// dir), its files' owners mapped through the user namespace userns.
func Mount(src, dst string, userns *os.File) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("idmap: open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(userns.Fd()),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			err = fmt.Errorf("%w (the filesystem or kernel supports no idmapped mounts)", err)
		}
		return fmt.Errorf("idmap: mount_setattr %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("idmap: move_mount %s: %w", dst, err)
	}
	return nil
}

// Probe checks that an idmapped mount of a tree below dir works on this
// kernel and filesystem, using a scratch dir it removes again.
func Probe(dir string) error {
	tmp, err := os.MkdirTemp(dir, ".idmap-probe-")
	if err != nil {
		return fmt.Errorf("idmap: probe: %w", err)
	}
	defer os.RemoveAll(tmp)
	src, dst := filepath.Join(tmp, "src"), filepath.Join(tmp, "dst")
	if err := os.Mkdir(src, 0o755); err != nil {
		return fmt.Errorf("idmap: probe: %w", err)
	}
	ns, err := NewUserNS(Mapping{From: 0, To: 1 << 31, Count: 1})
	if err != nil {
		return err
	}
	defer ns.Close()
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("idmap: probe: %w", err)
	}
	if err := Mount(src, dst, ns); err != nil {
		return err
	}
	return unix.Unmount(dst, unix.MNT_DETACH)
}
