// Package diskquota bounds a sandbox's writable layer: the layer lives on a
// filesystem of its own, an ext4 image of exactly the sandbox's disk limit
// (a sparse file next to the sandbox's other state), loop-mounted on the
// host. A write past the limit fails inside the sandbox with ENOSPC, the
// filesystem's own answer; nothing outside that image is touched, and the
// host filesystem gives up only the blocks the sandbox really wrote.
//
// Why not project quotas on one shared filesystem (cheaper per sandbox)?
// They need the kernel's quota formats (CONFIG_QFMT_V2 for ext4's quota
// feature, CONFIG_XFS_QUOTA for XFS), and the development and CI kernels
// have neither; loop devices and ext4 are everywhere. See docs/drivers.md.
//
// A new image is a copy of a blank one made once per size with mkfs.ext4
// (no journal: a sandbox does not survive a host crash anyway; lazy inode
// tables), so a create costs a sparse copy of ≈ 0.3 MiB, a loop device and
// a mount, not a mkfs.
package diskquota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnsupported: no loop devices, no ext4 or no mkfs.ext4 here.
var ErrUnsupported = errors.New("diskquota: per-sandbox disk images unavailable")

// MinBytes is the smallest disk a sandbox can be given.
const MinBytes = 16 << 20

// bytesPerInode is the images' inode ratio: a 1 GiB disk has 131072 inodes.
const bytesPerInode = 8192

// Options configure a Manager.
type Options struct {
	// CacheDir holds the blank images, one per size (blank-<bytes>.ext4).
	CacheDir string
	Logf     func(string, ...any)
}

// Manager makes, mounts, grows and removes sandbox disk images.
type Manager struct {
	cache string
	mkfs  string
	logf  func(string, ...any)

	mu     sync.Mutex
	blanks map[int64]*sync.Mutex // one mkfs per size at a time
}

// New checks the host (loop devices, ext4, mkfs.ext4) and returns a
// Manager; errors wrap ErrUnsupported with the reason.
func New(o Options) (*Manager, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.CacheDir == "" {
		return nil, errors.New("diskquota: CacheDir is required")
	}
	if err := Available(); err != nil {
		return nil, err
	}
	mkfs, _ := exec.LookPath("mkfs.ext4")
	if err := os.MkdirAll(o.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("diskquota: %w", err)
	}
	return &Manager{cache: o.CacheDir, mkfs: mkfs, logf: o.Logf, blanks: map[int64]*sync.Mutex{}}, nil
}

// Available says whether this host can give sandboxes disk images, and if
// not, why (wrapping ErrUnsupported).
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (loop devices, mount)", ErrUnsupported)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("%w: %v (loop driver)", ErrUnsupported, err)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return fmt.Errorf("%w: %v (install e2fsprogs)", ErrUnsupported, err)
	}
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "ext4" {
			return nil
		}
	}
	return fmt.Errorf("%w: the kernel has no ext4", ErrUnsupported)
}

// RoundSize rounds a limit to what an image of it holds: whole MiB, at
// least MinBytes.
func RoundSize(size int64) int64 {
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	return max(size, MinBytes)
}

// Create makes the image file image of size bytes (RoundSize), a blank
// ext4 filesystem, and mounts it at mountpoint (which must exist), nosuid
// and nodev. On error nothing is left but the empty mountpoint.
func (m *Manager) Create(ctx context.Context, image, mountpoint string, size int64) (err error) {
	size = RoundSize(size)
	blank, err := m.blank(ctx, size)
	if err != nil {
		return err
	}
	if err := copySparse(blank, image); err != nil {
		os.Remove(image)
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(image)
		}
	}()
	return mount(image, mountpoint)
}

// CheckSize reports whether the disk image (missing: the sandbox has
// none) is of the size a limit asks for (0: any size will do). A disk
// keeps the size it was made with: ext4 cannot shrink while mounted, and
// growing it online needs CAP_SYS_RESOURCE, which many hosts withhold
// even from root.
func CheckSize(image string, want int64) error {
	if want <= 0 {
		return nil
	}
	var have int64
	if fi, err := os.Stat(image); err == nil {
		have = fi.Size()
	}
	if want = RoundSize(want); want != have {
		return fmt.Errorf("disk of %d bytes, asked for %d: the disk size is fixed at create", have, want)
	}
	return nil
}

// Mounted reports whether a filesystem is mounted at mountpoint (its
// device differs from its parent directory's).
func Mounted(mountpoint string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(mountpoint, &st) != nil || unix.Lstat(filepath.Dir(filepath.Clean(mountpoint)), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// Remove unmounts mountpoint (if mounted) and removes image. Everything
// is tolerated as already gone, so it can be repeated. A mount another
// mount namespace still holds (a sandbox's, being torn down) is detached
// lazily: the loop device goes when the last user lets go.
func Remove(image, mountpoint string) error {
	var errs []error
	for i := 0; i < 4 && Mounted(mountpoint); i++ {
		if err := unix.Unmount(mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("diskquota: unmount %s: %w", mountpoint, err))
			break
		}
	}
	if err := os.Remove(image); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("diskquota: %w", err))
	}
	return errors.Join(errs...)
}

// Size returns the size of the filesystem mounted at mountpoint (the
// image's size) and the bytes its files use.
func Size(mountpoint string) (size, used int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(mountpoint, &st); err != nil {
		return 0, 0, fmt.Errorf("diskquota: %w", err)
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// blank returns the cached blank image of size bytes, making it first.
func (m *Manager) blank(ctx context.Context, size int64) (string, error) {
	path := filepath.Join(m.cache, "blank-"+strconv.FormatInt(size, 10)+".ext4")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	m.mu.Lock()
	mu := m.blanks[size]
	if mu == nil {
		mu = &sync.Mutex{}
		m.blanks[size] = mu
	}
	m.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	t0 := time.Now()
	tmp := path + ".tmp"
	defer os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", fmt.Errorf("diskquota: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("diskquota: %w", err)
	}
	// No journal (a sandbox does not outlive a host crash), no reserved
	// blocks (the sandbox's root may use every byte it is given), lazy
	// inode tables (never initialised: mounted noinit_itable, and a
	// fresh image's unused tables are known to be empty); the root dir
	// is root's, the layer dirs inside belong to the sandbox.
	args := []string{"-q", "-F", "-t", "ext4", "-L", "space-disk",
		"-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0",
		"-m", "0", "-b", "4096", "-I", "256", "-i", strconv.Itoa(bytesPerInode), tmp}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, m.mkfs, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("diskquota: mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("diskquota: %w", err)
	}
	m.logf("disk images: blank %d MiB ext4 made in %v", size>>20, time.Since(t0).Round(time.Millisecond))
	return path, nil
}

// copySparse copies the data extents of from into a new file to of the
// same size (holes stay holes).
func copySparse(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer out.Close()
	if err := out.Truncate(fi.Size()); err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < fi.Size(); {
		start, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return fmt.Errorf("diskquota: seek data: %w", err)
		}
		end, err := unix.Seek(ifd, start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("diskquota: seek hole: %w", err)
		}
		for pos := start; pos < end; {
			ip, op := pos, pos
			n, err := unix.CopyFileRange(ifd, &ip, ofd, &op, int(end-pos), 0)
			if err != nil || n == 0 {
				// No copy_file_range across these files: plain copy.
				if _, err := io.Copy(io.NewOffsetWriter(out, pos), io.NewSectionReader(in, pos, end-pos)); err != nil {
					return fmt.Errorf("diskquota: copy: %w", err)
				}
				break
			}
			pos += int64(n)
		}
		off = end
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	return nil
}

// mount binds image to a free loop device and mounts it at mountpoint.
func mount(image, mountpoint string) error {
	f, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer f.Close()
	loop, err := attachLoop(f, image)
	if err != nil {
		return err
	}
	// Autoclear: the device detaches itself with the last unmount, so
	// closing it here leaves only the mount holding it.
	defer loop.Close()
	// discard: a deleted file's blocks become holes in the image again, so
	// the host gets them back. noinit_itable: see blank.
	opts := "discard,noinit_itable"
	if err := unix.Mount(loop.Name(), mountpoint, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, opts); err != nil {
		return fmt.Errorf("diskquota: mount %s (%s) at %s: %w", image, loop.Name(), mountpoint, err)
	}
	return nil
}

// attachLoop binds a free loop device to f: autoclear, direct I/O where
// the backing filesystem allows (no second copy in the page cache).
func attachLoop(f *os.File, image string) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("diskquota: %w: %w", err, ErrUnsupported)
	}
	defer ctl.Close()
	for attempt := 0; attempt < 32; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("diskquota: LOOP_CTL_GET_FREE: %w", err)
		}
		name := "/dev/loop" + strconv.Itoa(n)
		dev, err := os.OpenFile(name, os.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, fs.ErrNotExist) { // no devtmpfs node (yet)
			if err = unix.Mknod(name, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err == nil || errors.Is(err, fs.ErrExist) {
				dev, err = os.OpenFile(name, os.O_RDWR|unix.O_CLOEXEC, 0)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("diskquota: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if errors.Is(err, unix.EINVAL) { // no direct I/O on this backing file
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		}
		if errors.Is(err, unix.EBUSY) { // another process took it first
			dev.Close()
			continue
		}
		if err != nil {
			dev.Close()
			return nil, fmt.Errorf("diskquota: LOOP_CONFIGURE %s: %w", name, err)
		}
		return dev, nil
	}
	return nil, errors.New("diskquota: no free loop device")
}

// LoopsBacking lists the loop devices whose backing file is below dir
// (for leak checks: a removed sandbox's device detaches by itself once
// nothing holds its filesystem).
func LoopsBacking(dir string) []string {
	dir = filepath.Clean(dir) + "/"
	ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		if f := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)"); strings.HasPrefix(f, dir) {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(m)))+" on "+f)
		}
	}
	return out
}
