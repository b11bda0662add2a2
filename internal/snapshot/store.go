// Package snapshot stores sandbox snapshots: the writable layer's changes
// since a parent snapshot, as a manifest (one gzip'd JSON object per
// snapshot) whose file contents are split into fixed 1 MiB chunks named by
// their SHA-256, so identical data is stored once across snapshots and
// sandboxes. A manifest may also hold a process image (a driver's
// checkpoint directory: processes and memory), chunked the same way.
//
// Layout under the store's directory:
//
//	chunks/<2 hex>/<64 hex>   file content chunks
//	manifests/<64 hex>        gzip'd JSON manifests, named by their digest
//	tmp/                      writes in progress (renamed into place),
//	                          checkpoint images on their way in or out
//
// Writes are atomic (temp file + rename) and made durable with one syncfs
// before the caller commits the manifest's digest to its database; anything
// not referenced by a committed manifest is garbage that GC removes. GC must
// not run while a capture is in flight (the caller serialises them).
package snapshot

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"golang.org/x/sys/unix"
)

// ChunkSize is the fixed size of content chunks.
const ChunkSize = 1 << 20

// maxManifestBytes bounds a manifest, compressed and decompressed.
const maxManifestBytes = 512 << 20

// ErrCorrupt means stored data does not match its digest or is malformed.
var ErrCorrupt = errors.New("snapshot: corrupt data")

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ValidDigest reports whether d is a lower-case hex SHA-256.
func ValidDigest(d string) bool { return digestRE.MatchString(d) }

// Store is a content-addressed chunk and manifest store on a local directory.
type Store struct {
	dir  string
	logf func(string, ...any)
	// shared, if set, is the store that nodes share (SetShared): every
	// object written here is also put there (chunks before the manifest
	// that names them), and what is missing here is fetched from it.
	shared *sharedStore
	// manifests holds decoded, verified manifests by digest: a manifest
	// never changes under its digest, and a fork burst or a sandbox
	// hibernated again and again reads the same chain each time.
	manifests manifestCache
}

// manifestCache is a small FIFO of decoded manifests.
type manifestCache struct {
	mu    sync.Mutex
	m     map[string]*Manifest
	order []string
}

// Bounds of the manifest cache: entries, and the largest manifest kept
// (compressed bytes; a layer of many files is not worth the memory).
const (
	manifestCacheEntries  = 64
	manifestCacheMaxBytes = 1 << 20
)

func (c *manifestCache) get(digest string) *Manifest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[digest]
}

func (c *manifestCache) put(digest string, m *Manifest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*Manifest{}
	}
	if _, ok := c.m[digest]; ok {
		return
	}
	if len(c.order) >= manifestCacheEntries {
		delete(c.m, c.order[0])
		c.order = c.order[1:]
	}
	c.m[digest] = m
	c.order = append(c.order, digest)
}

// Open opens (creating if needed) a store at dir.
func Open(dir string, logf func(string, ...any)) (*Store, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	for _, d := range []string{abs, filepath.Join(abs, "chunks"), filepath.Join(abs, "manifests"), filepath.Join(abs, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
	}
	return &Store{dir: abs, logf: logf}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) chunkPath(d string) string {
	return filepath.Join(s.dir, "chunks", d[:2], d)
}

func (s *Store) manifestPath(d string) string { return filepath.Join(s.dir, "manifests", d) }

// writeAtomic writes data to path through a temp file and a rename, so a
// reader (or a crash) never sees a partial object under its final name.
func (s *Store) writeAtomic(path string, data []byte) error {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(s.dir, "tmp", hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = os.Rename(tmp, path); errors.Is(err, fs.ErrNotExist) {
			if err = os.MkdirAll(filepath.Dir(path), 0o700); err == nil {
				err = os.Rename(tmp, path)
			}
		}
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("snapshot: write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// putChunk stores data under its digest; isNew is false when it was there.
func (s *Store) putChunk(ctx context.Context, data []byte) (digest string, isNew bool, err error) {
	sum := sha256.Sum256(data)
	digest = hex.EncodeToString(sum[:])
	p := s.chunkPath(digest)
	if _, err := os.Lstat(p); err == nil {
		return digest, false, s.publish(ctx, chunkKey(digest), data)
	}
	if err := s.writeAtomic(p, data); err != nil {
		return "", false, err
	}
	return digest, true, s.publish(ctx, chunkKey(digest), data)
}

// readChunk returns a chunk after checking it against its digest.
func (s *Store) readChunk(digest string, buf []byte) ([]byte, error) {
	if !ValidDigest(digest) {
		return nil, fmt.Errorf("%w: bad chunk digest %.80q", ErrCorrupt, digest)
	}
	f, err := os.Open(s.chunkPath(digest))
	if err != nil {
		return nil, fmt.Errorf("snapshot: chunk %s: %w", digest, err)
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf[:cap(buf)])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("snapshot: chunk %s: %w", digest, err)
	}
	data := buf[:n]
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != digest {
		return nil, fmt.Errorf("%w: chunk %s does not match its digest", ErrCorrupt, digest)
	}
	return data, nil
}

// putManifest stores m and returns its digest and stored size.
func (s *Store) putManifest(ctx context.Context, m *Manifest) (string, int64, error) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err := json.NewEncoder(zw).Encode(m); err != nil {
		return "", 0, fmt.Errorf("snapshot: encode manifest: %w", err)
	}
	if err := zw.Close(); err != nil {
		return "", 0, fmt.Errorf("snapshot: encode manifest: %w", err)
	}
	sum := sha256.Sum256(buf.Bytes())
	d := hex.EncodeToString(sum[:])
	if _, err := os.Lstat(s.manifestPath(d)); err == nil {
		return d, int64(buf.Len()), s.publish(ctx, manifestKey(d), buf.Bytes())
	}
	if err := s.writeAtomic(s.manifestPath(d), buf.Bytes()); err != nil {
		return "", 0, err
	}
	// Last: the chunks it names are in the shared store already.
	return d, int64(buf.Len()), s.publish(ctx, manifestKey(d), buf.Bytes())
}

// LoadManifest reads and validates a manifest of the local directory.
// The manifest may be shared with other callers: it must not be changed.
func (s *Store) LoadManifest(digest string) (*Manifest, error) {
	return s.loadManifest(context.Background(), digest, nil)
}

// loadManifest is LoadManifest that, with a backend to fetch from, gets a
// manifest missing here from it (and keeps it here).
func (s *Store) loadManifest(ctx context.Context, digest string, from Backend) (*Manifest, error) {
	if !ValidDigest(digest) {
		return nil, fmt.Errorf("%w: bad manifest digest %.80q", ErrCorrupt, digest)
	}
	raw, err := os.ReadFile(s.manifestPath(digest))
	if err != nil && from != nil && errors.Is(err, fs.ErrNotExist) {
		raw, err = s.fetch(ctx, from, manifestKey(digest), digest, s.manifestPath(digest), maxManifestBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: manifest %s: %w", digest, err)
	}
	if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != digest {
		return nil, fmt.Errorf("%w: manifest %s does not match its digest", ErrCorrupt, digest)
	}
	// The file is read and checked every time (a collected or tampered
	// manifest fails as without the cache); only decoding is saved.
	if m := s.manifests.get(digest); m != nil {
		return m, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: manifest %s: %v", ErrCorrupt, digest, err)
	}
	var m Manifest
	dec := json.NewDecoder(io.LimitReader(zr, maxManifestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: manifest %s: %v", ErrCorrupt, digest, err)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("%w: manifest %s: %v", ErrCorrupt, digest, err)
	}
	if len(raw) <= manifestCacheMaxBytes {
		s.manifests.put(digest, &m)
	}
	return &m, nil
}

// LoadState merges a chain of manifests (oldest first) into the state of
// the writable layer at the last one.
func (s *Store) LoadState(ctx context.Context, chain []string) (State, error) {
	st, _, err := s.loadChain(ctx, chain, s.Shared())
	return st, err
}

// LoadParent is LoadState plus the last manifest's process image (nil
// when it has none), for a capture whose parent is the chain: nothing is
// prefetched (a capture only reuses the image's chunks it holds).
func (s *Store) LoadParent(ctx context.Context, chain []string) (State, *ProcessImage, error) {
	return s.loadChain(ctx, chain, s.Shared())
}

// LoadChain is LoadState plus the last manifest's process image (nil when
// it has none: a process image is never inherited from a parent). With a
// shared store, every chunk the state and image need is made local first
// (fetched and checked against its digest), for Materialize and
// MaterializeImage.
func (s *Store) LoadChain(ctx context.Context, chain []string) (State, *ProcessImage, error) {
	st, img, err := s.loadChain(ctx, chain, s.Shared())
	if err == nil && s.shared != nil {
		err = s.prefetch(ctx, s.shared.b, st, img)
	}
	if err != nil {
		return nil, nil, err
	}
	return st, img, nil
}

// LoadStateFrom is LoadState with every manifest and chunk it needs made
// local, fetched from b (another node's store, say) when missing here and
// checked against its digest before it is kept.
func (s *Store) LoadStateFrom(ctx context.Context, b Backend, chain []string) (State, error) {
	st, img, err := s.loadChain(ctx, chain, b)
	if err == nil {
		err = s.prefetch(ctx, b, st, img)
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (s *Store) loadChain(ctx context.Context, chain []string, from Backend) (State, *ProcessImage, error) {
	st := State{}
	var img *ProcessImage
	for _, d := range chain {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		m, err := s.loadManifest(ctx, d, from)
		if err != nil {
			return nil, nil, err
		}
		st.apply(m)
		img = m.Process
	}
	if err := st.validate(); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return st, img, nil
}

// sync makes everything written so far durable (one syncfs for the store's
// filesystem instead of an fsync per chunk).
func (s *Store) sync() error {
	f, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("snapshot: syncfs: %w", err)
	}
	return nil
}

// GCResult says what a collection removed and what remains.
type GCResult struct {
	ChunksRemoved    int   `json:"chunks_removed"`
	BytesRemoved     int64 `json:"bytes_removed"`
	ManifestsRemoved int   `json:"manifests_removed"`
	ChunksKept       int   `json:"chunks_kept"`
	BytesKept        int64 `json:"bytes_kept"`
}

// GC removes every manifest not in keep, every chunk none of the kept
// manifests references, and every temp file. A kept manifest that cannot be
// read keeps everything (nothing is deleted on a doubt).
func (s *Store) GC(ctx context.Context, keep []string) (GCResult, error) {
	var res GCResult
	keepM := map[string]bool{}
	refs := map[string]bool{}
	for _, d := range keep {
		m, err := s.LoadManifest(d)
		if err != nil && s.shared != nil && errors.Is(err, fs.ErrNotExist) {
			continue // kept in the shared store; nothing of it is cached here
		}
		if err != nil {
			return res, fmt.Errorf("snapshot: gc: kept %w", err)
		}
		keepM[d] = true
		for _, e := range m.Entries {
			for _, c := range e.Chunks {
				refs[c] = true
			}
		}
		if m.Process != nil {
			m.Process.chunkRefs(func(c string) { refs[c] = true })
		}
	}
	if ents, err := os.ReadDir(filepath.Join(s.dir, "tmp")); err == nil {
		for _, e := range ents {
			_ = os.RemoveAll(filepath.Join(s.dir, "tmp", e.Name()))
		}
	}
	ents, err := os.ReadDir(filepath.Join(s.dir, "manifests"))
	if err != nil {
		return res, fmt.Errorf("snapshot: gc: %w", err)
	}
	for _, e := range ents {
		if !keepM[e.Name()] {
			if err := os.Remove(s.manifestPath(e.Name())); err == nil {
				res.ManifestsRemoved++
			}
		}
	}
	subs, err := os.ReadDir(filepath.Join(s.dir, "chunks"))
	if err != nil {
		return res, fmt.Errorf("snapshot: gc: %w", err)
	}
	for _, sub := range subs {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		dir := filepath.Join(s.dir, "chunks", sub.Name())
		cs, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, c := range cs {
			info, err := c.Info()
			if err != nil {
				continue
			}
			if refs[c.Name()] {
				res.ChunksKept++
				res.BytesKept += info.Size()
				continue
			}
			if err := os.Remove(filepath.Join(dir, c.Name())); err == nil {
				res.ChunksRemoved++
				res.BytesRemoved += info.Size()
			}
		}
		_ = unix.Rmdir(dir) // only succeeds when empty
	}
	return res, nil
}
