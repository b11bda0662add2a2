package template

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStepLogBound: a step's full log keeps the first MaxStepLog bytes and
// says how much was dropped; the result's tail stays 64 KiB.
func TestStepLogBound(t *testing.T) {
	p := filepath.Join(t.TempDir(), "step-2.log")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	out := &tailBuffer{max: maxStepOutput, log: &cappedFile{f: f, max: MaxStepLog}}
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	n := 0
	for n < MaxStepLog+100<<10 {
		out.Write(chunk)
		n += len(chunk)
	}
	out.Write([]byte("END"))
	n += 3
	if out.log.n != MaxStepLog || out.log.dropped != int64(n-MaxStepLog) {
		t.Fatalf("kept %d, dropped %d of %d", out.log.n, out.log.dropped, n)
	}
	out.log.close()
	out.log.close() // idempotent
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, chunk) || !strings.HasSuffix(string(b), fmt.Sprintf("[space: %d more bytes of output were not kept]\n", n-MaxStepLog)) {
		t.Errorf("log: %d bytes, ends %q", len(b), b[len(b)-80:])
	}
	if s := out.String(); len(s) != maxStepOutput || !strings.HasSuffix(s, "END") {
		t.Errorf("tail: %d bytes", len(s))
	}
}
