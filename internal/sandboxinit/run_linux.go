package sandboxinit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/seccomp"
	"golang.org/x/sys/unix"
)

// Hooks are what the caller plugs into Run.
type Hooks struct {
	// Harden, if set, runs first, while the host still places init in its
	// cgroups (e.g. agent.HardenSelf): what it does (signals, dumpable,
	// the capability bounding set) must not depend on the host's part or
	// on the sandbox's tree. It must check that what it promises took
	// effect: an error aborts the sandbox and is reported to the host,
	// which refuses to start it. As PID 1 the process must catch SIGTERM &
	// co. here (the Go runtime would otherwise exit on them and take the
	// sandbox down); agent.HardenSelf does.
	Harden func() error
	// Serve runs the agent on the listener the host passed; Run returns
	// what it returns. It is called after the host was told the sandbox is
	// ready, under the seccomp filter.
	Serve func(ctx context.Context, l net.Listener) error
	// Logf, if set, receives non-fatal setup notes (they go to init.log).
	Logf func(format string, args ...any)
}

// Run sets up the sandbox from inside its namespaces and then serves. It
// must be called early in `space agent --init`, before the process starts
// anything else, and only in a process started by the namespace driver.
func Run(ctx context.Context, cfg Config, h Hooks) error {
	if h.Serve == nil {
		return errors.New("sandboxinit: no Serve hook")
	}
	if h.Logf == nil {
		h.Logf = func(string, ...any) {}
	}
	for _, fd := range []int{ListenerFD, SyncFD, StatusFD} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return fmt.Errorf("sandboxinit: descriptor %d not passed: %w", fd, err)
		}
	}
	// The binary we run from, if the host passed it as a memfd: the
	// running image keeps its own reference, and no command may inherit it.
	if l, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(AgentFD)); err == nil && strings.HasPrefix(l, "/memfd:") {
		_ = unix.Close(AgentFD)
	}
	status := os.NewFile(StatusFD, "status")
	syncf := os.NewFile(SyncFD, "sync")
	lnFile := os.NewFile(ListenerFD, "listener")
	fail := func(err error) error {
		_, _ = status.Write(append([]byte{statusErr}, err.Error()...))
		_ = status.Close()
		return err
	}

	// Harden while the host does its part (it used to wait for the
	// filesystem; it needs none of it), so the two overlap.
	var t Timings
	var hardenErr error
	if h.Harden != nil {
		start := time.Now()
		hardenErr = h.Harden()
		t.Harden = time.Since(start)
	}

	// Wait until the host has put us in our cgroups: the cgroup namespace
	// below must be rooted there. EOF means the host died or gave up;
	// there is nobody to report to. A failure before this point is
	// reported after it, so the host's release write does not fail first.
	var b [1]byte
	n, err := syncf.Read(b[:])
	_ = syncf.Close()
	if n != 1 {
		return fmt.Errorf("sandboxinit: host went away before setup (%v)", err)
	}
	if hardenErr != nil {
		return fail(fmt.Errorf("sandboxinit: harden: %w", hardenErr))
	}
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}

	if err := setup(cfg, &t, h.Logf); err != nil {
		return fail(err)
	}
	l, err := net.FileListener(lnFile)
	_ = lnFile.Close()
	if err != nil {
		return fail(fmt.Errorf("sandboxinit: listener: %w", err))
	}
	start := time.Now()
	// Install checks every thread's no_new_privs and filter afterwards.
	if err := seccomp.Install(); err != nil {
		_ = l.Close()
		return fail(err)
	}
	t.Seccomp = time.Since(start)

	msg, _ := json.Marshal(t)
	if _, err := status.Write(append([]byte{statusOK}, msg...)); err != nil {
		_ = l.Close()
		return fmt.Errorf("sandboxinit: report status: %w", err)
	}
	_ = status.Close()
	return h.Serve(ctx, l)
}

func setup(cfg Config, t *Timings, logf func(string, ...any)) error {
	unix.Umask(0o022)

	start := time.Now()
	if err := unshareCgroupNS(); err != nil {
		logf("init: no cgroup namespace: %v", err)
	}
	t.CgroupNS = time.Since(start)

	start = time.Now()
	if err := mountAll(cfg, logf); err != nil {
		return err
	}
	t.Mounts = time.Since(start)

	start = time.Now()
	if err := pivot(cfg.Merged); err != nil {
		return err
	}
	t.Pivot = time.Since(start)

	start = time.Now()
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sandboxinit: sethostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	t.Network = time.Since(start)

	for k, v := range map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": "/root",
	} {
		if os.Getenv(k) == "" {
			_ = os.Setenv(k, v)
		}
	}
	return nil
}

// unshareCgroupNS gives every thread of the process one new cgroup
// namespace rooted at the sandbox's cgroups, so /proc/self/cgroup inside
// reads "/" and the node's layout stays hidden. Namespaces are per thread:
// one thread unshares, then all threads join its namespace with setns
// (AllThreadsSyscall needs a binary built with CGO_ENABLED=0).
func unshareCgroupNS() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/cgroup", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(orig)
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	fd, err := unix.Open("/proc/thread-self/ns/cgroup", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		defer unix.Close(fd)
		_, _, errno := syscall.AllThreadsSyscall(unix.SYS_SETNS, uintptr(fd), unix.CLONE_NEWCGROUP, 0)
		if errno == 0 {
			return nil
		}
		err = errno
	}
	// Put this thread back so all threads agree.
	if rerr := unix.Setns(orig, unix.CLONE_NEWCGROUP); rerr != nil {
		// A thread in a namespace of its own must not return to the pool.
		runtime.LockOSThread()
		return fmt.Errorf("setns all threads: %w; restore: %w", err, rerr)
	}
	return fmt.Errorf("setns all threads: %w", err)
}

// mountAll builds the sandbox's tree under cfg.Merged.
func mountAll(cfg Config, logf func(string, ...any)) error {
	// Nothing mounted from here on may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("sandboxinit: make / private: %w", err)
	}
	opts := cfg.OverlayOptions()
	if err := unix.Mount("overlay", cfg.Merged, "overlay", 0, opts); err != nil {
		return fmt.Errorf("sandboxinit: mount overlay (%s): %w", opts, err)
	}
	m := cfg.Merged
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"proc", 0o555}, {"dev", 0o755}, {"sys", 0o555}, {"tmp", 0o1777}} {
		if err := ensureDir(m, d.name, d.mode); err != nil {
			return err
		}
	}
	if err := mount("proc", filepath.Join(m, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := mountDev(filepath.Join(m, "dev"), cfg.ShmBytes); err != nil {
		return err
	}
	sys := filepath.Join(m, "sys")
	roFlags := uintptr(unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := mount("sysfs", sys, "sysfs", roFlags, ""); err != nil {
		// sysfs needs a network namespace owned by our user namespace;
		// fall back to a read-only view of the host's.
		logf("init: %v; binding the host's /sys read-only", err)
		if err := mount("/sys", sys, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		if err := mount("", sys, "", unix.MS_BIND|unix.MS_REMOUNT|roFlags, ""); err != nil {
			return err
		}
	}
	return nil
}

// ensureDir makes root/name a directory. An existing non-directory
// (a symlink planted in the template or a restored upper layer) is refused
// rather than followed: a mount on it would land somewhere else.
func ensureDir(root, name string, mode os.FileMode) error {
	p := filepath.Join(root, name)
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(p, mode.Perm()); err != nil {
			return fmt.Errorf("sandboxinit: %w", err)
		}
		return os.Chmod(p, mode) // umask and sticky bit
	}
	if err != nil {
		return fmt.Errorf("sandboxinit: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("sandboxinit: /%s in the root filesystem is not a directory (%v)", name, fi.Mode().Type())
	}
	return nil
}

func mount(source, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("sandboxinit: mount %s on %s: %w", fstype+source, target, err)
	}
	return nil
}

// mountDev builds a minimal /dev: a tmpfs with the harmless host device
// nodes bound in (a user namespace cannot mknod), a private devpts and a
// /dev/shm.
func mountDev(dev string, shm int64) error {
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID, "mode=755,size=65536k"); err != nil {
		return err
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		target := filepath.Join(dev, name)
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
		if err != nil {
			return fmt.Errorf("sandboxinit: %w", err)
		}
		_ = f.Close()
		if err := mount("/dev/"+name, target, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return fmt.Errorf("sandboxinit: %w", err)
		}
	}
	if err := mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return err
	}
	if shm <= 0 {
		shm = DefaultShmBytes
	}
	if err := mount("shm", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		"mode=1777,size="+strconv.FormatInt(shm, 10)); err != nil {
		return err
	}
	for name, target := range map[string]string{
		"ptmx":   "pts/ptmx",
		"fd":     "/proc/self/fd",
		"stdin":  "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("sandboxinit: %w", err)
		}
	}
	return nil
}

// pivot makes merged the root and drops the host's tree from the mount
// namespace. pivot_root(".", ".") stacks the old root on top of the new one,
// so no put-old directory has to be created in the sandbox's tree.
func pivot(merged string) error {
	if err := unix.Chdir(merged); err != nil {
		return fmt.Errorf("sandboxinit: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("sandboxinit: pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("sandboxinit: detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("sandboxinit: %w", err)
	}
	return nil
}

// loopbackUp brings lo up; the network namespace has no other interface
// unless the host adds one.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sandboxinit: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("sandboxinit: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("sandboxinit: get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("sandboxinit: lo up: %w", err)
	}
	return nil
}
