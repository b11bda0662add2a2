package idmap

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A file stored as host 100000+7 reads as To+7 through the mount, and the
// mount refuses writes: the shared tree stays as it is.
func TestMountMapsOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("idmapped mounts need root")
	}
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	for _, p := range []string{src, dst} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f := filepath.Join(src, "f")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(f, 100007, 100008); err != nil {
		t.Fatal(err)
	}
	c := NewCache()
	defer c.Close()
	m := Mapping{From: 100000, To: 3000000, Count: 65536}
	ns, err := c.UserNS(m)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := c.UserNS(m); again != ns {
		t.Fatal("cache made a second namespace for one mapping")
	}
	if err := Mount(src, dst, ns); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dst, unix.MNT_DETACH)
	fi, err := os.Lstat(filepath.Join(dst, "f"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 3000007 || st.Gid != 3000008 {
		t.Fatalf("through the mount: owner %d:%d, want 3000007:3000008", st.Uid, st.Gid)
	}
	if fi, _ := os.Lstat(f); fi.Sys().(*syscall.Stat_t).Uid != 100007 {
		t.Fatal("the source changed owner")
	}
	if err := os.WriteFile(filepath.Join(dst, "g"), nil, 0o644); err == nil {
		t.Fatal("wrote through the read-only mount")
	}
}

// BenchmarkUserNS is the price of a mapping the cache does not hold yet.
func BenchmarkUserNS(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for i := 0; b.Loop(); i++ {
		f, err := NewUserNS(Mapping{From: 100000, To: uint32(3000000 + i%64*65536), Count: 65536})
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkMount is what every create pays with a cached namespace: an
// idmapped mount of a tree and its detach.
func BenchmarkMount(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	for _, p := range []string{src, dst} {
		if err := os.Mkdir(p, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	ns, err := NewUserNS(Mapping{From: 100000, To: 3000000, Count: 65536})
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	for b.Loop() {
		if err := Mount(src, dst, ns); err != nil {
			b.Fatal(err)
		}
		if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
			b.Fatal(err)
		}
	}
}

func TestProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("idmapped mounts need root")
	}
	dir := t.TempDir()
	if err := Probe(dir); err != nil {
		t.Fatalf("probe on this host's %s: %v", dir, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("probe left %v", ents)
	}
	if err := Probe(filepath.Join(dir, "missing")); err == nil {
		t.Error("probe of a missing dir succeeded")
	}
}
