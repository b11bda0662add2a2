package qemu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver"
)

func TestDebugBoot(t *testing.T) {
	requireVM(t)
	d := newDriver(t, testOptions(t, t.TempDir()))
	ctx := context.Background()
	for _, id := range []string{"dbg1", "dbg2"} {
		t0 := time.Now()
		inst, err := d.Create(ctx, driver.Spec{ID: id, RootfsDir: rootfs})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %v", id, time.Since(t0))
		b, _ := os.ReadFile(filepath.Join(d.sandboxDir(id), "console.log"))
		t.Logf("console: %s", b)
		inst.Destroy(ctx)
	}
}
