package multinode

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// counterLoop is a shell loop that writes 1, 2, 3, … into file every
// 0.1 s. Each value is written to file.new and renamed over file, so a
// reader never sees the file empty: `echo $i > file` truncates before it
// writes, and a read in between (about 1 in 100 reads under load) gets
// "" — which TestFleetRollingUpgrade took for a counter that did not come
// back after a move (CI of stop 36).
func counterLoop(file string) string {
	return "(i=0; while true; do i=$((i+1)); echo $i > " + file + ".new; mv " + file + ".new " + file + "; sleep 0.1; done) >/dev/null 2>&1 </dev/null &"
}

// TestCounterLoopNeverEmpty runs counterLoop on the host and reads its
// file as fast as it can for a second: every read is a number.
func TestCounterLoopNeverEmpty(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skipf("needs a shell: %v", err)
	}
	file := filepath.Join(t.TempDir(), "count")
	cmd := exec.Command(sh, "-c", strings.TrimSuffix(counterLoop(file), "&"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(file); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the counter never wrote its file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	reads, last := 0, 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); reads++ {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("read %d: %v", reads, err)
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || v < last {
			t.Fatalf("read %d: %q after %d", reads, b, last)
		}
		last = v
	}
	if last < 3 {
		t.Fatalf("counter at %d after a second: not counting", last)
	}
	t.Logf("%d reads, counter %d", reads, last)
}
