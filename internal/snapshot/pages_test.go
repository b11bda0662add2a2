package snapshot

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
)

// memoryLike returns n pages that look like process memory: some zero
// pages, some repetitive (compressible) and some random.
func memoryLike(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]byte, n*pageSize)
	for i := 0; i < n; i++ {
		p := out[i*pageSize : (i+1)*pageSize]
		switch r.IntN(4) {
		case 0: // zero
		case 1:
			for j := 0; j+8 <= len(p); j += 8 {
				binary.LittleEndian.PutUint64(p[j:], uint64(i)<<8|uint64(j%64))
			}
		default:
			for j := 0; j+8 <= len(p); j += 8 {
				binary.LittleEndian.PutUint64(p[j:], r.Uint64())
			}
		}
	}
	return out
}

func split(t *testing.T, data []byte) [][]byte {
	t.Helper()
	var out [][]byte
	must(t, splitPages(bytes.NewReader(data), make([]byte, 2*MaxImageChunk), func(c []byte) error {
		out = append(out, bytes.Clone(c))
		return nil
	}))
	return out
}

// Chunks end on page boundaries (but the last), hold between the minimum
// and maximum number of pages, and put together give the input back; an
// inserted page changes only the chunks around it.
func TestSplitPages(t *testing.T) {
	for _, n := range []int{0, 1, 4095, 4096, 4097, 3*MaxImageChunk + 5} {
		data := bytes.Repeat([]byte{7}, n)
		if got := bytes.Join(split(t, data), nil); !bytes.Equal(got, data) {
			t.Errorf("%d bytes: chunks do not add up", n)
		}
	}
	data := memoryLike(1, 2048) // 8 MiB
	chunks := split(t, data)
	if !bytes.Equal(bytes.Join(chunks, nil), data) {
		t.Fatal("chunks do not add up")
	}
	for i, c := range chunks {
		if len(c) > MaxImageChunk || (i < len(chunks)-1 && (len(c)%pageSize != 0 || len(c) < minChunkPages*pageSize)) {
			t.Fatalf("chunk %d: %d bytes", i, len(c))
		}
	}
	if avg := len(data) / len(chunks); avg < 32<<10 || avg > 128<<10 {
		t.Errorf("average chunk %d bytes, want about 64 KiB", avg)
	}
	// Zeros make maximal chunks.
	for i, c := range split(t, make([]byte, 4*MaxImageChunk)) {
		if len(c) != MaxImageChunk {
			t.Errorf("zero chunk %d: %d bytes", i, len(c))
		}
	}
	// A page inserted near the start shifts everything after it.
	shifted := append(append(bytes.Clone(data[:10*pageSize]), memoryLike(2, 1)...), data[10*pageSize:]...)
	old := map[string]bool{}
	for _, c := range chunks {
		old[string(c)] = true
	}
	fresh := 0
	for _, c := range split(t, shifted) {
		if !old[string(c)] {
			fresh++
		}
	}
	if fresh > 3 {
		t.Errorf("one inserted page changed %d of %d chunks", fresh, len(chunks))
	}
}

// imageDir writes an image directory like gVisor's.
func imageDir(t *testing.T, pages []byte) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "img")
	must(t, os.MkdirAll(dir, 0o700))
	must(t, os.WriteFile(filepath.Join(dir, "pages.img"), pages, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte(strings.Repeat("kernel state ", 1000)), 0o600))
	return dir
}

func captureImage(t *testing.T, s *Store, pages []byte, parent *ProcessImage) (Result, *ProcessImage) {
	t.Helper()
	ctx := context.Background()
	res, err := s.CaptureProcess(ctx, driver.Layer{}, nil, ImageSource{Dir: imageDir(t, pages), Driver: "gvisor", Parent: parent})
	must(t, err)
	_, img, err := s.LoadChain(ctx, []string{res.Manifest})
	must(t, err)
	return res, img
}

// differences counts the chunks of img stored as a difference to a base.
func differences(img *ProcessImage) int {
	n := 0
	for _, f := range img.Files {
		for _, p := range f.Parts {
			if p.Base != "" {
				n++
			}
		}
	}
	return n
}

// dirBytes is the size of every chunk in the store's directory.
func dirBytes(t *testing.T, s *Store) int64 {
	t.Helper()
	var n int64
	must(t, filepath.WalkDir(filepath.Join(s.Dir(), "chunks"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	}))
	return n
}

// Images are compressed; a child image after a small change adds little,
// with and without the parent at hand (across forks: the same chunk is
// the same object); ten snapshots that each change 1 MiB store less than
// twice the first; each restores byte for byte.
func TestPagedImageDedup(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	mem := memoryLike(3, 16384) // 64 MiB
	first, img := captureImage(t, s, mem, nil)
	if first.ImageChunkBytes >= first.ImageBytes*9/10 {
		t.Errorf("first image: %d bytes stored for %d", first.ImageChunkBytes, first.ImageBytes)
	}
	if got := dirBytes(t, s); got != first.ImageChunkBytes {
		t.Errorf("store holds %d chunk bytes, the capture says it added %d", got, first.ImageChunkBytes)
	}
	r := rand.New(rand.NewPCG(4, 4))
	imgs := []*ProcessImage{img}
	mems := [][]byte{bytes.Clone(mem)}
	for i := 1; i < 10; i++ {
		// 1 MiB of random data over 256 random pages... of one region
		// (a heap): 16 pages in each of 16 places.
		for k := 0; k < 16; k++ {
			at := r.IntN(16384-16) * pageSize
			for j := at; j < at+16*pageSize; j += 8 {
				binary.LittleEndian.PutUint64(mem[j:], r.Uint64())
			}
		}
		before := dirBytes(t, s)
		res, next := captureImage(t, s, mem, img)
		if added := dirBytes(t, s) - before; added != res.ImageChunkBytes {
			t.Errorf("snapshot %d: store grew %d bytes, the capture says %d", i, added, res.ImageChunkBytes)
		}
		img = next
		imgs, mems = append(imgs, img), append(mems, bytes.Clone(mem))
	}
	total := dirBytes(t, s)
	t.Logf("first image %d bytes stored for %d; ten snapshots %d bytes (%.2fx)", first.ImageChunkBytes, first.ImageBytes, total, float64(total)/float64(first.ImageChunkBytes))
	if total >= 2*first.ImageChunkBytes {
		t.Errorf("ten snapshots stored %d bytes, first %d: want less than twice", total, first.ImageChunkBytes)
	}
	// A fork of snapshot 8 that made the same change as snapshot 9 adds
	// nothing: the same chunk against the same base is the same object.
	again, _ := captureImage(t, s, mem, imgs[8])
	if again.ImageNewChunks != 0 {
		t.Errorf("the same image from the same parent added %d chunks", again.ImageNewChunks)
	}
	// Without a parent (another sandbox), the chunks stored whole are
	// shared; those stored as differences are stored whole again.
	deltas := differences(img)
	if deltas == 0 {
		t.Error("no chunk stored as a difference to its parent")
	}
	if again, _ := captureImage(t, s, mem, nil); again.ImageNewChunks > deltas {
		t.Errorf("the same image without a parent added %d chunks; %d are differences", again.ImageNewChunks, deltas)
	}
	for _, i := range []int{0, 9} {
		out, err := s.TempDir()
		must(t, err)
		n, err := s.MaterializeImage(ctx, imgs[i], out)
		must(t, err)
		got, err := os.ReadFile(filepath.Join(out, "pages.img"))
		must(t, err)
		if !bytes.Equal(got, mems[i]) || n != imgs[i].Bytes() {
			t.Errorf("snapshot %d does not restore byte for byte (%d bytes)", i, n)
		}
	}
}

// GC keeps the chunks a kept image shares with a deleted one and removes
// the rest; a reused parent chunk that GC removed meanwhile is stored
// again, not named missing.
func TestPagedImageGC(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	mem := memoryLike(5, 1024)
	_, imgA := captureImage(t, s, mem, nil)
	copy(mem[100*pageSize:], memoryLike(6, 8))
	b, imgB := captureImage(t, s, mem, imgA)
	gc, err := s.GC(ctx, []string{b.Manifest})
	must(t, err)
	if gc.ChunksRemoved == 0 || gc.ChunksRemoved > b.ImageNewChunks+2 {
		t.Errorf("gc removed %d chunks (the child added %d): %+v", gc.ChunksRemoved, b.ImageNewChunks, gc)
	}
	out, err := s.TempDir()
	must(t, err)
	_, err = s.MaterializeImage(ctx, imgB, out)
	must(t, err)
	// Everything gone; a capture that believes its parent's chunks exist
	// stores them again.
	_, err = s.GC(ctx, nil)
	must(t, err)
	c, imgC := captureImage(t, s, mem, imgB)
	if c.ImageNewChunks == 0 {
		t.Fatal("nothing stored after GC")
	}
	out, err = s.TempDir()
	must(t, err)
	_, err = s.MaterializeImage(ctx, imgC, out)
	must(t, err)
}

// A truncated, corrupt or missing chunk, or one that decompresses to
// other content than the manifest says, fails the restore with an error
// (ErrCorrupt or fs.ErrNotExist), never a panic or a wrong image.
func TestPagedImageDamage(t *testing.T) {
	ctx := context.Background()
	mem := memoryLike(7, 512)
	for _, tc := range []struct {
		name   string
		damage func(s *Store, img *ProcessImage)
		want   error
	}{
		{"truncated", func(s *Store, img *ProcessImage) {
			p := s.chunkPath(img.Files[1].Parts[1].Object)
			fi, _ := os.Stat(p)
			must(t, os.Truncate(p, fi.Size()/2))
		}, ErrCorrupt},
		{"flipped", func(s *Store, img *ProcessImage) {
			p := s.chunkPath(img.Files[1].Parts[0].Object)
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 1
			must(t, os.WriteFile(p, b, 0o600))
		}, ErrCorrupt},
		{"missing", func(s *Store, img *ProcessImage) {
			must(t, os.Remove(s.chunkPath(img.Files[1].Parts[2].Object)))
		}, fs.ErrNotExist},
		{"other content", func(s *Store, img *ProcessImage) {
			// A valid object, but not the one the manifest's sum names.
			p := &img.Files[1].Parts
			(*p)[0].Object, (*p)[1].Object = (*p)[1].Object, (*p)[0].Object
		}, ErrCorrupt},
		{"not zstd", func(s *Store, img *ProcessImage) {
			d, _, err := s.putChunk(ctx, []byte("not a zstd frame"))
			must(t, err)
			img.Files[1].Parts[0].Object = d
		}, ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(t.TempDir(), nil)
			must(t, err)
			_, img := captureImage(t, s, mem, nil)
			if img.Files[1].Path != "pages.img" || len(img.Files[1].Parts) < 3 {
				t.Fatalf("image %+v", img.Files)
			}
			tc.damage(s, img)
			out, err := s.TempDir()
			must(t, err)
			if _, err := s.MaterializeImage(ctx, img, out); !errors.Is(err, tc.want) {
				t.Errorf("restore: %v, want %v", err, tc.want)
			}
		})
	}
}

// Snapshots stored before format 2 (fixed 1 MiB raw chunks, manifest
// version 1) still restore, and serve as a parent of a format-2 capture.
func TestFormat0ImageRestores(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	mem := memoryLike(8, 600) // 2.3 MiB: three 1 MiB chunks
	f := ImageFile{Path: "pages.img", Size: int64(len(mem))}
	for off := 0; off < len(mem); off += ChunkSize {
		d, _, err := s.putChunk(ctx, mem[off:min(off+ChunkSize, len(mem))])
		must(t, err)
		f.Chunks = append(f.Chunks, d)
	}
	old := &ProcessImage{Driver: "gvisor", Files: []ImageFile{f, {Path: "empty"}}}
	d, _, err := s.putManifest(ctx, &Manifest{Version: manifestVersion, Process: old})
	must(t, err)
	_, img, err := s.LoadChain(ctx, []string{d})
	must(t, err)
	out, err := s.TempDir()
	must(t, err)
	_, err = s.MaterializeImage(ctx, img, out)
	must(t, err)
	if got, _ := os.ReadFile(filepath.Join(out, "pages.img")); !bytes.Equal(got, mem) {
		t.Fatal("format-0 image does not restore")
	}
	res, next := captureImage(t, s, mem, img)
	if next.Format != imageFormatPaged || res.ImageNewChunks == 0 {
		t.Errorf("capture after a format-0 parent: %+v", res)
	}
	// A version-1 manifest cannot carry a format-2 image, nor the reverse.
	if err := (&Manifest{Version: manifestVersion, Process: next}).validate(); err == nil {
		t.Error("format-2 image in a version-1 manifest accepted")
	}
	if err := (&Manifest{Version: manifestVersionPaged, Process: img}).validate(); err == nil {
		t.Error("format-0 image in a version-2 manifest accepted")
	}
}

// With a shared store, a format-2 image and its child (chunks stored as
// differences to the parent's) restore on a node that has nothing local,
// and a collection of the shared store that keeps only the child keeps
// the bases its differences need.
func TestPagedImageShared(t *testing.T) {
	ctx := context.Background()
	b, err := OpenDirBackend(t.TempDir())
	must(t, err)
	a, err := Open(t.TempDir(), t.Logf)
	must(t, err)
	a.SetShared(b)
	mem := memoryLike(9, 1024)
	_, img := captureImage(t, a, mem, nil)
	for k := 0; k < 8; k++ {
		copy(mem[(k*120+7)*pageSize:], memoryLike(uint64(10+k), 2))
	}
	child, _ := captureImage(t, a, mem, img)
	if child.ImageNewChunks == 0 {
		t.Fatal("the child stored nothing")
	}
	restore := func(label string) {
		t.Helper()
		s, err := Open(t.TempDir(), t.Logf)
		must(t, err)
		s.SetShared(b)
		_, got, err := s.LoadChain(ctx, []string{child.Manifest})
		must(t, err)
		if differences(got) == 0 {
			t.Fatalf("%s: no chunk of the child is a difference", label)
		}
		out, err := s.TempDir()
		must(t, err)
		_, err = s.MaterializeImage(ctx, got, out)
		must(t, err)
		if data, _ := os.ReadFile(filepath.Join(out, "pages.img")); !bytes.Equal(data, mem) {
			t.Fatalf("%s: the child does not restore byte for byte", label)
		}
	}
	restore("elsewhere")
	res, err := a.GCShared(ctx, []string{child.Manifest}, 0)
	must(t, err)
	if res.ManifestsRemoved != 1 {
		t.Errorf("shared gc: %+v (the parent's manifest should go)", res)
	}
	restore("after the shared store dropped the parent")
}
