package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestRmdirWaitsForLastTask: a group whose last task is still exiting
// when the run closes (CI: "remove .../space-bench-…: device or resource
// busy" on every hierarchy) is removed once the task is gone, not left
// behind with an error.
func TestRmdirWaitsForLastTask(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroup dirs need root")
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	pc, _ := os.ReadFile("/proc/self/cgroup")
	var dir string
	for _, p := range ownPlaces(mi, pc) {
		d := filepath.Join(p.dir, fmt.Sprintf("space-bench-rmdir-%d", os.Getpid()))
		if os.Mkdir(d, 0o755) == nil {
			dir = d
			break
		}
	}
	if dir == "" {
		t.Skip("no cgroup hierarchy to make a group in")
	}
	defer os.Remove(dir)
	cmd := exec.Command("sleep", "0.3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatalf("move the task in: %v", err)
	}
	start := time.Now()
	if err := rmdirWhenEmpty(dir); err != nil {
		t.Fatalf("rmdirWhenEmpty: %v", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("removed after %v, while the task still ran", d)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", dir, err)
	}
	<-done
}
