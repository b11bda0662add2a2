package namespace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

func TestConformance(t *testing.T) { conformance(t, 0, "") }

// TestConformanceCgroupParent runs the suite with the sandboxes' cgroups
// below a fixed parent in the host's tree (--cgroup-parent, a node in a
// Kubernetes pod), re-attach after a restart included.
func TestConformanceCgroupParent(t *testing.T) {
	parent := fmt.Sprintf("/space-test-parent-%d", os.Getpid())
	t.Cleanup(func() {
		m, err := cgroups.NewUnder(parent, testOptions(t).CgroupBase)
		if err != nil {
			return
		}
		m.RemoveBase()
		for _, d := range m.Paths("x").Dirs {
			_ = os.Remove(filepath.Dir(filepath.Dir(d)))
		}
	})
	conformance(t, 0, parent)
}

// TestConformanceDisk runs the suite with every sandbox on a disk of its
// own (a 64 MiB default disk limit), plus the DiskLimit case.
func TestConformanceDisk(t *testing.T) {
	if err := diskquota.Available(); err != nil {
		t.Skip(err)
	}
	conformance(t, 64<<20, "")
}

func conformance(t *testing.T, disk int64, cgroupParent string) {
	requireSandbox(t)
	opts := func(dir string) Options {
		o := testOptions(t)
		o.StateDir = filepath.Join(dir, "state")
		o.RunDir = filepath.Join(dir, "run")
		o.CgroupParent = cgroupParent
		return o
	}
	drivertest.Run(t, drivertest.Env{
		DiskLimits: disk > 0,
		Open: func(t *testing.T, dir string) driver.Driver {
			o := opts(dir)
			o.Logf = t.Logf
			if disk > 0 {
				m, err := diskquota.New(diskquota.Options{CacheDir: filepath.Join(dir, "disks"), Logf: t.Logf})
				if err != nil {
					t.Fatal(err)
				}
				o.Disks, o.DefaultLimits.DiskBytes = m, disk
			}
			return newDriver(t, o)
		},
		Rootfs: rootfs,
		Leftovers: func(t *testing.T, dir, id string) []string {
			o := opts(dir)
			d := &Driver{opts: o}
			var left []string
			cg, err := New(o)
			if err != nil {
				return []string{err.Error()}
			}
			for _, p := range append([]string{d.sandboxDir(id), d.sockPath(id)}, cg.cg.Paths(id).Dirs...) {
				if _, err := os.Lstat(p); err == nil {
					left = append(left, p)
				}
			}
			if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), filepath.Join(o.StateDir, id)) {
				left = append(left, "a mount under "+filepath.Join(o.StateDir, id))
			}
			left = append(left, diskquota.LoopsBacking(filepath.Join(o.StateDir, id))...)
			return left
		},
	})
}

// BenchmarkConformanceCreateDestroy measures what the gvisor driver's
// BenchmarkCreateDestroy does, for side-by-side numbers.
func BenchmarkConformanceCreateDestroy(b *testing.B) {
	requireSandbox(b)
	drivertest.Bench(b, drivertest.Env{Rootfs: rootfs}, b.TempDir(), func(dir string) driver.Driver {
		o := testOptions(b)
		o.StateDir = filepath.Join(dir, "state")
		o.RunDir = filepath.Join(dir, "run")
		o.Logf = func(string, ...any) {}
		return newDriver(b, o)
	})
}

// BenchmarkConformanceCreateDestroyDisk: the same with a 1 GiB disk per
// sandbox (the blank image made before the timer starts).
func BenchmarkConformanceCreateDestroyDisk(b *testing.B) {
	requireSandbox(b)
	if err := diskquota.Available(); err != nil {
		b.Skip(err)
	}
	drivertest.Bench(b, drivertest.Env{Rootfs: rootfs}, b.TempDir(), func(dir string) driver.Driver {
		o := testOptions(b)
		o.StateDir = filepath.Join(dir, "state")
		o.RunDir = filepath.Join(dir, "run")
		o.Logf = func(string, ...any) {}
		m, err := diskquota.New(diskquota.Options{CacheDir: filepath.Join(dir, "disks")})
		if err != nil {
			b.Fatal(err)
		}
		o.Disks, o.DefaultLimits.DiskBytes = m, 1<<30
		mnt := filepath.Join(dir, "warm")
		os.Mkdir(mnt, 0o755)
		if err := m.Create(context.Background(), filepath.Join(dir, "warm.img"), mnt, 1<<30); err != nil {
			b.Fatal(err)
		}
		diskquota.Remove(filepath.Join(dir, "warm.img"), mnt)
		return newDriver(b, o)
	})
}
