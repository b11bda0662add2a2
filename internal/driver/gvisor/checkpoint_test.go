package gvisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

// copyLayer copies a writable layer (ownership and all) with cp -a.
func copyLayer(src string) func(ctx context.Context, l driver.Layer) error {
	return func(ctx context.Context, l driver.Layer) error {
		out, err := exec.CommandContext(ctx, "cp", "-a", src+"/.", l.Dir+"/").CombinedOutput()
		if err != nil {
			return &os.PathError{Op: "cp " + strings.TrimSpace(string(out)), Path: src, Err: err}
		}
		return nil
	}
}

func counter(t *testing.T, inst driver.Instance) int {
	t.Helper()
	n, err := strconv.Atoi(drivertest.MustSh(t, inst, "tail -n 1 /root/count"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCheckpointRestore checkpoints a sandbox running a counting loop,
// deletes it, and restores it twice (a restore and a fork) from the image
// on a fresh driver: each continues the count from where it stopped.
func TestCheckpointRestore(t *testing.T) {
	requireRunsc(t)
	base := shortDir(t)
	d := newDriver(t, testOptions(t, base))
	inst := create(t, d, "ck", driver.Limits{MemoryBytes: 256 << 20})
	drivertest.MustSh(t, inst, "i=0; while :; do i=$((i+1)); echo $i >> /root/count; sleep 0.05; done >/dev/null 2>&1 &")
	time.Sleep(300 * time.Millisecond)
	before := counter(t, inst)
	layer, _ := inst.WritableLayer()
	img := filepath.Join(base, "image")
	t0 := time.Now()
	if err := inst.Checkpoint(testCtx(t), img); err != nil {
		t.Fatal(err)
	}
	tck := time.Since(t0)
	// Save the layer, as a snapshot would, then delete the sandbox.
	saved := filepath.Join(base, "layer")
	if out, err := exec.Command("cp", "-a", layer.Dir, saved).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	stopped, _ := os.ReadFile(filepath.Join(saved, "root/count"))
	last := strings.Fields(string(stopped))
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	var size int64
	_ = filepath.Walk(img, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			size += fi.Size()
		}
		return nil
	})

	d2 := newDriver(t, d.opts) // as after a node restart
	for _, id := range []string{"ck-restored", "ck-fork"} {
		t1 := time.Now()
		re, err := d2.Restore(testCtx(t), driver.Spec{ID: id, RootfsDir: rootfs, Limits: driver.Limits{MemoryBytes: 256 << 20}, InitLayer: copyLayer(saved)}, img)
		if err != nil {
			t.Fatalf("restore %s: %v", id, err)
		}
		t.Cleanup(func() { _ = re.Destroy(context.Background()) })
		trs := time.Since(t1)
		first := counter(t, re)
		time.Sleep(300 * time.Millisecond)
		later := counter(t, re)
		t.Logf("%s: before checkpoint %d, at checkpoint %s, after restore %d then %d; checkpoint %v (%d KiB), restore %v",
			id, before, last[len(last)-1], first, later, tck, size>>10, trs)
		if later <= first || first < before {
			t.Errorf("%s: count did not continue: %d then %d (was %d)", id, first, later, before)
		}
		// The counter continued from the checkpoint, not from 1.
		if out := drivertest.MustSh(t, re, "head -n 1 /root/count; grep -c . /root/count"); !strings.HasPrefix(out, "1\n") {
			t.Errorf("%s: count file %q", id, out)
		}
	}
}
