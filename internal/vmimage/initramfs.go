package vmimage

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// InitramfsSpec says what goes into the guest's initramfs.
type InitramfsSpec struct {
	Busybox string // a static busybox (busybox-static: /bin/busybox)
	// Agent is the static `space` binary. Empty: the guest runs it from
	// the disk with serial "agent" (see AgentDisk), which keeps ≈ 25 MB
	// out of the initramfs, whose pages the guest can never evict.
	Agent  string
	ModDir string // /lib/modules/<release> of the kernel being booted
	// AgentArgs follow `/space agent --vm --root /newroot`; default
	// ["--serial", "space.agent"].
	AgentArgs []string
	// Init replaces the sandbox boot script as the guest's /init (a
	// busybox sh script; /modules.order lists the modules to insmod from
	// /lib/modules). Test guests that boot a whole distribution use it;
	// AgentArgs are then ignored.
	Init string
}

// initScript is the guest's /init. It never runs a shell command built
// from sandbox input: the only variable parts are fixed by the driver.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /mnt/root /mnt/upper /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "space-init: start, uptime $(cut -d' ' -f1 /proc/uptime)"
for m in $(cat /modules.order); do insmod /lib/modules/$m 2>/dev/null; done
disk() { for d in /sys/block/vd*; do [ "$(cat $d/serial 2>/dev/null)" = "$1" ] && echo /dev/${d##*/}; done; }
fail() { echo "space-init: $*" >&2; poweroff -f; }
# A process that outgrows the sandbox's memory is OOM-killed, as under a
# container's memory cgroup, instead of being refused by the guest's
# overcommit heuristic.
echo 1 > /proc/sys/vm/overcommit_memory
ip link set lo up
# space.net=ADDR/BITS,GATEWAY: the guest's fixed address on its NIC.
net=$(sed -n 's/.*space\.net=\([0-9./,]*\).*/\1/p' /proc/cmdline)
if [ -n "$net" ]; then
  ip addr add "${net%%,*}" dev eth0 && ip link set eth0 up && ip route add default via "${net#*,}" || fail "network $net"
fi
root=$(disk root); upper=$(disk upper); agentdisk=$(disk agent)
agent=/space
if [ -n "$agentdisk" ]; then
  mkdir -p /mnt/agent
  mount -t ext4 -o ro,noload "$agentdisk" /mnt/agent || fail "mount agent disk"
  agent=/mnt/agent/space
fi
[ -x "$agent" ] || fail "no agent binary"
[ -n "$root" ] || fail "no disk with serial root"
mount -t ext4 -o ro,noload "$root" /mnt/root || fail "mount root"
if [ -n "$upper" ]; then
  # noinit_itable: no background zeroing of the inode tables mkfs left
  # lazy (tens of MiB of writes: TCG time, and disk data a checkpoint
  # would carry).
  mount -t ext4 -o nosuid,noinit_itable "$upper" /mnt/upper || fail "mount upper"
else
  mount -t tmpfs -o mode=755 tmpfs /mnt/upper || fail "mount tmpfs upper"
fi
mkdir -p /mnt/upper/upper /mnt/upper/work
mount -t overlay overlay -o lowerdir=/mnt/root,upperdir=/mnt/upper/upper,workdir=/mnt/upper/work /newroot || fail "mount overlay"
for d in proc sys dev tmp; do [ -d /newroot/$d ] || mkdir -p /newroot/$d; done
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /newroot/tmp
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
echo "space-init: root ready, uptime $(cut -d' ' -f1 /newroot/proc/uptime)"
exec "$agent" agent --vm --root /newroot @AGENTARGS@
`

// Initramfs writes an uncompressed newc cpio archive to out. Uncompressed:
// the kernel unpacks it with a memcpy instead of spending TCG time on
// gunzip of a 25 MB agent.
func Initramfs(spec InitramfsSpec, out string) error {
	args := spec.AgentArgs
	if args == nil {
		args = []string{"--serial", "space.agent"}
	}
	for _, a := range args {
		if strings.ContainsAny(a, " \t\n'\"$`\\;&|<>(){}*?[]#~") {
			return fmt.Errorf("vmimage: agent argument %q has shell metacharacters", a)
		}
	}
	mods, err := resolveModules(spec.ModDir, Modules)
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	defer os.Remove(tmp)
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	w := &cpioWriter{w: bw}
	for _, d := range []string{"bin", "lib", "lib/modules", "proc", "sys", "dev", "mnt", "newroot"} {
		w.dir(d)
	}
	script := strings.Replace(initScript, "@AGENTARGS@", strings.Join(args, " "), 1)
	if spec.Init != "" {
		script = spec.Init
	}
	w.file("init", 0o755, []byte(script))
	if err := w.copyFile("bin/busybox", spec.Busybox, 0o755); err != nil {
		return err
	}
	if spec.Agent != "" {
		if err := w.copyFile("space", spec.Agent, 0o755); err != nil {
			return err
		}
	}
	var order []string
	for _, m := range mods {
		name := filepath.Base(m)
		if err := w.copyFile("lib/modules/"+name, filepath.Join(spec.ModDir, m), 0o644); err != nil {
			return err
		}
		order = append(order, name)
	}
	w.file("modules.order", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	w.trailer()
	if w.err == nil {
		w.err = bw.Flush()
	}
	if w.err == nil {
		w.err = f.Close()
	}
	if w.err != nil {
		return fmt.Errorf("vmimage: initramfs: %w", w.err)
	}
	return os.Rename(tmp, out)
}

// resolveModules maps module names to their paths in modules.dep, adding
// dependencies before dependents. Modules missing from modules.dep are
// skipped (built in, or not needed by this kernel), except the virtio
// console and block drivers, without which the guest cannot work.
func resolveModules(modDir string, names []string) ([]string, error) {
	f, err := os.Open(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("vmimage: %w", err)
	}
	defer f.Close()
	deps := map[string][]string{} // path -> deps
	byName := map[string]string{} // module name -> path
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		path, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[path] = strings.Fields(rest)
		byName[modName(path)] = path
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("vmimage: modules.dep: %w", err)
	}
	var out []string
	seen := map[string]bool{}
	var add func(p string)
	add = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		// modules.dep lists the full closure, dependents first; load
		// in reverse.
		ds := deps[p]
		for i := len(ds) - 1; i >= 0; i-- {
			add(ds[i])
		}
		out = append(out, p)
	}
	for _, n := range names {
		p, ok := byName[n]
		if !ok {
			if n == "virtio_console" || n == "virtio_blk" {
				return nil, fmt.Errorf("vmimage: module %s not in %s/modules.dep", n, modDir)
			}
			continue
		}
		add(p)
	}
	for _, p := range out {
		if strings.HasSuffix(p, ".xz") || strings.HasSuffix(p, ".zst") || strings.HasSuffix(p, ".gz") {
			return nil, fmt.Errorf("vmimage: compressed module %s: busybox insmod needs plain .ko files", p)
		}
	}
	return out, nil
}

func modName(path string) string {
	b := filepath.Base(path)
	b = b[:strings.Index(b, ".ko")+len(".ko")]
	return strings.ReplaceAll(strings.TrimSuffix(b, ".ko"), "-", "_")
}

// cpioWriter writes the "newc" format (what the kernel's initramfs
// unpacker reads). Errors are sticky.
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

func (c *cpioWriter) header(name string, mode uint32, size int) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	_, c.err = io.WriteString(c.w, hdr+name+"\x00")
	c.pad(len(hdr) + len(name) + 1)
}

func (c *cpioWriter) pad(n int) {
	if c.err != nil || n%4 == 0 {
		return
	}
	_, c.err = c.w.Write(make([]byte, 4-n%4))
}

func (c *cpioWriter) dir(name string) { c.header(name, 0o040755, 0) }

func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.header(name, 0o100000|perm, len(data))
	if c.err == nil {
		_, c.err = c.w.Write(data)
	}
	c.pad(len(data))
}

func (c *cpioWriter) copyFile(name, src string, perm uint32) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	c.file(name, perm, data)
	return nil
}

func (c *cpioWriter) trailer() { c.header("TRAILER!!!", 0, 0) }
