package gvisor

import (
	"path/filepath"
	"testing"

	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

func TestConformance(t *testing.T) { conformance(t, 0) }

// TestConformanceDisk runs the suite with every sandbox on a disk of its
// own (a 64 MiB default disk limit), plus the DiskLimit case.
func TestConformanceDisk(t *testing.T) {
	if err := diskquota.Available(); err != nil {
		t.Skip(err)
	}
	conformance(t, 64<<20)
}

func conformance(t *testing.T, disk int64) {
	requireRunsc(t)
	drivers := map[string]*Driver{}
	drivertest.Run(t, drivertest.Env{
		Open: func(t *testing.T, dir string) driver.Driver {
			// t.TempDir paths are too long for runsc's sockets: map each
			// to a short dir of its own.
			short, ok := drivers[dir]
			var d *Driver
			if !ok {
				o := testOptions(t, shortDir(t))
				if disk > 0 {
					m, err := diskquota.New(diskquota.Options{CacheDir: filepath.Join(dir, "disks"), Logf: t.Logf})
					if err != nil {
						t.Fatal(err)
					}
					o.Disks, o.DefaultLimits.DiskBytes = m, disk
				}
				d = newDriver(t, o)
			} else {
				d = newDriver(t, short.opts)
			}
			drivers[dir] = d
			return d
		},
		Rootfs: rootfs,
		Leftovers: func(t *testing.T, dir, id string) []string {
			return leftovers(drivers[dir], id)
		},
		SandboxDiesOnOOM: true,
		DiskLimits:       disk > 0,
	})
}
