package vmimage

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// readCpio lists a newc archive's entries (name -> contents).
func readCpio(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	pad := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		if !bytes.HasPrefix(b[off:], []byte("070701")) {
			t.Fatalf("bad magic at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		size, namesize := field(6), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		off = pad(off + 110 + namesize)
		if name == "TRAILER!!!" {
			return out
		}
		out[name] = b[off : off+size]
		off = pad(off + size)
	}
}

func TestInitramfs(t *testing.T) {
	dir := t.TempDir()
	mods := filepath.Join(dir, "mods")
	if err := os.MkdirAll(filepath.Join(mods, "kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	// ext4 depends on jbd2 which depends on crc16: dependencies load first.
	dep := "kernel/virtio_blk.ko: kernel/virtio.ko\nkernel/virtio.ko:\nkernel/virtio_console.ko: kernel/virtio.ko\n" +
		"kernel/ext4.ko: kernel/jbd2.ko kernel/crc16.ko\nkernel/jbd2.ko: kernel/crc16.ko\nkernel/crc16.ko:\n"
	if err := os.WriteFile(filepath.Join(mods, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"virtio_blk", "virtio", "virtio_console", "ext4", "jbd2", "crc16"} {
		if err := os.WriteFile(filepath.Join(mods, "kernel", m+".ko"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bb := filepath.Join(dir, "busybox")
	if err := os.WriteFile(bb, []byte("bb"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "initrd.cpio")
	if err := Initramfs(InitramfsSpec{Busybox: bb, ModDir: mods, AgentArgs: []string{"--vsock", "1024"}}, out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	files := readCpio(t, b)
	if string(files["bin/busybox"]) != "bb" {
		t.Errorf("busybox: %q", files["bin/busybox"])
	}
	order := strings.Fields(string(files["modules.order"]))
	pos := map[string]int{}
	for i, m := range order {
		pos[m] = i
	}
	for _, before := range [][2]string{{"virtio.ko", "virtio_blk.ko"}, {"crc16.ko", "jbd2.ko"}, {"jbd2.ko", "ext4.ko"}} {
		if pos[before[0]] >= pos[before[1]] {
			t.Errorf("module order %v: %s must come before %s", order, before[0], before[1])
		}
	}
	if !strings.Contains(string(files["init"]), `agent --vm --root /newroot --vsock 1024`) {
		t.Errorf("init does not exec the agent with its args:\n%s", files["init"])
	}
	if _, ok := files["space"]; ok {
		t.Error("agent in the initramfs although none was given")
	}
	if err := Initramfs(InitramfsSpec{Busybox: bb, ModDir: mods, AgentArgs: []string{"--serial", "x; reboot"}}, out); err == nil {
		t.Error("agent argument with shell metacharacters accepted")
	}
	if err := os.WriteFile(filepath.Join(mods, "modules.dep"), []byte("kernel/virtio.ko:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Initramfs(InitramfsSpec{Busybox: bb, ModDir: mods}, out); err == nil {
		t.Error("initramfs without virtio_console/virtio_blk accepted")
	}
}

func TestDisks(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 (e2fsprogs) not installed")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "hello"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "root.ext4")
	if err := RootDisk(context.Background(), root, img); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("debugfs", "-R", "cat /etc/hello", img).Output(); err == nil && string(out) != "hi\n" {
		t.Errorf("debugfs cat: %q", out)
	}
	blank := filepath.Join(dir, "upper.ext4")
	if err := BlankDisk(context.Background(), blank, 1<<30); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(blank)
	if err != nil || fi.Size() != 1<<30 {
		t.Fatalf("blank disk: %v %v", fi, err)
	}
	if _, err := os.Stat(blank + ".tmp"); !os.IsNotExist(err) {
		t.Error("temporary file left")
	}
}

func TestExtractVmlinuxRejectsNonKernel(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(p, []byte("not a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ExtractVmlinux(context.Background(), p, p+".out"); err == nil {
		t.Fatal("accepted a file without an XZ payload")
	}
	if _, err := os.Stat(p + ".out"); !os.IsNotExist(err) {
		t.Error("output written for a bad kernel")
	}
}
