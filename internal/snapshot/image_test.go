package snapshot

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
)

// writeImage makes a checkpoint-like directory: a big file (so it spans
// chunks), a small one and one in a subdirectory.
func writeImage(t *testing.T, big []byte) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "img")
	must(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o700))
	must(t, os.WriteFile(filepath.Join(dir, "pages.img"), big, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("kernel state"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "sub", "meta"), nil, 0o600))
	return dir
}

func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	must(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel], err = os.ReadFile(p)
		return err
	}))
	return out
}

// A process image is stored with the layer in one manifest, comes back
// byte for byte, is not inherited by a child snapshot, shares chunks, and
// keeps its chunks alive through GC; manifests without one still load.
func TestProcessImageRoundTrip(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	l := newLayer(t)
	write(t, l, "root/f", []byte("file"), 0o644, 0)
	big := make([]byte, 2*ChunkSize+123)
	_, _ = rand.Read(big)
	src := writeImage(t, big)

	plain, err := s.Capture(ctx, l, nil)
	must(t, err)
	res, err := s.CaptureProcess(ctx, l, nil, ImageSource{Dir: src, Driver: "gvisor"})
	must(t, err)
	if res.ImageFiles != 3 || res.ImageBytes != int64(len(big))+12 || res.ImageNewChunks < 2 {
		t.Fatalf("image stats %+v", res)
	}
	if res.BytesStored != res.ChunkBytes+res.ImageChunkBytes+res.ManifestBytes {
		t.Errorf("bytes stored %d does not add up: %+v", res.BytesStored, res)
	}
	// The same image again adds no chunks.
	again, err := s.CaptureProcess(ctx, l, nil, ImageSource{Dir: src, Driver: "gvisor"})
	must(t, err)
	if again.ImageNewChunks != 0 || again.ImageChunkBytes != 0 {
		t.Errorf("identical image stored new chunks: %+v", again)
	}

	st, img, err := s.LoadChain(ctx, []string{res.Manifest})
	must(t, err)
	if img == nil || img.Driver != "gvisor" || img.Format != imageFormatPaged || st["root/f"] == nil {
		t.Fatalf("loaded %v %+v", st, img)
	}
	objects := map[string]bool{}
	img.chunkRefs(func(c string) { objects[c] = true })
	if len(objects) != res.ImageNewChunks {
		t.Errorf("image names %d objects, the capture added %d", len(objects), res.ImageNewChunks)
	}
	if _, none, err := s.LoadChain(ctx, []string{plain.Manifest}); err != nil || none != nil {
		t.Fatalf("filesystem-only manifest: %+v %v", none, err)
	}
	// A child without an image does not inherit its parent's.
	child, err := s.Capture(ctx, l, st)
	must(t, err)
	if _, none, err := s.LoadChain(ctx, []string{res.Manifest, child.Manifest}); err != nil || none != nil {
		t.Fatalf("child inherited a process image: %+v %v", none, err)
	}

	// GC keeps what the process manifest references.
	gc, err := s.GC(ctx, []string{res.Manifest, plain.Manifest})
	must(t, err)
	if gc.ChunksKept != len(objects)+1 {
		t.Errorf("gc kept %d chunks: %+v", gc.ChunksKept, gc)
	}
	for i := 0; i < 2; i++ { // two restores of one image
		out, err := s.TempDir()
		must(t, err)
		n, err := s.MaterializeImage(ctx, img, out)
		must(t, err)
		got, want := readTree(t, out), readTree(t, src)
		if n != res.ImageBytes || len(got) != len(want) {
			t.Fatalf("restored %d bytes, %d files; want %d, %d", n, len(got), res.ImageBytes, len(want))
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Errorf("%s differs after restore", k)
			}
		}
	}
	// GC without it removes the image's chunks (and the temp dirs).
	gc, err = s.GC(ctx, []string{plain.Manifest})
	must(t, err)
	if gc.ChunksRemoved != len(objects) || gc.ChunksKept != 1 {
		t.Errorf("gc removed %d chunks: %+v", gc.ChunksRemoved, gc)
	}
	if left, _ := os.ReadDir(filepath.Join(s.Dir(), "tmp")); len(left) != 0 {
		t.Errorf("gc left %d temp entries", len(left))
	}
}

// Images with links or special files are refused at capture; hostile
// image records are refused at load and restore; a corrupt chunk fails
// the restore.
func TestProcessImageHostile(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	l := newLayer(t)
	src := writeImage(t, []byte("pages"))
	must(t, os.Symlink("/etc/passwd", filepath.Join(src, "link")))
	if _, err := s.CaptureProcess(ctx, l, nil, ImageSource{Dir: src, Driver: "gvisor"}); err == nil || !strings.Contains(err.Error(), "not a file") {
		t.Errorf("image with a symlink: %v", err)
	}
	must(t, os.Remove(filepath.Join(src, "link")))
	if _, err := s.CaptureProcess(ctx, l, nil, ImageSource{Dir: src, Driver: "../x"}); err == nil {
		t.Error("bad driver name accepted")
	}

	good := "0000000000000000000000000000000000000000000000000000000000000000"
	for name, pi := range map[string]*ProcessImage{
		"no files":     {Driver: "gvisor"},
		"dotdot":       {Driver: "gvisor", Files: []ImageFile{{Path: "../etc/x"}}},
		"absolute":     {Driver: "gvisor", Files: []ImageFile{{Path: "/etc/x"}}},
		"repeated":     {Driver: "gvisor", Files: []ImageFile{{Path: "a"}, {Path: "a"}}},
		"file and dir": {Driver: "gvisor", Files: []ImageFile{{Path: "a"}, {Path: "a/b"}}},
		"short chunks": {Driver: "gvisor", Files: []ImageFile{{Path: "a", Size: ChunkSize + 1, Chunks: []string{good}}}},
		"bad digest":   {Driver: "gvisor", Files: []ImageFile{{Path: "a", Size: 1, Chunks: []string{"zz"}}}},
		"negative":     {Driver: "gvisor", Files: []ImageFile{{Path: "a", Size: -1}}},
		"too deep":     {Driver: "gvisor", Files: []ImageFile{{Path: strings.Repeat("d/", maxImageDepth) + "f"}}},
		"format 9":     {Driver: "gvisor", Format: 9, Files: []ImageFile{{Path: "a"}}},
		"v2 short": {Driver: "gvisor", Format: imageFormatPaged, Files: []ImageFile{{Path: "a", Size: 8192,
			Parts: []ImagePart{{Object: good, Sum: good, Len: 4096}}}}},
		"v2 unaligned": {Driver: "gvisor", Format: imageFormatPaged, Files: []ImageFile{{Path: "a", Size: 8192,
			Parts: []ImagePart{{Object: good, Sum: good, Len: 4000}, {Object: good, Sum: good, Len: 4192}}}}},
		"v2 too big": {Driver: "gvisor", Format: imageFormatPaged, Files: []ImageFile{{Path: "a", Size: 2 * MaxImageChunk,
			Parts: []ImagePart{{Object: good, Sum: good, Len: 2 * MaxImageChunk}}}}},
		"v2 zero len": {Driver: "gvisor", Format: imageFormatPaged, Files: []ImageFile{{Path: "a", Size: 0,
			Parts: []ImagePart{{Object: good, Sum: good, Len: 0}}}}},
		"v2 bad sum": {Driver: "gvisor", Format: imageFormatPaged, Files: []ImageFile{{Path: "a", Size: 1,
			Parts: []ImagePart{{Object: good, Sum: "x", Len: 1}}}}},
		"v2 with v1 chunks": {Driver: "gvisor", Format: imageFormatPaged, Files: []ImageFile{{Path: "a", Size: 1,
			Chunks: []string{good}, Parts: []ImagePart{{Object: good, Sum: good, Len: 1}}}}},
		"v1 with parts": {Driver: "gvisor", Files: []ImageFile{{Path: "a", Size: 1,
			Chunks: []string{good}, Parts: []ImagePart{{Object: good, Sum: good, Len: 1}}}}},
	} {
		if err := (&Manifest{Version: manifestVersionOf(pi), Process: pi}).validate(); err == nil {
			t.Errorf("%s: manifest accepted", name)
		}
		out, err := s.TempDir()
		must(t, err)
		if _, err := s.MaterializeImage(ctx, pi, out); err == nil {
			t.Errorf("%s: restored", name)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(out), "etc")); err == nil {
			t.Errorf("%s: wrote outside the image dir", name)
		}
	}

	res, err := s.CaptureProcess(ctx, l, nil, ImageSource{Dir: src, Driver: "gvisor"})
	must(t, err)
	_, img, err := s.LoadChain(ctx, []string{res.Manifest})
	must(t, err)
	for _, f := range img.Files {
		if f.Path == "pages.img" {
			must(t, os.WriteFile(s.chunkPath(f.Parts[0].Object), []byte("PAGES"), 0o600))
		}
	}
	out, err := s.TempDir()
	must(t, err)
	if _, err := s.MaterializeImage(ctx, img, out); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Errorf("corrupt chunk: %v", err)
	}
}

// A driver without a host-side layer (a VM: its disk is in the
// checkpoint) snapshots the image alone; a layer-less capture without an
// image is refused.
func TestProcessImageWithoutLayer(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), nil)
	must(t, err)
	src := writeImage(t, []byte("memory"))
	if _, err := s.Capture(ctx, driver.Layer{}, nil); err == nil {
		t.Fatal("capture of nothing accepted")
	}
	done := 0
	res, err := s.CaptureProcess(ctx, driver.Layer{}, nil, ImageSource{Dir: src, Driver: "qemu", LayerDone: func() { done++ }})
	must(t, err)
	if res.Entries != 0 || res.ImageFiles != 3 || done != 1 {
		t.Fatalf("result %+v, LayerDone called %d times", res, done)
	}
	st, img, err := s.LoadChain(ctx, []string{res.Manifest})
	must(t, err)
	if len(st) != 0 || img == nil || img.Driver != "qemu" || len(img.Files) != 3 {
		t.Fatalf("loaded %v %+v", st, img)
	}
}
