package gvisor

import (
	"testing"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

func TestConformance(t *testing.T) {
	requireRunsc(t)
	drivers := map[string]*Driver{}
	drivertest.Run(t, drivertest.Env{
		Open: func(t *testing.T, dir string) driver.Driver {
			// t.TempDir paths are too long for runsc's sockets: map each
			// to a short dir of its own.
			short, ok := drivers[dir]
			var d *Driver
			if !ok {
				d = newDriver(t, testOptions(t, shortDir(t)))
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
	})
}
