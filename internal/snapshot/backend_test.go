package snapshot

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// fakeS3 serves an in-memory S3 on loopback for the test and returns a
// spec for OpenBackend, with its credentials.
func fakeS3(t *testing.T, bucket string) (spec string, env func(string) string) {
	t.Helper()
	mem := s3mem.New()
	if err := mem.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gofakes3.New(mem).Server(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	creds := map[string]string{"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test-secret"}
	return "s3://" + bucket + "/space/snaps?endpoint=http://" + ln.Addr().String(), func(k string) string { return creds[k] }
}

// backends returns a directory backend and an S3 backend (fake, on
// loopback), by name.
func backends(t *testing.T) map[string]Backend {
	t.Helper()
	ctx := context.Background()
	dir, err := OpenBackend(ctx, "dir:"+t.TempDir(), nil)
	must(t, err)
	spec, env := fakeS3(t, "snaps")
	s3, err := OpenBackend(ctx, spec, env)
	must(t, err)
	return map[string]Backend{"dir": dir, "s3": s3}
}

func TestBackendConformance(t *testing.T) {
	ctx := context.Background()
	for name, b := range backends(t) {
		t.Run(name, func(t *testing.T) {
			d := strings.Repeat("ab", 32)
			key := chunkKey(d)
			if _, err := b.Get(ctx, key, ChunkSize); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("get of a missing object: %v, want fs.ErrNotExist", err)
			}
			if _, err := b.Stat(ctx, key); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("stat of a missing object: %v, want fs.ErrNotExist", err)
			}
			data := make([]byte, ChunkSize)
			rand.Read(data)
			must(t, b.Put(ctx, key, data))
			must(t, b.Put(ctx, manifestKey(d), []byte("m")))
			got, err := b.Get(ctx, key, ChunkSize)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("get: %d bytes, %v", len(got), err)
			}
			if _, err := b.Get(ctx, key, ChunkSize-1); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("get beyond its bound: %v, want ErrCorrupt", err)
			}
			if o, err := b.Stat(ctx, key); err != nil || o.Size != ChunkSize || time.Since(o.ModTime) > time.Minute {
				t.Fatalf("stat: %+v %v", o, err)
			}
			var keys []string
			must(t, b.List(ctx, "chunks/", func(o ObjectInfo) error { keys = append(keys, o.Key); return nil }))
			if len(keys) != 1 || keys[0] != key {
				t.Fatalf("list chunks/: %v", keys)
			}
			for _, bad := range []string{"../etc/passwd", "/abs", "chunks/../../x", "Chunks/X", "a//b", ""} {
				if err := b.Put(ctx, bad, []byte("x")); err == nil {
					t.Fatalf("put %q accepted", bad)
				}
			}
			must(t, b.Delete(ctx, key))
			must(t, b.Delete(ctx, key)) // missing: no error
			if _, err := b.Stat(ctx, key); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("stat after delete: %v", err)
			}
		})
	}
}

func TestOpenBackendSpecs(t *testing.T) {
	ctx := context.Background()
	for _, bad := range []string{"", "/tmp/x", "dir:relative", "s3://", "s3://b/UPPER?endpoint=127.0.0.1:1", "s3://key:secret@b/p", "gs://b"} {
		if _, err := OpenBackend(ctx, bad, func(string) string { return "" }); err == nil {
			t.Errorf("OpenBackend(%q) accepted", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("OpenBackend(%q): error shows the credential: %v", bad, err)
		}
	}
	spec, env := fakeS3(t, "exists")
	if _, err := OpenBackend(ctx, strings.Replace(spec, "exists", "missing", 1), env); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a missing bucket: %v", err)
	}
}

// counting wraps a backend and counts Gets.
type counting struct {
	Backend
	gets atomic.Int64
}

func (c *counting) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	c.gets.Add(1)
	return c.Backend.Get(ctx, key, max)
}

// TestSharedStoreRestoreElsewhere captures on one store and restores on
// another (another node's local directory) through each shared backend:
// the tree comes back exactly, chunks are fetched once (then cached), a
// tampered shared object is refused and not cached, and GCShared keeps
// what is kept and removes the rest.
func TestSharedStoreRestoreElsewhere(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	for name, b := range backends(t) {
		t.Run(name, func(t *testing.T) {
			a, err := Open(t.TempDir(), t.Logf)
			must(t, err)
			a.SetShared(b)
			l := newLayer(t)
			big := make([]byte, 3*ChunkSize+17)
			rand.Read(big)
			write(t, l, "home/u/big.bin", big, 0o600, 1000)
			write(t, l, "etc/motd", []byte("hello\n"), 0o644, 0)
			chownDirs(t, l.Dir)
			want := treeDigest(t, l.Dir)
			r1, err := a.Capture(ctx, l, nil)
			must(t, err)
			write(t, l, "etc/motd", []byte("second\n"), 0o644, 0)
			parent, err := a.LoadState(ctx, []string{r1.Manifest})
			must(t, err)
			r2, err := a.Capture(ctx, l, parent)
			must(t, err)
			want2 := treeDigest(t, l.Dir)

			cb := &counting{Backend: b}
			other, err := Open(t.TempDir(), t.Logf)
			must(t, err)
			other.SetShared(cb)
			restore := func(s *Store, chain []string) string {
				st, img, err := s.LoadChain(ctx, chain)
				must(t, err)
				if img != nil {
					t.Fatal("unexpected process image")
				}
				dst := newLayer(t)
				_, err = s.Materialize(ctx, st, dst)
				must(t, err)
				return treeDigest(t, dst.Dir)
			}
			if got := restore(other, []string{r1.Manifest}); got != want {
				t.Fatalf("restored elsewhere:\n%s\nwant\n%s", got, want)
			}
			// 1 manifest + 5 distinct chunks (4 of big.bin, 1 of motd).
			if n := cb.gets.Load(); n != 6 {
				t.Fatalf("%d fetches, want 6", n)
			}
			if got := restore(other, []string{r1.Manifest, r2.Manifest}); got != want2 {
				t.Fatalf("restored chain elsewhere:\n%s\nwant\n%s", got, want2)
			}
			before := cb.gets.Load()
			if got := restore(other, []string{r1.Manifest, r2.Manifest}); got != want2 || cb.gets.Load() != before {
				t.Fatalf("second restore refetched (%d → %d fetches)", before, cb.gets.Load())
			}

			// A shared object that does not match its digest is refused.
			third, err := Open(t.TempDir(), t.Logf)
			must(t, err)
			third.SetShared(b)
			m, err := a.LoadManifest(r1.Manifest)
			must(t, err)
			var victim string
			for _, e := range m.Entries {
				if e.Path == "home/u/big.bin" {
					victim = e.Chunks[0]
				}
			}
			orig, err := b.Get(ctx, chunkKey(victim), ChunkSize)
			must(t, err)
			bad := append([]byte{}, orig...)
			bad[0] ^= 1
			must(t, b.Put(ctx, chunkKey(victim), bad))
			if _, _, err := third.LoadChain(ctx, []string{r1.Manifest}); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("tampered chunk: %v, want ErrCorrupt", err)
			}
			if _, err := os.Stat(third.chunkPath(victim)); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("a tampered chunk was cached: %v", err)
			}
			must(t, b.Put(ctx, chunkKey(victim), orig))

			// Collection: nothing young goes; with minAge 0, what r1 does
			// not name goes (r2's manifest and its new motd chunk).
			// A store that holds none of the kept manifests (a wrong
			// prefix?) is left alone.
			if _, err := a.GCShared(ctx, []string{strings.Repeat("0", 64)}, 0); err == nil || !strings.Contains(err.Error(), "collecting nothing") {
				t.Fatalf("gc with no kept manifest found: %v", err)
			}
			res, err := a.GCShared(ctx, []string{r1.Manifest}, SharedGCMinAge)
			must(t, err)
			if res.ManifestsRemoved+res.ChunksRemoved != 0 {
				t.Fatalf("young objects collected: %+v", res)
			}
			// A kept manifest in neither store (captured elsewhere before
			// the store was configured) keeps nothing here.
			res, err = a.GCShared(ctx, []string{r1.Manifest, strings.Repeat("1", 64)}, 0)
			must(t, err)
			if res.ManifestsRemoved != 1 || res.ChunksRemoved != 1 || res.ChunksKept != 5 {
				t.Fatalf("gc: %+v, want 1 manifest and 1 chunk removed, 5 kept", res)
			}
			fresh, err := Open(t.TempDir(), t.Logf)
			must(t, err)
			fresh.SetShared(b)
			if got := restore(fresh, []string{r1.Manifest}); got != want {
				t.Fatal("kept snapshot does not restore after gc")
			}
			if _, _, err := fresh.LoadChain(ctx, []string{r1.Manifest, r2.Manifest}); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("collected manifest: %v, want fs.ErrNotExist", err)
			}
		})
	}
}

// TestSharedPublishRenews: an object found in the shared store but
// written long ago is written again (renewed), so a collection cannot
// remove it while a new manifest comes to name it.
func TestSharedPublishRenews(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b, err := OpenDirBackend(dir)
	must(t, err)
	s, err := Open(t.TempDir(), t.Logf)
	must(t, err)
	s.SetShared(b)
	data := []byte("chunk")
	sum := sha256.Sum256(data)
	d := hex.EncodeToString(sum[:])
	must(t, b.Put(ctx, chunkKey(d), data))
	old := time.Now().Add(-2 * time.Hour)
	p := filepath.Join(dir, "chunks", d[:2], d)
	must(t, os.Chtimes(p, old, old))
	if _, _, err := s.putChunk(ctx, data); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || time.Since(fi.ModTime()) > time.Minute {
		t.Fatalf("old shared chunk not renewed: %v %v", fi.ModTime(), err)
	}
}
