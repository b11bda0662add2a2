package qemu

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

// TestConformance runs the shared driver suite against TCG VMs. It boots
// about ten VMs (≈ 5 s each on a loaded 2-core host), so it runs only when
// SPACE_TEST_QEMU_CONFORMANCE=1; TestCreateExecDestroy covers the VM path in
// the default suite. The Limits subtest fails by design: a VM's memory and
// vCPUs are fixed at boot and OOM kills happen in the guest kernel (see
// docs/drivers.md).
func TestConformance(t *testing.T) {
	requireVM(t)
	if os.Getenv("SPACE_TEST_QEMU_CONFORMANCE") != "1" {
		t.Skip("set SPACE_TEST_QEMU_CONFORMANCE=1 to run the driver suite against qemu (≈ 1 min under TCG)")
	}
	drivers := map[string]Options{}
	drivertest.Run(t, drivertest.Env{
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
			d := &Driver{opts: drivers[dir]}
			d.opts.StateDir = filepath.Join(dir, "state")
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
