package namespace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

func TestConformance(t *testing.T) {
	requireSandbox(t)
	opts := func(dir string) Options {
		o := testOptions(t)
		o.StateDir = filepath.Join(dir, "state")
		o.RunDir = filepath.Join(dir, "run")
		return o
	}
	drivertest.Run(t, drivertest.Env{
		Open: func(t *testing.T, dir string) driver.Driver {
			o := opts(dir)
			o.Logf = t.Logf
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
