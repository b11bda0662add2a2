// Package vmimage builds what a VM driver boots: an uncompressed kernel
// (vmlinux, for PVH boot on qemu's microvm machine and for Firecracker), an
// initramfs holding busybox, the virtio/ext4/overlay modules and the static
// `space` binary as the agent, and ext4 disk images (the template's
// read-only root, and each sandbox's blank writable disk) made with
// `mkfs.ext4 -d`, without loop mounts.
//
// The guest boots like this: /init (a busybox script) loads the modules,
// mounts the disk whose virtio serial is "root" read-only and the one whose
// serial is "upper" read-write, puts an overlay of the two on /newroot,
// moves /dev, /proc and /sys into it and execs `/space agent --vm --root
// /newroot ...`. So the template disk is shared read-only by every VM of a
// template and each VM writes only to its own disk.
package vmimage

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Disk serials the guest's /init looks for.
const (
	SerialRoot  = "root"
	SerialUpper = "upper"
	SerialAgent = "agent"
)

// Modules are the kernel modules (by name) the guest loads, dependencies
// first; Initramfs resolves their files and any missing dependencies from
// modules.dep.
var Modules = []string{
	"virtio_ring", "virtio", "virtio_mmio", "virtio_blk", "virtio_console",
	"crc16", "mbcache", "jbd2", "crc32c_generic", "ext4", "overlay",
	"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport",
	"virtio_net", "virtio_balloon",
}

// xzMagic starts an XZ stream (Debian's bzImage payload).
var xzMagic = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}

// ExtractVmlinux writes the uncompressed ELF kernel inside bzImage (an XZ
// payload, as Debian builds it) to out. If bzImage is already an ELF it is
// copied. It needs the xz command.
func ExtractVmlinux(ctx context.Context, bzImage, out string) error {
	data, err := os.ReadFile(bzImage)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	tmp := out + ".tmp"
	defer os.Remove(tmp)
	if bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return fmt.Errorf("vmimage: %w", err)
		}
		return os.Rename(tmp, out)
	}
	off := bytes.Index(data, xzMagic)
	if off < 0 {
		return fmt.Errorf("vmimage: %s: no XZ payload found (only XZ-compressed bzImages are supported; pass a vmlinux instead)", bzImage)
	}
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	cmd := exec.CommandContext(ctx, "xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(data[off:])
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("vmimage: xz -dc %s: %w: %s", bzImage, err, strings.TrimSpace(stderr.String()))
	}
	ef, err := elf.Open(tmp)
	if err != nil {
		return fmt.Errorf("vmimage: decompressed kernel is not an ELF: %w", err)
	}
	ef.Close()
	return os.Rename(tmp, out)
}

// FindKernel returns the newest /boot/vmlinuz-* and its module dir, or an
// error saying which package provides them.
func FindKernel(boot, modules string) (vmlinuz, modDir string, err error) {
	ms, _ := filepath.Glob(filepath.Join(boot, "vmlinuz-*"))
	for i := len(ms) - 1; i >= 0; i-- {
		release := strings.TrimPrefix(filepath.Base(ms[i]), "vmlinuz-")
		dir := filepath.Join(modules, release)
		if _, err := os.Stat(filepath.Join(dir, "modules.dep")); err == nil {
			return ms[i], dir, nil
		}
	}
	return "", "", errors.New("vmimage: no kernel with modules in " + boot + " (apt-get install linux-image-amd64, or scripts/vm-deps.sh)")
}

// RootDisk builds a read-only-use ext4 image of dir at out, sized to fit
// (content plus a margin).
func RootDisk(ctx context.Context, dir, out string) error {
	size, err := dirSize(dir)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	size = size + size/4 + 16<<20
	return mkfs(ctx, out, size, dir, "space-root")
}

// AgentDisk builds a small read-only-use ext4 image holding the static
// `space` binary at /space, the guest's agent.
func AgentDisk(ctx context.Context, agent, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".agent-")
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	defer os.RemoveAll(dir)
	data, err := os.ReadFile(agent)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "space"), data, 0o755); err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	return RootDisk(ctx, dir, out)
}

// BlankDisk makes an empty, sparse ext4 image of size bytes at out: a
// sandbox's writable disk. Ext4 with no journal, lazy init: it costs a few
// milliseconds and almost no space until written.
func BlankDisk(ctx context.Context, out string, size int64) error {
	return mkfs(ctx, out, size, "", "space-upper")
}

// WritableSize is the size of a sandbox's writable disk: its disk limit
// diskBytes in whole MiB (at least 16 MiB), else def. The guest's
// filesystem answers ENOSPC past it; the sparse file on the host never
// grows beyond it.
func WritableSize(diskBytes, def int64) int64 {
	if diskBytes > 0 {
		return max((diskBytes+1<<20-1)&^(1<<20-1), 16<<20)
	}
	return def
}

// CheckWritableSize reports whether the writable disk at path has the
// size a disk limit asks for (0: any will do): the size is fixed at
// create, a running guest's filesystem does not change size.
func CheckWritableSize(path string, diskBytes int64) error {
	if diskBytes <= 0 {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	if want := WritableSize(diskBytes, 0); fi.Size() != want {
		return fmt.Errorf("vmimage: the writable disk has %d bytes, asked %d: its size is fixed at create", fi.Size(), want)
	}
	return nil
}

func mkfs(ctx context.Context, out string, size int64, dir, label string) error {
	tmp := out + ".tmp"
	defer os.Remove(tmp)
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	args := []string{"-q", "-F", "-t", "ext4", "-L", label, "-O", "^has_journal,^resize_inode",
		"-E", "lazy_itable_init=1,root_owner=0:0", "-m", "0", "-b", "4096", "-I", "256"}
	if dir != "" {
		args = append(args, "-d", dir)
	}
	args = append(args, tmp)
	cmd := exec.CommandContext(ctx, "mkfs.ext4", args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("vmimage: mkfs.ext4 %s: %w: %s", out, err, strings.TrimSpace(string(b)))
	}
	return os.Rename(tmp, out)
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		n += (fi.Size() + 4095) &^ 4095
		n += 4096 // inode and dirent overhead, roughly
		return nil
	})
	return n, err
}
