package integration

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"golang.org/x/sys/unix"
)

// Disk and output bounds of the servers in this file.
const (
	diskDefault = 64 << 20  // --default-disk-bytes
	diskMax     = 256 << 20 // --max-disk-bytes
	outputBound = 8 << 20   // --max-output-bytes
)

// boundedEnv starts a `space server` with disk limits and a small bound
// on kept command output, and a warm pool of one: drv is "namespace" or
// "gvisor". It is stopped and removed when the test ends.
func boundedEnv(t *testing.T, drv string) *env {
	t.Helper()
	need(t)
	if err := diskquota.Available(); err != nil {
		t.Skip(err)
	}
	if drv == gvisor.Name {
		if _, err := gvisor.FindRunsc(os.Getenv("SPACE_RUNSC")); err != nil {
			t.Skipf("gvisor driver unavailable: %v", err)
		}
	}
	return extraServer(t, "space-itdisk-", drv, "--default-disk-bytes", "64M", "--max-disk-bytes", "256M",
		"--max-output-bytes", "8M", "--warm-templates", "minimal", "--warm-pool", "1")
}

// allocated is the bytes the files below dir hold on its filesystem
// (st_blocks; what is mounted below dir, e.g. the sandboxes' disks, is
// counted as their images, not again as their contents).
func allocated(dir string) int64 {
	var n int64
	var root unix.Stat_t
	unix.Lstat(dir, &root)
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			return filepath.SkipDir
		}
		n += st.Blocks * 512
		return nil
	})
	return n
}

// hostFree is the free space of the filesystem holding dir.
func hostFree(t *testing.T, dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// fillOutput writes 200 MiB into a sandbox's writable layer and returns
// the output of dd and ls.
const fillScript = "dd if=/dev/zero of=/root/fill bs=1M count=200 2>&1; sync; ls -l /root/fill"

// fillSize reads the size of /root/fill from fillScript's output.
func fillSize(out string) int64 {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasSuffix(line, "/root/fill") {
			n, _ := strconv.ParseInt(f[4], 10, 64)
			return n
		}
	}
	return -1
}

// TestDiskQuota: a sandbox that writes past its disk limit gets ENOSPC
// at the limit; the host gives it at most the limit (its image's blocks,
// and the data dir as a whole); other sandboxes keep working; a snapshot
// of it forks into a sandbox with the same limit; a restart re-adopts it
// with its disk; removal releases the image, the mount and the loop
// device. Against the namespace and the gvisor driver.
func TestDiskQuota(t *testing.T) {
	for _, drv := range []string{"namespace", gvisor.Name} {
		t.Run(drv, func(t *testing.T) { testDiskQuota(t, drv) })
	}
}

func testDiskQuota(t *testing.T, drv string) {
	e := boundedEnv(t, drv)
	stateDir := filepath.Join(e.DataDir, "sandboxes")
	if drv == gvisor.Name {
		stateDir = filepath.Join(e.DataDir, "gvisor")
	}
	const limit = 48 << 20
	// Over the maximum, and with disks on but below the minimum: refused.
	for _, bad := range []int64{diskMax + 1<<20, 1 << 20} {
		if st, m, _ := e.call("POST", "/v1/sandboxes", e.key, map[string]any{"template": "minimal", "limits": map[string]any{"disk_bytes": bad}}); st != 400 {
			t.Errorf("disk_bytes %d: %d %v, want 400", bad, st, m)
		}
	}
	// Not a whole MiB: refused, not rounded silently (issue 22).
	if st, m, _ := e.call("POST", "/v1/sandboxes", e.key, map[string]any{"template": "minimal", "limits": map[string]any{"disk_bytes": limit + 4096}}); st != 400 || !strings.Contains(fmt.Sprint(m), "whole number of MiB") {
		t.Errorf("disk_bytes %d: %d %v, want 400 naming whole MiB", limit+4096, st, m)
	}
	full := e.create(t, map[string]any{"limits": map[string]any{"disk_bytes": limit}}) // cold: not the warm pool's size
	other := e.create(t, nil)                                                          // the warm one, default disk
	if _, sb, _ := e.call("GET", "/v1/sandboxes/"+other.ID, e.key, nil); sb["limits"].(map[string]any)["disk_bytes"] != float64(diskDefault) {
		t.Errorf("default disk limit: %v", sb["limits"])
	}
	img := filepath.Join(stateDir, full.ID, "disk.img")
	// The disk is the sandbox's root filesystem's upper layer; nothing
	// inside names where it lives on the host.
	if out, _ := full.sh(t, "cat /proc/self/mountinfo /proc/1/mountinfo; df -k /"); strings.Contains(out, e.DataDir) || strings.Contains(out, "disk.img") {
		t.Errorf("the sandbox sees host paths of its disk:\n%s", out)
	} else {
		t.Logf("inside:\n%s", out)
	}
	dataBefore, freeBefore := allocated(e.DataDir), hostFree(t, e.DataDir)

	out, ex := full.sh(t, fillScript)
	t.Logf("fill: exit %+v\n%s", ex, out)
	if !strings.Contains(out, "No space left on device") {
		t.Fatalf("no ENOSPC writing 200 MiB under a 48 MiB disk limit:\n%s", out)
	}
	if n := fillSize(out); n > limit || n < limit/2 {
		t.Errorf("the sandbox wrote %d bytes under a %d-byte limit", n, limit)
	}
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil {
		t.Fatalf("disk image: %v", err)
	}
	if st.Size != limit || st.Blocks*512 > limit {
		t.Errorf("disk image: size %d, %d bytes allocated on the host; limit %d", st.Size, st.Blocks*512, limit)
	}
	const slack = 8 << 20
	grew, freeDrop := allocated(e.DataDir)-dataBefore, freeBefore-hostFree(t, e.DataDir)
	t.Logf("host: data dir +%d MiB, filesystem free -%d MiB (other users of the host count in the latter)", grew>>20, freeDrop>>20)
	if grew > limit+slack {
		t.Errorf("the data dir grew by %d bytes for a sandbox limited to %d", grew, limit)
	}

	// The others are unaffected: the warm sandbox writes within its own
	// limit and is bounded by it too; a new sandbox works.
	if out, ex := other.sh(t, "dd if=/dev/zero of=/root/f bs=1M count=32 2>&1 && sync && cat /root/f | wc -c"); ex.Code != 0 || !strings.Contains(out, strconv.Itoa(32<<20)) {
		t.Fatalf("the other sandbox could not write: %+v %s", ex, out)
	}
	if out, _ := other.sh(t, fillScript); !strings.Contains(out, "No space left on device") || fillSize(out) > diskDefault {
		t.Errorf("the warm sandbox's default limit: %s", out)
	}
	third := e.create(t, map[string]any{"limits": map[string]any{"disk_bytes": 32 << 20}})
	if out, ex := third.sh(t, "echo fine > /root/x && cat /root/x"); ex.Code != 0 || strings.TrimSpace(out) != "fine" {
		t.Fatalf("a new sandbox: %+v %q", ex, out)
	}
	// The full sandbox works again once it deletes.
	if out, ex := full.sh(t, "rm /root/fill && dd if=/dev/zero of=/root/keep bs=1M count=4 2>/dev/null && echo ok"); ex.Code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("after deleting: %+v %s", ex, out)
	}

	// Snapshot and fork: the fork has the file, the source's limit, and
	// its own disk of that size.
	st2, m, err := e.call("POST", "/v1/sandboxes/"+full.ID+"/snapshots", e.key, nil)
	if err != nil || st2 != 202 {
		t.Fatalf("snapshot: %d %v %v", st2, m, err)
	}
	done := e.waitOp(t, m["operation"].(map[string]any)["id"].(string))
	if done["state"] != "succeeded" {
		t.Fatalf("snapshot: %v", done)
	}
	snapID := done["result"].(map[string]any)["id"].(string)
	st2, m, err = e.call("POST", "/v1/snapshots/"+snapID+"/fork", e.key, map[string]any{"count": 1})
	if err != nil || st2 != 202 {
		t.Fatalf("fork: %d %v %v", st2, m, err)
	}
	item := m["sandboxes"].([]any)[0].(map[string]any)
	if done := e.waitOp(t, item["operation"].(map[string]any)["id"].(string)); done["state"] != "succeeded" {
		t.Fatalf("fork: %v", done)
	}
	sess := item["session"].(map[string]any)
	fork := &sandbox{e: e, ID: item["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), Data: sess["data_url"].(string)}
	if out, _ := fork.sh(t, "wc -c < /root/keep; "+fillScript); !strings.Contains(out, strconv.Itoa(4<<20)) ||
		!strings.Contains(out, "No space left on device") || fillSize(out) > limit {
		t.Errorf("fork: %s", out)
	}
	if fi, err := os.Stat(filepath.Join(stateDir, fork.ID, "disk.img")); err != nil || fi.Size() != limit {
		t.Errorf("fork's disk image: %v %v", fi, err)
	}

	// A restart re-adopts the sandbox with its disk and limit.
	e.Stop()
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	if out, ex := full.sh(t, "cat /root/keep | wc -c; "+fillScript); ex.Code != 0 || !strings.Contains(out, strconv.Itoa(4<<20)) ||
		!strings.Contains(out, "No space left on device") {
		t.Errorf("after a restart: %+v %s", ex, out)
	}

	// Removal releases the disk: image, mount point, loop device.
	for _, sb := range []*sandbox{full, other, third, fork} {
		sb.delete(t)
		deadline := time.Now().Add(5 * time.Second)
		for {
			left := diskquota.LoopsBacking(filepath.Join(stateDir, sb.ID))
			if _, err := os.Lstat(filepath.Join(stateDir, sb.ID)); err == nil {
				left = append(left, "state dir")
			}
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("sandbox %s left: %v", sb.ID, left)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestOutputBound: a command writing 200 MB (40 MB under gVisor, whose
// pipes are slower) under an 8 MiB bound on kept output: a reader from the
// start gets a "dropped" event (what is gone) and then the newest output up
// to the exit, exactly the rest; a reader resuming with Last-Event-ID
// inside what was dropped gets the same; the command's log holds about
// 8 MiB on the host.
func TestOutputBound(t *testing.T) {
	for _, drv := range []string{"namespace", gvisor.Name} {
		t.Run(drv, func(t *testing.T) { testOutputBound(t, drv) })
	}
}

func testOutputBound(t *testing.T, drv string) {
	e := boundedEnv(t, drv)
	sb := e.create(t, nil)
	defer sb.delete(t)
	total := 200_000_000
	if drv == gvisor.Name {
		total = 40_000_000
	}
	t0 := time.Now()
	cid := sb.start(t, map[string]any{"shell": "yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c " + strconv.Itoa(total)})
	// Follow it live for a while (the server must not wait for this
	// reader), then let it finish.
	sb.stream(t, cid, "", 4<<20, nil)
	var exited bool
	for i := 0; i < 600 && !exited; i++ {
		_, c, _ := sb.dp("GET", "/commands/"+cid, nil)
		exited = c["running"] == false
		if !exited {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !exited {
		t.Fatal("command did not finish")
	}
	t.Logf("%d bytes of output in %v", total, time.Since(t0))
	_, c, _ := sb.dp("GET", "/commands/"+cid, nil)
	if c["output_truncated"] != true {
		t.Errorf("command view: %v", c)
	}
	logFile := filepath.Join(e.DataDir, "logs", sb.ID, cid+".log")
	var st unix.Stat_t
	if err := unix.Stat(logFile, &st); err != nil {
		t.Fatalf("command log: %v", err)
	}
	t.Logf("log: %d bytes long, %d on disk", st.Size, st.Blocks*512)
	if st.Blocks*512 > outputBound+1<<20 {
		t.Errorf("the command's log holds %d bytes on the host under an %d-byte bound", st.Blocks*512, outputBound)
	}
	if n := allocated(filepath.Join(e.DataDir, "logs")); n > outputBound+2<<20 {
		t.Errorf("the logs dir holds %d bytes", n)
	}

	// From the start (and from a position inside what was dropped): the
	// marker, then the kept output, then the exit.
	for _, after := range []string{"", "3"} {
		var marker map[string]any
		var markerID string
		var kept int64
		var firstSeq string
		last, ex := sb.stream(t, cid, after, 0, func(ev event) {
			switch ev.Type {
			case "dropped":
				if marker != nil || kept > 0 {
					t.Errorf("a second marker, or one after output: %s", ev.Data)
				}
				json.Unmarshal(ev.Data, &marker)
				markerID = ev.ID
			case "stdout":
				if firstSeq == "" {
					firstSeq = ev.ID
				}
				kept += int64(len(ev.Data))
			}
		})
		if ex == nil || ex.Code != 0 {
			t.Fatalf("after %q: exit %+v (last %s)", after, ex, last)
		}
		if marker == nil {
			t.Fatalf("after %q: no dropped event", after)
		}
		dropped := int64(marker["dropped_bytes"].(float64))
		first := strconv.FormatInt(int64(marker["first_seq"].(float64)), 10)
		t.Logf("after %q: marker %v (id %s), then %d bytes from event %s", after, marker, markerID, kept, firstSeq)
		if dropped+kept != int64(total) || first != firstSeq || markerID != strconv.FormatInt(int64(marker["first_seq"].(float64))-1, 10) {
			t.Errorf("after %q: dropped %d + kept %d bytes != %d, or first_seq %s vs first event %s, marker id %s", after, dropped, kept, total, first, firstSeq, markerID)
		}
		if kept > outputBound || kept < outputBound/2 {
			t.Errorf("after %q: %d bytes kept under an %d-byte bound", after, kept, outputBound)
		}
	}
}
