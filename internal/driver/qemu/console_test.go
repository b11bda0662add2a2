package qemu

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/consolelog"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

// TestConsoleBounded: guest root writes 2 MB to the serial port, whose host
// end is the sandbox's console file. The file stays within its tmpfs of
// consolelog.Bytes, the guest runs on, and destroy leaves nothing behind.
func TestConsoleBounded(t *testing.T) {
	requireVM(t)
	d := newDriver(t, testOptions(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	inst, err := d.Create(ctx, driver.Spec{ID: "con", RootfsDir: rootfs, Limits: driver.Limits{MemoryBytes: 128 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	console := consolelog.Path(d.sandboxDir("con"), "console.log")
	out, exit, err := drivertest.Sh(ctx, inst, "head -c 2000000 /dev/zero | tr '\\0' A > /dev/ttyS0; echo rc=$?")
	t.Logf("2 MB to the serial port: %q %+v %v", out, exit, err)
	fi, err := os.Stat(console)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("host console file: %d bytes", fi.Size())
	if fi.Size() > consolelog.Bytes {
		t.Errorf("console file grew to %d bytes, over %d", fi.Size(), consolelog.Bytes)
	}
	if fi.Size() < consolelog.Bytes/2 {
		t.Errorf("console file has %d bytes: the write did not reach it, the test tests nothing", fi.Size())
	}
	if out := drivertest.MustSh(t, inst, "echo fine"); !strings.Contains(out, "fine") {
		t.Errorf("guest after the console write: %q", out)
	}
	if err := inst.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(d, "con"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
