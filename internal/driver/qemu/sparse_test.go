package qemu

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSparseSaveLoad saves a 1 GiB sparse file holding three small
// extents and restores it: same bytes, still sparse, and the saved data is
// the extents only. A map that points outside the disk or past its data
// is refused.
func TestSparseSaveLoad(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "disk")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 30
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	chunks := map[int64][]byte{
		0:             bytes.Repeat([]byte("A"), 8192),
		300 << 20:     bytes.Repeat([]byte("B"), 4096),
		size - 4096*2: bytes.Repeat([]byte("C"), 8192),
	}
	for off, b := range chunks {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	data, mp := filepath.Join(dir, "d"), filepath.Join(dir, "m")
	if err := saveSparse(src, data, mp); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(data); fi.Size() > 1<<20 {
		t.Errorf("saved %d bytes for 20 KiB of data", fi.Size())
	}
	out := filepath.Join(dir, "restored")
	if err := loadSparse(data, mp, out); err != nil {
		t.Fatal(err)
	}
	g, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	fi, _ := g.Stat()
	if fi.Size() != size {
		t.Fatalf("restored size %d", fi.Size())
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Blocks*512 > 4<<20 {
		t.Errorf("restored file is not sparse: %d bytes allocated", st.Blocks*512)
	}
	for off, want := range chunks {
		got := make([]byte, len(want))
		if _, err := g.ReadAt(got, off); err != nil || !bytes.Equal(got, want) {
			t.Errorf("at %d: %q... %v", off, got[:8], err)
		}
	}
	hole := make([]byte, 4096)
	if _, err := g.ReadAt(hole, 100<<20); err != nil || !bytes.Equal(hole, make([]byte, 4096)) {
		t.Errorf("hole reads back non-zero: %v", err)
	}
	// Hostile maps: an extent past the end, overlapping extents, more
	// bytes than the data file has.
	for _, m := range []extentMap{
		{Size: 4096, Extents: [][2]int64{{0, 8192}}},
		{Size: size, Extents: [][2]int64{{0, 8192}, {4096, 4096}}},
		{Size: size, Extents: [][2]int64{{0, 1 << 20}}},
	} {
		b, _ := json.Marshal(m)
		if err := os.WriteFile(mp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		bad := filepath.Join(dir, "bad")
		os.Remove(bad)
		if err := loadSparse(data, mp, bad); err == nil {
			t.Errorf("map %v accepted", m)
		}
	}
}
