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
	err := Each([]string{"CapBnd", "Pid", "NoSuchField"}, func(tid string, st map[string]string) error {
		seen[tid] = true
		if len(st) != 2 {
			t.Errorf("thread %s: fields %v, want CapBnd and Pid only", tid, st)
		}
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

// TestFields: only the named keys, values trimmed, the last line without
// a newline too.
func TestFields(t *testing.T) {
	b := []byte("Name:\tagent\nSeccomp:\t2\nNoNewPrivs:  1 \nCapBnd:\t0000000000000000")
	st := fields(b, []string{"Seccomp", "NoNewPrivs", "CapBnd", "Gone"})
	want := map[string]string{"Seccomp": "2", "NoNewPrivs": "1", "CapBnd": "0000000000000000"}
	if len(st) != len(want) {
		t.Fatalf("fields = %v, want %v", st, want)
	}
	for k, v := range want {
		if st[k] != v {
			t.Errorf("fields[%s] = %q, want %q", k, st[k], v)
		}
	}
}

// TestReadInto: a file larger than the buffer is read whole, and the
// buffer is kept for the next read.
func TestReadInto(t *testing.T) {
	p := t.TempDir() + "/f"
	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 16)
	b, err := readInto(p, &buf)
	if err != nil || string(b) != string(data) {
		t.Fatalf("readInto: %d bytes, %v", len(b), err)
	}
	if cap(buf) < len(data) {
		t.Errorf("buffer not kept: cap %d", cap(buf))
	}
}
