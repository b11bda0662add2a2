package snapshot

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
	"golang.org/x/sys/unix"
)

const base = 100000

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown, mknod)")
	}
}

func newLayer(t *testing.T) driver.Layer {
	t.Helper()
	d := filepath.Join(t.TempDir(), "upper")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return driver.Layer{Dir: d, UIDBase: base, UIDCount: 65536}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, l driver.Layer, p string, data []byte, mode os.FileMode, uid int) {
	t.Helper()
	full := filepath.Join(l.Dir, p)
	must(t, os.MkdirAll(filepath.Dir(full), 0o755))
	must(t, os.WriteFile(full, data, mode))
	must(t, os.Chmod(full, mode))
	must(t, os.Lchown(full, base+uid, base+uid))
}

// treeDigest describes a tree exactly: every entry's type, mode, owner,
// size, mtime (not for dirs: the capture's own reads do not change them,
// but checking files, links and special files is enough), content hash,
// link target, device number and recorded xattrs.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s %o %d:%d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			sum := sha256.Sum256(b)
			line += fmt.Sprintf(" %d %x mt=%d", len(b), sum[:8], st.Mtim.Nano())
		case unix.S_IFLNK:
			tg, _ := os.Readlink(p)
			line += " -> " + tg + fmt.Sprintf(" mt=%d", st.Mtim.Nano())
		case unix.S_IFCHR:
			line += fmt.Sprintf(" rdev=%d", st.Rdev)
		case unix.S_IFDIR:
			if rel != "." {
				line += fmt.Sprintf(" mt=%d", st.Mtim.Nano())
			}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR || st.Mode&unix.S_IFMT == unix.S_IFREG {
			buf := make([]byte, 4096)
			if n, err := unix.Llistxattr(p, buf); err == nil {
				names := strings.Split(string(buf[:n]), "\x00")
				sort.Strings(names)
				for _, nm := range names {
					if keepXattr(nm) {
						v := make([]byte, 4096)
						vn, _ := unix.Lgetxattr(p, nm, v)
						line += fmt.Sprintf(" %s=%q", nm, v[:vn])
					}
				}
			}
		}
		lines = append(lines, line)
		return nil
	})
	must(t, err)
	return strings.Join(lines, "\n")
}

// chownDirs gives directories and special files made by the test the
// sandbox root's host id, as in a real upper dir.
func chownDirs(t *testing.T, dir string) {
	t.Helper()
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Uid == 0 {
			return os.Lchown(p, base, base)
		}
		return nil
	}))
}

func dropLine(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func restoreInto(t *testing.T, s *Store, chain []string) string {
	t.Helper()
	st, err := s.LoadState(context.Background(), chain)
	must(t, err)
	l := newLayer(t)
	if _, err := s.Materialize(context.Background(), st, l); err != nil {
		t.Fatal(err)
	}
	return l.Dir
}

func TestCaptureRestoreChain(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s, err := Open(t.TempDir(), t.Logf)
	must(t, err)
	l := newLayer(t)
	big := make([]byte, 5*ChunkSize+123)
	rand.Read(big)
	write(t, l, "etc/hosts", []byte("127.0.0.1 x\n"), 0o644, 0)
	write(t, l, "home/u/big.bin", big, 0o600, 1000)
	write(t, l, "home/u/setuid", []byte("#!/bin/sh\n"), 0o4755, 0)
	must(t, os.Symlink("../etc/hosts", filepath.Join(l.Dir, "home/link")))
	must(t, os.Lchown(filepath.Join(l.Dir, "home/link"), base+5, base+5))
	must(t, unix.Mknod(filepath.Join(l.Dir, "etc/gone"), unix.S_IFCHR, 0)) // a whiteout
	must(t, unix.Mkfifo(filepath.Join(l.Dir, "home/fifo"), 0o640))
	must(t, os.MkdirAll(filepath.Join(l.Dir, "opaque/sub"), 0o750))
	must(t, unix.Setxattr(filepath.Join(l.Dir, "opaque"), "user.overlay.opaque", []byte("y"), 0))
	must(t, unix.Setxattr(filepath.Join(l.Dir, "etc/hosts"), "user.note", []byte("hi"), 0))
	must(t, unix.Setxattr(filepath.Join(l.Dir, "etc/hosts"), "user.overlay.origin", []byte("stale"), 0))
	must(t, os.Link(filepath.Join(l.Dir, "home/u/setuid"), filepath.Join(l.Dir, "home/hard")))
	// A device node that is not a whiteout is skipped, never opened.
	must(t, unix.Mknod(filepath.Join(l.Dir, "etc/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	chownDirs(t, l.Dir)
	r1, err := s.Capture(ctx, l, nil)
	must(t, err)
	if r1.Skipped != 1 || r1.NewChunks != 8 || r1.BytesRead != int64(len(big))+10+12 {
		t.Fatalf("first capture: %+v", r1)
	}
	want1 := dropLine(treeDigest(t, l.Dir), "etc/null ")
	must(t, os.Remove(filepath.Join(l.Dir, "etc/null")))

	// Second: a small change in a big file's neighbourhood, a new file,
	// removals of a file and a subtree.
	write(t, l, "home/u/small.txt", []byte("small change"), 0o644, 1000)
	chownDirs(t, l.Dir)
	must(t, os.RemoveAll(filepath.Join(l.Dir, "opaque")))
	must(t, os.Remove(filepath.Join(l.Dir, "home/fifo")))
	p1, err := s.LoadState(ctx, []string{r1.Manifest})
	must(t, err)
	r2, err := s.Capture(ctx, l, p1)
	must(t, err)
	if r2.NewChunks != 1 || r2.ChunkBytes != 12 || r2.BytesRead != 12 || r2.Removed != 2 {
		t.Fatalf("second capture stored more than the change: %+v", r2)
	}
	want2 := treeDigest(t, l.Dir)

	// Third: overwrite one chunk of the big file in place.
	f, err := os.OpenFile(filepath.Join(l.Dir, "home/u/big.bin"), os.O_WRONLY, 0)
	must(t, err)
	f.WriteAt([]byte("patched"), 2*ChunkSize+10)
	f.Close()
	p2, err := s.LoadState(ctx, []string{r1.Manifest, r2.Manifest})
	must(t, err)
	r3, err := s.Capture(ctx, l, p2)
	must(t, err)
	if r3.NewChunks != 1 || r3.ChunkBytes != ChunkSize {
		t.Fatalf("third capture: %+v", r3)
	}
	want3 := treeDigest(t, l.Dir)

	for i, c := range []struct {
		chain []string
		want  string
	}{{[]string{r1.Manifest}, want1}, {[]string{r1.Manifest, r2.Manifest}, want2}, {[]string{r1.Manifest, r2.Manifest, r3.Manifest}, want3}} {
		got := treeDigest(t, restoreInto(t, s, c.chain))
		// user.overlay.origin is overlay bookkeeping: dropped on purpose.
		want := strings.ReplaceAll(c.want, ` user.overlay.origin="stale"`, "")
		if got != want {
			t.Fatalf("restore of snapshot %d differs:\n got:\n%s\nwant:\n%s", i+1, got, want)
		}
	}

	// GC with only the first snapshot kept removes the third's chunk and the
	// small file's; with none kept, everything.
	g, err := s.GC(ctx, []string{r1.Manifest})
	must(t, err)
	if g.ChunksRemoved != 2 || g.ManifestsRemoved != 2 || g.ChunksKept != 8 {
		t.Fatalf("gc: %+v", g)
	}
	if _, err := s.LoadState(ctx, []string{r1.Manifest}); err != nil {
		t.Fatal(err)
	}
	g, err = s.GC(ctx, nil)
	must(t, err)
	if g.ChunksKept != 0 || g.ManifestsRemoved != 1 {
		t.Fatalf("gc all: %+v", g)
	}
}

func TestCaptureRefusesToFollow(t *testing.T) {
	requireRoot(t)
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	l := newLayer(t)
	secret := filepath.Join(t.TempDir(), "secret")
	must(t, os.WriteFile(secret, []byte("host secret"), 0o600))
	must(t, os.Symlink(secret, filepath.Join(l.Dir, "s")))
	must(t, os.Symlink(filepath.Dir(secret), filepath.Join(l.Dir, "d")))
	r, err := s.Capture(context.Background(), l, nil)
	must(t, err)
	if r.BytesRead != 0 || r.Entries != 2 {
		t.Fatalf("a symlink was followed: %+v", r)
	}
}

func TestRestoreRejectsHostileState(t *testing.T) {
	requireRoot(t)
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	outside := t.TempDir()
	for name, st := range map[string]State{
		"escape":          {"../x": {Path: "../x", Type: TypeDir}},
		"through link":    {"a": {Path: "a", Type: TypeSymlink, Target: outside}, "a/f": {Path: "a/f", Type: TypeFile}},
		"link to nothing": {"h": {Path: "h", Type: TypeHardlink, Target: "nope"}},
		"bad chunk":       {"f": {Path: "f", Type: TypeFile, Size: 3, Chunks: []string{strings.Repeat("0", 64)}}},
	} {
		l := newLayer(t)
		if _, err := s.Materialize(context.Background(), st, l); err == nil {
			t.Errorf("%s: restored", name)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("restore wrote outside the layer: %v", ents)
	}
}

func TestCorruptChunkDetected(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	l := newLayer(t)
	write(t, l, "f", []byte("content"), 0o644, 0)
	r, err := s.Capture(ctx, l, nil)
	must(t, err)
	st, err := s.LoadState(ctx, []string{r.Manifest})
	must(t, err)
	c := st["f"].Chunks[0]
	must(t, os.WriteFile(s.chunkPath(c), []byte("tampered"), 0o600))
	if _, err := s.Materialize(ctx, st, newLayer(t)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("tampered chunk: %v", err)
	}
	m, _ := os.ReadFile(s.manifestPath(r.Manifest))
	must(t, os.WriteFile(s.manifestPath(r.Manifest), bytes.ToUpper(m), 0o600))
	if _, err := s.LoadManifest(r.Manifest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("tampered manifest: %v", err)
	}
}

// TestManifestCache: a manifest read twice is decoded once (a fork burst
// reads one chain per fork), and a collected one is gone at once.
func TestManifestCache(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	l := newLayer(t)
	write(t, l, "f", []byte("content"), 0o644, 0)
	r, err := s.Capture(ctx, l, nil)
	must(t, err)
	m1, err := s.LoadManifest(r.Manifest)
	must(t, err)
	m2, err := s.LoadManifest(r.Manifest)
	must(t, err)
	if m1 != m2 {
		t.Error("the second read of a manifest decoded it again")
	}
	must(t, os.Remove(s.manifestPath(r.Manifest)))
	if _, err := s.LoadManifest(r.Manifest); err == nil {
		t.Error("a removed manifest still loads from the cache")
	}
}

func TestValidPath(t *testing.T) {
	for p, ok := range map[string]bool{"a": true, "a/b": true, "": false, "/a": false, "a/../b": false,
		"..": false, "a//b": false, "a/": false, "a\x00b": false, strings.Repeat("x", 256): false} {
		if validPath(p) != ok {
			t.Errorf("validPath(%q) = %v", p, !ok)
		}
	}
	_ = hex.EncodeToString
}
