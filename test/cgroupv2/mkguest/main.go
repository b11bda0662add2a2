// Command mkguest writes the kernel and initramfs of the cgroup-v2-only test
// guest (scripts/cgroupv2-vm.sh): the host's Debian kernel uncompressed for
// PVH boot on qemu's microvm machine, and an initramfs that loads the
// virtio and ext4 modules, mounts the disk with serial "root" read-write
// and switches to its systemd. It reuses the qemu driver's image pieces
// (internal/vmimage) with a different /init.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/space-sandbox/space/internal/vmimage"
)

// initScript mounts the guest's Debian root and hands over to systemd. The
// kernel command line carries cgroup_no_v1=all and
// systemd.unified_cgroup_hierarchy=1, so systemd mounts only cgroup2.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.order); do insmod /lib/modules/$m 2>/dev/null; done
root=
for d in /sys/block/vd*; do [ "$(cat $d/serial 2>/dev/null)" = root ] && root=/dev/${d##*/}; done
[ -n "$root" ] || { echo "mkguest-init: no disk with serial root"; poweroff -f; }
mount -t ext4 "$root" /newroot || { echo "mkguest-init: mount $root failed"; poweroff -f; }
echo "mkguest-init: root $root mounted, uptime $(cut -d' ' -f1 /proc/uptime)"
umount /sys /proc
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
`

func main() {
	out := flag.String("out", "", "directory to write vmlinux and initramfs.cpio to")
	busybox := flag.String("busybox", "/bin/busybox", "static busybox for the initramfs")
	flag.Parse()
	if err := run(context.Background(), *out, *busybox); err != nil {
		fmt.Fprintln(os.Stderr, "mkguest:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out, busybox string) error {
	if out == "" {
		return fmt.Errorf("-out is required")
	}
	kernel, modDir, err := vmimage.FindKernel("/boot", "/lib/modules")
	if err != nil {
		return err
	}
	if err := vmimage.ExtractVmlinux(ctx, kernel, filepath.Join(out, "vmlinux")); err != nil {
		return err
	}
	spec := vmimage.InitramfsSpec{Busybox: busybox, ModDir: modDir, Init: initScript}
	if err := vmimage.Initramfs(spec, filepath.Join(out, "initramfs.cpio")); err != nil {
		return err
	}
	fmt.Println(filepath.Base(modDir))
	return nil
}
