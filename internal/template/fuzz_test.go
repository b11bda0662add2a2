package template

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// FuzzExtractTar feeds arbitrary bytes to the extractor and checks the
// safety properties, whatever the outcome: nothing is written outside the
// destination, no device node, fifo or socket appears, and the file data
// written stays within the byte limit.
func FuzzExtractTar(f *testing.F) {
	const maxBytes = 1 << 20
	f.Add(mkTar(f, goodTarEntries(), false))
	f.Add(mkTar(f, goodTarEntries(), true))
	f.Add(mkTar(f, []tarEntry{{hdr: tar.Header{Name: "../evil"}, body: "x"}}, false))
	f.Add(mkTar(f, []tarEntry{
		{hdr: tar.Header{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: "../outside"}},
		{hdr: tar.Header{Name: "esc/pwned"}, body: "x"}}, false))
	f.Add(mkTar(f, []tarEntry{
		{hdr: tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: ".."}},
		{hdr: tar.Header{Name: "up/outside/secret"}, body: "overwritten"}}, false))
	f.Add(mkTar(f, []tarEntry{
		{hdr: tar.Header{Name: "a"}, body: "x"},
		{hdr: tar.Header{Name: "b", Typeflag: tar.TypeLink, Linkname: "a"}},
		{hdr: tar.Header{Name: "c", Typeflag: tar.TypeLink, Linkname: "../outside/secret"}}}, false))
	f.Add(mkTar(f, []tarEntry{{hdr: tar.Header{Name: "d", Typeflag: tar.TypeDir, Mode: 0o000}}, {hdr: tar.Header{Name: "d/f"}, body: "x"}}, false))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dst := filepath.Join(base, "root")
		outside := filepath.Join(base, "outside")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(outside, 0o755); err != nil {
			t.Fatal(err)
		}
		secret := filepath.Join(outside, "secret")
		if err := os.WriteFile(secret, []byte("secret"), 0o644); err != nil {
			t.Fatal(err)
		}
		root, err := os.OpenRoot(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		lim := extractLimits{maxBytes: maxBytes, maxEntries: 1000, uidCount: 65536, chown: os.Geteuid() == 0}
		_ = extractTar(context.Background(), bytes.NewReader(data), root, lim, func(int64, string) {}, func(string, ...any) {})

		ents, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 2 {
			t.Fatalf("entries appeared next to the destination: %v", ents)
		}
		oents, _ := os.ReadDir(outside)
		if b, err := os.ReadFile(secret); len(oents) != 1 || err != nil || string(b) != "secret" {
			t.Fatalf("outside dir changed: %v %q %v", oents, b, err)
		}
		var total int64
		seen := map[uint64]bool{}
		err = filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err != nil {
				return err
			}
			switch st.Mode & syscall.S_IFMT {
			case syscall.S_IFCHR, syscall.S_IFBLK, syscall.S_IFIFO, syscall.S_IFSOCK:
				t.Fatalf("special file extracted: %s", p)
			case syscall.S_IFREG:
				if !seen[st.Ino] {
					seen[st.Ino] = true
					total += st.Size
				}
				if st.Ino == inode(t, secret) {
					t.Fatalf("hardlink to a file outside: %s", p)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if total > maxBytes {
			t.Fatalf("%d bytes written, limit %d", total, maxBytes)
		}
	})
}

func inode(t *testing.T, p string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
