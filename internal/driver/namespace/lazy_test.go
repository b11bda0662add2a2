package namespace

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

// requireUserfaultfd skips where a lazy restore cannot run: the restored
// tasks get their userfaultfd from /dev/userfaultfd (scripts/criu.sh's
// patch 0005), which root must be able to open.
func requireUserfaultfd(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile("/dev/userfaultfd", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no /dev/userfaultfd (Linux 6.1+, CONFIG_USERFAULTFD): %v", err)
	}
	f.Close()
}

// TestLazyRestore: a fork restored with LazyRestore runs before its
// memory is in, then has every page: a process holding 64 MiB reaches
// its whole size again, its bytes are the ones it wrote, the lazy-pages
// daemon exits cleanly and the image copy goes once it has.
func TestLazyRestore(t *testing.T) {
	requireSandbox(t)
	requireCRIU(t)
	requireUserfaultfd(t)
	o := testOptions(t)
	o.LazyRestore = true
	d := newDriver(t, o)
	inst := create(t, d, "lazysrc", driver.Limits{})
	defer inst.Destroy(context.Background())
	// 64 MiB of a pattern that differs per MiB, then a checksum of it
	// computed before the checkpoint; the same process prints it again
	// when /tmp/again appears, after the restore.
	mustSh(t, inst, `(awk 'BEGIN {
  for (i = 0; i < 64; i++) { s = sprintf("%07d", i); while (length(s) < 1048576) s = s s; m[i] = substr(s, 1, 1048576) }
  sum = 0; for (i = 0; i < 64; i++) sum += length(m[i]) + index(m[i], sprintf("%07d", i)) + i * 7
  print sum > "/tmp/sum1"; close("/tmp/sum1")
  while ((getline line < "/tmp/again") <= 0) { close("/tmp/again"); system("sleep 0.1") }
  sum = 0; for (i = 0; i < 64; i++) sum += length(m[i]) + index(m[i], sprintf("%07d", i)) + i * 7
  print sum > "/tmp/sum2"; close("/tmp/sum2") }' >/dev/null 2>&1 &)`)
	for deadline := time.Now().Add(60 * time.Second); mustSh(t, inst, "cat /tmp/sum1 2>/dev/null; true") == ""; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the 64 MiB holder did not start")
		}
	}
	sum1 := mustSh(t, inst, "cat /tmp/sum1")
	img := t.TempDir()
	if err := inst.Checkpoint(testCtx(t), img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	saved := t.TempDir()
	l, _ := inst.WritableLayer()
	if err := drivertest.CopyLayer(l.Dir, 0)(testCtx(t), driver.Layer{Dir: saved}); err != nil {
		t.Fatal(err)
	}
	if err := inst.Resume(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	// Below the size where lazy pays, a restore stays eager.
	bin, err := d.criuBin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	d.opts.LazyRestoreMin = dirBytes(img) + 1
	if d.lazyRestore(testCtx(t), bin, img) {
		t.Errorf("an image of %d bytes restores lazily with LazyRestoreMin %d", dirBytes(img), d.opts.LazyRestoreMin)
	}
	d.opts.LazyRestoreMin = 0
	t0 := time.Now()
	re, err := d.Restore(testCtx(t), driver.Spec{ID: "lazyfork", RootfsDir: rootfs, InitLayer: drivertest.CopyLayer(saved, l.UIDBase)}, img)
	if err != nil {
		t.Fatalf("lazy restore: %v", err)
	}
	defer re.Destroy(context.Background())
	t.Logf("lazy restore to a serving agent: %v", time.Since(t0))
	ri := re.(*Instance)
	if ri.pages == nil {
		t.Fatal("LazyRestore set, but the restore has no lazy-pages daemon")
	}
	imgCopy := ri.d.sandboxDir("lazyfork") + "/criu"
	select {
	case <-ri.pages.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("the lazy-pages daemon has not finished 60 s after the restore")
	}
	if err := ri.pages.Err(); err != nil {
		t.Fatalf("lazy-pages daemon: %v", err)
	}
	t.Logf("every page in after %v", time.Since(t0))
	mustSh(t, re, "echo go > /tmp/again")
	var sum2 string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if sum2 = mustSh(t, re, "cat /tmp/sum2 2>/dev/null; true"); sum2 != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restored holder never wrote its second checksum")
		}
	}
	if sum2 != sum1 {
		t.Errorf("the restored holder's memory changed: checksum %s before, %s after", sum1, sum2)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(imgCopy); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the restore's image copy %s is still there after its pages are in", imgCopy)
			break
		}
	}
	// The fork checkpoints again, as any sandbox does.
	if err := ri.Checkpoint(testCtx(t), t.TempDir()); err != nil {
		t.Fatalf("checkpoint of the lazily restored sandbox: %v", err)
	}
	if err := ri.Resume(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, re, "echo alive"); got != "alive" {
		t.Errorf("after its own checkpoint: %q", got)
	}
}

// BenchmarkRestoreHeld: a fork of a sandbox whose process holds 64 or
// 512 MiB, restored eagerly and lazily: the time to a serving agent, and
// (lazy) to the last page in.
func BenchmarkRestoreHeld(b *testing.B) {
	requireSandbox(b)
	requireCRIU(b)
	requireUserfaultfd(b)
	for _, c := range []struct {
		mib  int
		lazy bool
	}{{64, false}, {64, true}, {512, false}, {512, true}} {
		name := fmt.Sprintf("%dMiB/eager", c.mib)
		if c.lazy {
			name = fmt.Sprintf("%dMiB/lazy", c.mib)
		}
		lazy := c.lazy
		b.Run(name, func(b *testing.B) {
			o := testOptions(b)
			o.LazyRestore = lazy
			d := newDriver(b, o)
			inst := create(b, d, "rbsrc", driver.Limits{})
			defer inst.Destroy(context.Background())
			mustSh(b, inst, fmt.Sprintf(`(awk 'BEGIN { s = "x"; while (length(s) < %d) s = s s; print length(s) > "/tmp/held"; close("/tmp/held"); while (1) system("sleep 1") }' >/dev/null 2>&1 &)`, c.mib<<20))
			for deadline := time.Now().Add(60 * time.Second); mustSh(b, inst, "cat /tmp/held 2>/dev/null; true") == ""; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatal("the 64 MiB holder did not start")
				}
			}
			img := b.TempDir()
			if err := inst.Checkpoint(context.Background(), img); err != nil {
				b.Fatal(err)
			}
			saved := b.TempDir()
			l, _ := inst.WritableLayer()
			if err := drivertest.CopyLayer(l.Dir, 0)(context.Background(), driver.Layer{Dir: saved}); err != nil {
				b.Fatal(err)
			}
			if err := inst.Resume(context.Background()); err != nil {
				b.Fatal(err)
			}
			var ready, all time.Duration
			for b.Loop() {
				t0 := time.Now()
				re, err := d.Restore(context.Background(), driver.Spec{ID: "rbfork", RootfsDir: rootfs, InitLayer: drivertest.CopyLayer(saved, l.UIDBase)}, img)
				if err != nil {
					b.Fatal(err)
				}
				ready += time.Since(t0)
				if p := re.(*Instance).pages; p != nil {
					if err := p.Err(); err != nil {
						b.Fatal(err)
					}
				}
				all += time.Since(t0)
				if err := re.Destroy(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(ready.Microseconds())/1000/float64(b.N), "ready-ms")
			b.ReportMetric(float64(all.Microseconds())/1000/float64(b.N), "all-pages-ms")
		})
	}
}

// TestFreezeRetryHelpers: the checkpoint's retry after a freeze timeout
// reads a paused sandbox as frozen (v2 and v1 files) and leaves it so,
// thaws what it retries, and empties the image dir it retries into.
func TestFreezeRetryHelpers(t *testing.T) {
	v2, v1 := t.TempDir(), t.TempDir()
	for _, c := range []struct {
		dir, file, content string
		want               bool
	}{
		{v2, "cgroup.freeze", "1\n", true},
		{v2, "cgroup.freeze", "0\n", false},
		{v1, "freezer.state", "FROZEN\n", true},
		{v1, "freezer.state", "THAWED\n", false},
	} {
		if err := os.WriteFile(c.dir+"/"+c.file, []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := frozen(c.dir); got != c.want {
			t.Errorf("frozen with %s %q = %v, want %v", c.file, c.content, got, c.want)
		}
	}
	if err := os.WriteFile(v2+"/cgroup.freeze", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	thaw(v2)
	if frozen(v2) {
		t.Error("thaw left the v2 group frozen")
	}
	img := t.TempDir()
	if err := os.MkdirAll(img+"/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img+"/pages-1.img", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := emptyDir(img); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(img); len(ents) != 0 {
		t.Errorf("emptyDir left %d entries", len(ents))
	}
	if frozen(t.TempDir()) {
		t.Error("a dir without freezer files reads as frozen")
	}
}
