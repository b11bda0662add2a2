package consolelog

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBounded: writes past Bytes fail with ENOSPC and the file stays within
// the bound; Mount is idempotent and Unmount lets the dir be removed.
func TestBounded(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := Mount(dir); err != nil {
		t.Fatal(err)
	}
	defer Unmount(dir)
	if err := Mount(dir); err != nil {
		t.Fatalf("second Mount: %v", err)
	}
	f, err := os.OpenFile(Path(dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("A"), 64<<10)
	var werr error
	for i := 0; i < 3*Bytes/len(chunk) && werr == nil; i++ {
		_, werr = f.Write(chunk)
	}
	f.Close()
	if !errors.Is(werr, unix.ENOSPC) {
		t.Errorf("writing 3 MiB: %v, want ENOSPC", werr)
	}
	fi, err := os.Stat(Path(dir, "console.log"))
	if err != nil || fi.Size() > Bytes {
		t.Fatalf("console file: %v, size %d > %d", err, fi.Size(), Bytes)
	}
	if err := Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(dir); err != nil {
		t.Fatalf("second Unmount: %v", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
}
