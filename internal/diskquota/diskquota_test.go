package diskquota

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newTestManager(t testing.TB) *Manager {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err)
	}
	m, err := New(Options{CacheDir: filepath.Join(t.TempDir(), "cache"), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// disk makes a disk of size bytes at dir/name.{img,mnt}, removed at the
// end of the test.
func disk(t *testing.T, m *Manager, dir, name string, size int64) (img, mnt string) {
	t.Helper()
	img, mnt = filepath.Join(dir, name+".img"), filepath.Join(dir, name)
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.Create(context.Background(), img, mnt, size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(img, mnt) })
	up := filepath.Join(mnt, "upper")
	if err := os.Mkdir(up, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(up, 100000, 100000); err != nil {
		t.Fatal(err)
	}
	return img, mnt
}

// fill writes mib MiB to path as an unprivileged host user and returns
// dd's output.
func fill(path string, mib int) (string, error) {
	cmd := exec.Command("dd", "if=/dev/zero", "of="+path, "bs=1M", "count="+strconv.Itoa(mib), "conv=fsync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 100000, Gid: 100000}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func TestDiskLimit(t *testing.T) {
	m := newTestManager(t)
	dir := t.TempDir()
	// The writer is an unprivileged user: it must reach the disks.
	for p := dir; p != "/"; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
			os.Chmod(p, fi.Mode().Perm()|0o011)
		}
	}
	t0 := time.Now()
	imgA, a := disk(t, m, dir, "a", 32<<20)
	t.Logf("first create (mkfs of the blank): %v", time.Since(t0))
	t0 = time.Now()
	_, b := disk(t, m, dir, "b", 32<<20)
	t.Logf("second create (copy of the blank): %v", time.Since(t0))
	if !Mounted(a) || !Mounted(b) {
		t.Fatal("not mounted")
	}
	size, used, err := Size(a)
	if err != nil || size > 32<<20 || size < 30<<20 {
		t.Fatalf("size %d used %d: %v", size, used, err)
	}
	if n := allocated(t, imgA); n > 2<<20 {
		t.Fatalf("a blank 32 MiB image allocates %d bytes on the host", n)
	}
	out, err := fill(filepath.Join(a, "upper", "big"), 64)
	if err == nil || !strings.Contains(out, "No space left on device") {
		t.Fatalf("64 MiB into a 32 MiB disk: %v %q", err, out)
	}
	if n := allocated(t, imgA); n > 33<<20 {
		t.Fatalf("the host gave %d bytes to a 32 MiB disk", n)
	}
	// The other disk is unaffected.
	if out, err := fill(filepath.Join(b, "upper", "f"), 16); err != nil {
		t.Fatalf("other disk: %v %s", err, out)
	}
	// Deleting gives the host its space back (discard punches holes).
	if err := os.Remove(filepath.Join(a, "upper", "big")); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	if n := allocated(t, imgA); n > 4<<20 {
		t.Logf("after deleting: the image still allocates %d bytes (no discard?)", n)
	}
	if err := Remove(imgA, a); err != nil {
		t.Fatal(err)
	}
	if Mounted(a) {
		t.Fatal("still mounted")
	}
	if _, err := os.Stat(imgA); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image left: %v", err)
	}
	if err := Remove(imgA, a); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func BenchmarkCreateRemove(b *testing.B) {
	m := newTestManager(b)
	dir := b.TempDir()
	img, mnt := filepath.Join(dir, "d.img"), filepath.Join(dir, "d")
	os.Mkdir(mnt, 0o755)
	if err := m.Create(context.Background(), img, mnt, 1<<30); err != nil { // the blank
		b.Fatal(err)
	}
	if err := Remove(img, mnt); err != nil {
		b.Fatal(err)
	}
	var create, remove time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := m.Create(context.Background(), img, mnt, 1<<30); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := Remove(img, mnt); err != nil {
			b.Fatal(err)
		}
		create += t1.Sub(t0)
		remove += time.Since(t1)
	}
	b.ReportMetric(float64(create.Microseconds())/float64(b.N)/1000, "create-ms")
	b.ReportMetric(float64(remove.Microseconds())/float64(b.N)/1000, "remove-ms")
}
