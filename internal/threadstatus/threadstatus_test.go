package threadstatus

import (
	"os"
	"strconv"
	"testing"
)

// TestEach: every thread of this process is visited, the main one among
// them, with its status fields parsed.
func TestEach(t *testing.T) {
	seen := map[string]bool{}
	err := Each(func(tid string, st map[string]string) error {
		seen[tid] = true
		if _, err := Hex(st, "CapBnd"); err != nil {
			return err
		}
		if st["Pid"] != tid {
			t.Errorf("thread %s: Pid field %q", tid, st["Pid"])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !seen[strconv.Itoa(os.Getpid())] || len(seen) < 2 {
		t.Errorf("threads seen: %v (want the main thread and the runtime's others)", seen)
	}
	if _, err := Hex(map[string]string{"CapBnd": "zz"}, "CapBnd"); err == nil {
		t.Error("Hex accepted a bad value")
	}
}
