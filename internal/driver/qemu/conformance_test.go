package qemu

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

// TestConformance runs the shared driver suite against TCG VMs. A TCG boot
// costs ≈ 5 s on a loaded 2-core host, so the suite runs in its shared
// mode (drivertest.Env.ExpensiveCreate): two VMs in all.
func TestConformance(t *testing.T) {
	requireVM(t)
	drivers := map[string]Options{}
	drivertest.Run(t, drivertest.Env{
		ExpensiveCreate: true,
		Open: func(t *testing.T, dir string) driver.Driver {
			o, ok := drivers[dir]
			if !ok {
				o = testOptions(t, dir)
				// Share the image cache between subtests.
				drivers[dir] = o
			}
			o.StateDir = filepath.Join(dir, "state")
			o.Logf = t.Logf
			return newDriver(t, o)
		},
		Rootfs: rootfs,
		Leftovers: func(t *testing.T, dir, id string) []string {
			d, err := New(drivers[dir])
			if err != nil {
				return []string{err.Error()}
			}
			return leftovers(d, id)
		},
	})
}

// BenchmarkCreateDestroy measures boot to agent ready, exec round trips
// and destroy with the shared drivertest.Bench (images already cached
// after the first iteration).
func BenchmarkCreateDestroy(b *testing.B) {
	requireVM(b)
	drivertest.Bench(b, drivertest.Env{Rootfs: rootfs}, b.TempDir(), func(dir string) driver.Driver {
		o := testOptions(b, dir)
		o.Logf = func(string, ...any) {}
		return newDriver(b, o)
	})
}

// cgroupBase gives each test dir its own cgroup directory, so tests never
// sweep a running node's VMs or each other's.
func cgroupBase(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "spacetest-qemu-" + hex.EncodeToString(sum[:4])
}
