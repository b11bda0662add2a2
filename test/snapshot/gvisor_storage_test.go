package snapshot_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/criu"
)

// heapScript starts a busybox awk process that holds about 43 MiB of
// strings in memory (32 MiB of random bytes in base64: memory that
// compresses about as well as a real heap, not 100-fold like repeated
// strings would) and, each time /root/gen changes, puts 256 new strings
// of 4 KiB of random digits in its table (1 MiB of its heap) and then
// writes the generation to /root/done.
const heapScript = `cat > /root/heap.awk <<'AWK'
function page(   p, q, i, j) {
  p = ""
  for (i = 0; i < 16; i++) {
    q = ""
    for (j = 0; j < 16; j++) q = q sprintf("%016d", int(rand() * 1e15))
    p = p q
  }
  return p
}
BEGIN {
  srand(1); cmd = "head -c 33554432 /dev/urandom | base64"
  while ((cmd | getline l) > 0) a[n++] = l
  close(cmd)
  gen = ""
  while (1) {
    g = ""; getline g < "/root/gen"; close("/root/gen")
    if (g != "" && g != gen) {
      for (k = 0; k < 256; k++) a[int(rand() * n)] = page()
      gen = g
      print g > "/root/done"; close("/root/done")
    }
    system("sleep 0.05")
  }
}
AWK
echo 0 > /root/gen
awk -f /root/heap.awk >/dev/null 2>&1 &
for i in $(seq 600); do [ "$(cat /root/done 2>/dev/null)" = 0 ] && exit 0; sleep 0.1; done; exit 1`

// storeBytes is the size of every object in the server's snapshot store.
func (e *env) storeBytes(t *testing.T) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(filepath.Join(e.DataDir, "snapshots"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(filepath.Join(e.DataDir, "snapshots"), p); strings.HasPrefix(rel, "tmp") || d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Ten process snapshots of a gVisor sandbox whose process changes 1 MiB
// of its memory between them add less than twice what the first added to
// the store (chunks and manifests, measured on disk), and the last one
// restores with the process still running.
func TestGvisorImageStorage(t *testing.T) {
	testImageStorage(t, needGvisor(t))
}

// The same with the namespace driver's CRIU images: CRIU dumps every page
// each time, so what dedup finds is the page store's, not the kernel's.
func TestNamespaceImageStorage(t *testing.T) {
	e := need(t)
	if _, _, err := criu.ProbeSandboxes(context.Background(), ""); err != nil {
		t.Skipf("no CRIU for the namespace driver: %v", err)
	}
	testImageStorage(t, e)
}

func testImageStorage(t *testing.T, e *env) {
	sb := e.create(t, map[string]any{"timeout_seconds": 600, "limits": map[string]any{"memory_bytes": 512 << 20}})
	defer sb.delete(t)
	sb.ok(t, heapScript)
	var first, total int64
	var last string
	for i := 0; i < 10; i++ {
		if i > 0 {
			sb.ok(t, `echo `+strconv.Itoa(i)+` > /root/gen; for i in $(seq 600); do [ "$(cat /root/done)" = `+strconv.Itoa(i)+` ] && exit 0; sleep 0.05; done; exit 1`)
		}
		before := e.storeBytes(t)
		t0 := time.Now()
		_, done := e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", nil)
		took := time.Since(t0)
		added := e.storeBytes(t) - before
		res := done["result"].(map[string]any)
		if res["kind"] != "process" {
			t.Fatalf("snapshot %d: %v", i, res)
		}
		last = str(res, "id")
		t.Logf("snapshot %d: %v, image %.0f B, store grew %d B (process chunks %.0f B, reported stored %.0f B)", i, took.Round(time.Millisecond),
			num(res, "stats", "process_image_bytes"), added, num(res, "stats", "process_chunk_bytes"), num(res, "stats", "bytes_stored"))
		if i == 0 {
			first = added
		}
		id := str(res, "id")
		t.Cleanup(func() { e.op(t, "DELETE", "/v1/snapshots/"+id, nil) })
		total += added
	}
	t.Logf("ten snapshots: %d B in the store, %.2f x the first (%d B)", total, float64(total)/float64(first), first)
	if first <= 0 || total >= 2*first {
		t.Errorf("ten snapshots stored %d bytes, the first %d: want less than twice", total, first)
	}
	// The last snapshot restores with the process holding its heap.
	m := e.must(t, 202, "POST", "/v1/snapshots/"+last+"/fork", map[string]any{"count": 1})
	item := m["sandboxes"].([]any)[0].(map[string]any)
	if done := e.waitOp(t, str(item, "operation", "id")); done["state"] != "succeeded" {
		t.Fatalf("fork: %v", done)
	}
	f := sessionSandbox(e, item)
	defer f.delete(t)
	f.ok(t, `echo 10 > /root/gen; for i in $(seq 600); do [ "$(cat /root/done)" = 10 ] && exit 0; sleep 0.05; done; exit 1`)
}
