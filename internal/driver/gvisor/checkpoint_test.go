package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentlisten"
)

func counter(t *testing.T, inst driver.Instance) int {
	t.Helper()
	n, err := strconv.Atoi(drivertest.MustSh(t, inst, "tail -n 1 /root/count"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCheckpointRestore checkpoints a sandbox running a counting loop
// (it stays paused, then continues when resumed), deletes it, and
// restores it twice (a restore and a fork) from the image on a fresh
// driver: each continues the count from where it stopped.
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
	if cs, err := d.r.state(testCtx(t), inst.id); err != nil || cs.Status != "paused" {
		t.Fatalf("after checkpoint: %+v %v, want paused", cs, err)
	}
	// Save the layer while paused, as a snapshot would.
	saved := filepath.Join(base, "layer")
	if out, err := exec.Command("cp", "-a", layer.Dir, saved).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	stopped, _ := os.ReadFile(filepath.Join(saved, "root/count"))
	last := strings.Fields(string(stopped))
	time.Sleep(200 * time.Millisecond)
	if again, _ := os.ReadFile(filepath.Join(layer.Dir, "root/count")); string(again) != string(stopped) {
		t.Errorf("the count moved while the checkpointed sandbox was paused")
	}
	// The source continues, and its agent listens again.
	if err := inst.Resume(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	var src int
	for i := 0; i < 100; i++ {
		if _, _, err := drivertest.Sh(testCtx(t), inst, "true"); err == nil {
			src = counter(t, inst)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if now := counter(t, inst); src == 0 || now <= src {
		t.Errorf("source after resume: count %d then %d", src, now)
	}
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	size := dirSize(img)

	d2 := newDriver(t, d.opts) // as after a node restart
	for _, id := range []string{"ck-restored", "ck-fork"} {
		t1 := time.Now()
		re, err := d2.Restore(testCtx(t), driver.Spec{ID: id, RootfsDir: rootfs, Limits: driver.Limits{MemoryBytes: 256 << 20}, InitLayer: drivertest.CopyLayer(saved, layer.UIDBase)}, img)
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

// BenchmarkCheckpointRestore measures Checkpoint (runsc checkpoint of the
// paused sandbox, -leave-running) and Restore (a new sandbox from the
// image, agent answering) for an idle sandbox and one holding 64 MiB of
// random data in its memory (/dev/shm is sentry memory), and the image
// size. Each iteration checkpoints the same running source, resumes it and
// restores the image once as a new sandbox.
func BenchmarkCheckpointRestore(b *testing.B) {
	requireRunsc(b)
	for _, mib := range []int{0, 64} {
		b.Run(fmt.Sprintf("shm=%dMiB", mib), func(b *testing.B) {
			base := shortDir(b)
			d := newDriver(b, testOptions(b, base))
			src := create(b, d, "bsrc", driver.Limits{MemoryBytes: 512 << 20})
			drivertest.MustSh(b, src, fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/m bs=1M count=%d 2>/dev/null; sh -c 'while :; do sleep 0.1; done' >/dev/null 2>&1 &", mib))
			layer, _ := src.WritableLayer()
			var ck, rs time.Duration
			var size int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				img := filepath.Join(base, fmt.Sprintf("img%d", i))
				saved := filepath.Join(base, fmt.Sprintf("layer%d", i))
				b.StartTimer()
				t0 := time.Now()
				if err := src.Checkpoint(testCtx(b), img); err != nil {
					b.Fatal(err)
				}
				ck += time.Since(t0)
				b.StopTimer()
				if out, err := exec.Command("cp", "-a", layer.Dir, saved).CombinedOutput(); err != nil {
					b.Fatalf("%v %s", err, out)
				}
				if err := src.Resume(testCtx(b)); err != nil {
					b.Fatal(err)
				}
				size = dirSize(img)
				b.StartTimer()
				t1 := time.Now()
				re, err := d.Restore(testCtx(b), driver.Spec{ID: fmt.Sprintf("brs%d", i), RootfsDir: rootfs, Limits: driver.Limits{MemoryBytes: 512 << 20}, InitLayer: drivertest.CopyLayer(saved, layer.UIDBase)}, img)
				if err != nil {
					b.Fatal(err)
				}
				rs += time.Since(t1)
				b.StopTimer()
				if err := re.Destroy(testCtx(b)); err != nil {
					b.Fatal(err)
				}
				_ = os.RemoveAll(img)
				_ = os.RemoveAll(saved)
				b.StartTimer()
			}
			b.ReportMetric(float64(ck.Microseconds())/1000/float64(b.N), "checkpoint-ms")
			b.ReportMetric(float64(rs.Microseconds())/1000/float64(b.N), "restore-ms")
			b.ReportMetric(float64(size)/(1<<20), "image-MiB")
		})
	}
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// TestDialDuringCheckpoint: a command started while a checkpoint has the
// agent's listener released (a periodic checkpoint beside a command; CI:
// "dial unix …: connect: connection refused") waits for the sandbox to
// run again and then runs, instead of failing.
func TestDialDuringCheckpoint(t *testing.T) {
	requireRunsc(t)
	base := shortDir(t)
	d := newDriver(t, testOptions(t, base))
	inst := create(t, d, "dc", driver.Limits{MemoryBytes: 256 << 20})
	defer inst.Destroy(testCtx(t))
	resumed := make(chan time.Time, 1)
	ckErr := make(chan error, 1)
	go func() {
		err := inst.Checkpoint(testCtx(t), filepath.Join(base, "image"))
		// Hold it paused a while, as a snapshot's layer copy does.
		time.Sleep(300 * time.Millisecond)
		resumed <- time.Now()
		ckErr <- errors.Join(err, inst.Resume(testCtx(t)))
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		// The agent has released its listener.
		if _, err := os.Stat(inst.sock + agentlisten.MarkerSuffix); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the checkpoint never released the agent's listener")
		}
	}
	out, x, err := drivertest.Sh(testCtx(t), inst, "echo during")
	done := time.Now()
	if err != nil || x.Code != 0 || out != "during\n" {
		t.Fatalf("command during the checkpoint: %q %+v %v", out, x, err)
	}
	if err := <-ckErr; err != nil {
		t.Fatal(err)
	}
	if r := <-resumed; done.Before(r) {
		t.Errorf("the command answered at %v, before the resume at %v", done, r)
	}
	// Right after a resume the agent may not listen yet (it polls for
	// its marker): a call the node held while the sandbox was paused
	// comes at that moment, and must wait for it too.
	if err := inst.Checkpoint(testCtx(t), filepath.Join(base, "image2")); err != nil {
		t.Fatal(err)
	}
	if err := inst.Resume(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if out, x, err := drivertest.Sh(testCtx(t), inst, "echo after"); err != nil || x.Code != 0 || out != "after\n" {
		t.Fatalf("command right after the resume: %q %+v %v", out, x, err)
	}
}
