package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Process images (format 2) are cut into page-aligned, content-defined
// chunks and stored zstd-compressed:
//
//   - Boundaries fall only between 4 KiB pages. The bulk of an image is
//     memory pages (gVisor's pages.img, CRIU's pages-*.img), so a page
//     that changes touches one chunk, and a page inserted or removed
//     (memory allocated or freed between two checkpoints) shifts the
//     following pages by whole pages: a boundary decided by the page's
//     own content moves with them, where fixed offsets would change
//     every later chunk.
//   - A chunk ends after a page whose hash has its top 4 bits clear,
//     once it holds minChunkPages pages, and at maxChunkPages at the
//     latest: about 64 KiB on average. Smaller chunks would dedupe
//     scattered dirty pages better but cost a file (or S3 object) and a
//     manifest record (~150 bytes) each; at 64 KiB one changed MiB costs
//     about 1.2 MiB before compression and a 1 GiB image about 16,000
//     objects and a 2.5 MB manifest.
//   - Runs of zero pages never end a chunk before maxChunkPages, so a
//     sparse memory file makes few, tiny (compressed) chunks, all one
//     object.
//   - A chunk that changed since the parent image is stored as a zstd
//     frame compressed with the parent's version of that range as its
//     dictionary (ImagePart.Base), when that is less than half the size
//     of compressing it alone. A process's dirty pages are scattered
//     (malloc reuses freed blocks all over its heap; measured on gVisor:
//     2 MiB of changed pages touched 150 chunks), so a whole new chunk
//     per dirty page would store ~10x what changed; the difference
//     stores about what changed. A base is always a whole chunk, never
//     a difference itself: a restore decodes at most two objects per
//     chunk, and the next change of that range is again a difference to
//     the same base (so it grows with the changes since the base, and a
//     chunk is stored whole again once that stops paying).
//   - Objects are named by the SHA-256 of their compressed bytes, like
//     every chunk of the store: GC, the shared store, peer fetches and
//     their digest checks treat them as any chunk. The manifest also
//     records each chunk's uncompressed SHA-256: a capture reuses the
//     parent image's object for an unchanged chunk without compressing
//     it again, and a restore checks what it decompressed. Compression is
//     deterministic (one encoder, fixed level), so the same chunk of two
//     unrelated sandboxes is one object too.
const (
	pageSize      = 4096
	minChunkPages = 4
	maxChunkPages = 64
	// MaxImageChunk bounds one uncompressed chunk of a format-2 image.
	MaxImageChunk = maxChunkPages * pageSize
	// imageFormatPaged is ProcessImage.Format for page-chunked,
	// compressed images; 0 is the original format (fixed 1 MiB raw
	// chunks), which still restores.
	imageFormatPaged = 2
	// boundaryShift picks the hash bits that decide a boundary (1 page
	// in 16 past the minimum).
	boundaryShift = 60
	// dictID is the zstd dictionary id of a difference's base.
	dictID = 1
	// splitBufSize is the read buffer of a capture's splitPages.
	splitBufSize = 4 * MaxImageChunk
)

// zeroPageHash is pageHash of a page of zeros.
var zeroPageHash = pageHash(make([]byte, pageSize))

// pageHash mixes a page's 8-byte words; it only places boundaries, so it
// need not resist collisions, only be the same on every node.
func pageHash(p []byte) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i+8 <= len(p); i += 8 {
		h = (h ^ binary.LittleEndian.Uint64(p[i:])) * 0x9e3779b97f4a7c15
	}
	h ^= h >> 31
	h *= 0xbf58476d1ce4e5b9
	return h ^ h>>29
}

// splitPages reads r to its end and calls emit with each chunk in order
// (the slice is valid during the call only). buf must hold more than
// MaxImageChunk+pageSize bytes; the bytes of an unfinished chunk move to
// its front before each read, so a larger one copies less.
func splitPages(r io.Reader, buf []byte, emit func([]byte) error) error {
	start, scan, end := 0, 0, 0
	eof := false
	for {
		if !eof && end-scan < pageSize {
			if start > 0 {
				copy(buf, buf[start:end])
				scan, end, start = scan-start, end-start, 0
			}
			n, err := io.ReadFull(r, buf[end:])
			end += n
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				eof = true
			} else if err != nil {
				return err
			}
		}
		if end-scan < pageSize {
			// Only at the end: the rest (a partial page at most) ends
			// the last chunk.
			if end > start {
				return emit(buf[start:end])
			}
			return nil
		}
		h := pageHash(buf[scan : scan+pageSize])
		scan += pageSize
		pages := (scan - start) / pageSize
		if pages >= maxChunkPages || (pages >= minChunkPages && h>>boundaryShift == 0 && h != zeroPageHash) {
			if err := emit(buf[start:scan]); err != nil {
				return err
			}
			start = scan
		}
	}
}

// imageWriter stores the chunks of one format-2 image.
type imageWriter struct {
	s     *Store
	enc   *zstd.Encoder
	delta *zstd.Encoder // made on first use; its dictionary is set per chunk
	rd    *imageReader  // reads bases
	// reuse maps an uncompressed chunk's SHA-256 to a stored part of the
	// same content (from the parent image and from this one).
	reuse map[string]ImagePart
	// parent is the parent image's parts by file, with their offsets,
	// for the base of a changed chunk.
	parent map[string][]parentPart
	// at maps a parent part (file and content) to its offset there;
	// shift is, per file, how far the parent's content lay from this
	// image's at the last chunk found unchanged: memory allocated or
	// freed in between moves the rest of a pages file, and the base of a
	// changed chunk is looked up where its neighbours went.
	at               map[string]int64
	shift            map[string]int64
	zbuf, dbuf, bbuf []byte
	raw              []byte
}

type parentPart struct {
	off int64
	p   ImagePart
}

func newImageWriter(s *Store, parent *ProcessImage) (*imageWriter, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
		zstd.WithZeroFrames(true), zstd.WithEncoderCRC(false))
	if err != nil {
		return nil, fmt.Errorf("snapshot: zstd: %w", err)
	}
	w := &imageWriter{s: s, enc: enc, reuse: map[string]ImagePart{}, parent: map[string][]parentPart{},
		at: map[string]int64{}, shift: map[string]int64{}}
	if parent != nil && parent.Format == imageFormatPaged {
		for _, f := range parent.Files {
			var off int64
			for _, p := range f.Parts {
				w.reuse[p.Sum] = p
				w.parent[f.Path] = append(w.parent[f.Path], parentPart{off, p})
				w.at[f.Path+"\x00"+p.Sum] = off
				off += int64(p.Len)
			}
		}
	}
	return w, nil
}

func (w *imageWriter) close() {
	w.enc.Close()
	if w.delta != nil {
		w.delta.Close()
	}
	if w.rd != nil {
		w.rd.close()
	}
}

// put stores the chunk of file path at off unless a part of the same
// content is at hand; newBytes is what it added to the store (0 when it
// was there).
func (w *imageWriter) put(ctx context.Context, path string, off int64, raw []byte) (ImagePart, int64, error) {
	sum := sha256.Sum256(raw)
	part := ImagePart{Sum: hex.EncodeToString(sum[:]), Len: len(raw)}
	if poff, ok := w.at[path+"\x00"+part.Sum]; ok {
		w.shift[path] = poff - off
	}
	if p, ok := w.reuse[part.Sum]; ok {
		have, err := w.s.haveChunk(ctx, p.Object)
		if err == nil && have && p.Base != "" {
			have, err = w.s.haveChunk(ctx, p.Base)
		}
		if err != nil {
			return part, 0, err
		}
		if have {
			return p, 0, nil
		}
	}
	w.zbuf = w.enc.EncodeAll(raw, w.zbuf[:0])
	out := w.zbuf
	if base := w.base(ctx, path, off+w.shift[path]); base != "" {
		if err := w.delta.ResetWithOptions(nil, zstd.WithEncoderDictRaw(dictID, w.raw)); err != nil {
			return part, 0, fmt.Errorf("snapshot: zstd: %w", err)
		}
		w.dbuf = w.delta.EncodeAll(raw, w.dbuf[:0])
		if len(w.dbuf) < len(w.zbuf)/2 {
			out, part.Base = w.dbuf, base
		}
	}
	d, isNew, err := w.s.putChunk(ctx, out)
	if err != nil {
		return part, 0, err
	}
	part.Object = d
	w.reuse[part.Sum] = part
	if !isNew {
		return part, 0, nil
	}
	return part, int64(len(out)), nil
}

// base returns the whole chunk of the parent image whose range holds off
// in the same file (its base, if it is a difference), with its content in w.raw; "" when there is none (no
// parent, or its base is not here: the chunk is stored whole).
func (w *imageWriter) base(ctx context.Context, path string, off int64) string {
	pp := w.parent[path]
	i := sort.Search(len(pp), func(i int) bool { return pp[i].off > off }) - 1
	if i < 0 {
		return ""
	}
	base := pp[i].p.Object
	if pp[i].p.Base != "" {
		base = pp[i].p.Base
	}
	if have, err := w.s.haveChunk(ctx, base); err != nil || !have {
		return ""
	}
	if w.rd == nil {
		rd, err := newImageReader(w.s)
		if err != nil {
			return ""
		}
		delta, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
			zstd.WithZeroFrames(true), zstd.WithEncoderCRC(false), zstd.WithEncoderDictRaw(dictID, nil))
		if err != nil {
			rd.close()
			return ""
		}
		w.rd, w.delta = rd, delta
		w.bbuf, w.raw = make([]byte, 0, ChunkSize), make([]byte, 0, MaxImageChunk)
	}
	z, err := w.s.readChunk(base, w.bbuf)
	if err != nil {
		return ""
	}
	// A base is a whole chunk: it decodes without a dictionary.
	if w.raw, err = w.rd.dec.DecodeAll(z, w.raw[:0]); err != nil || len(w.raw) > MaxImageChunk {
		return ""
	}
	return base
}

// haveChunk reports whether the chunk d is in the local directory, and
// (with a shared store) makes sure it is in the shared store too, as
// putChunk would: a manifest in the shared store never names a chunk it
// lacks.
func (s *Store) haveChunk(ctx context.Context, d string) (bool, error) {
	if _, err := os.Lstat(s.chunkPath(d)); err != nil {
		return false, nil
	}
	if s.shared == nil || s.shared.isKnown(chunkKey(d)) {
		return true, nil
	}
	data, err := os.ReadFile(s.chunkPath(d))
	if err != nil {
		return false, nil
	}
	return true, s.publish(ctx, chunkKey(d), data)
}

// imageReader decompresses and checks the chunks of a format-2 image.
type imageReader struct {
	s   *Store
	dec *zstd.Decoder
}

func newImageReader(s *Store) (*imageReader, error) {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(2*MaxImageChunk))
	if err != nil {
		return nil, fmt.Errorf("snapshot: zstd: %w", err)
	}
	return &imageReader{s: s, dec: dec}, nil
}

func (r *imageReader) close() { r.dec.Close() }

// read returns part's content in out (cap MaxImageChunk), checked against
// its length and uncompressed digest; zbuf and bbuf are scratch for the
// object and its base.
func (r *imageReader) read(p ImagePart, zbuf, bbuf, out []byte) ([]byte, error) {
	if p.Base != "" {
		bz, err := r.s.readChunk(p.Base, zbuf)
		if err != nil {
			return nil, err
		}
		dict, err := r.dec.DecodeAll(bz, bbuf[:0])
		if err != nil || len(dict) > MaxImageChunk {
			return nil, fmt.Errorf("%w: base chunk %s: %v", ErrCorrupt, p.Base, err)
		}
		if err := r.dec.ResetWithOptions(nil, zstd.WithDecoderDictRaw(dictID, dict)); err != nil {
			return nil, fmt.Errorf("snapshot: zstd: %w", err)
		}
	}
	z, err := r.s.readChunk(p.Object, zbuf)
	if err != nil {
		return nil, err
	}
	raw, err := r.dec.DecodeAll(z, out[:0])
	if err != nil {
		return nil, fmt.Errorf("%w: chunk %s: %v", ErrCorrupt, p.Object, err)
	}
	if len(raw) != p.Len {
		return nil, fmt.Errorf("%w: chunk %s holds %d bytes, want %d", ErrCorrupt, p.Object, len(raw), p.Len)
	}
	if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != p.Sum {
		return nil, fmt.Errorf("%w: chunk %s does not hold the content its manifest names", ErrCorrupt, p.Object)
	}
	return raw, nil
}

// writePagedFile writes a format-2 image file: the file is sized first
// and chunks of zeros are left as holes; two workers decompress (a
// restore waits for the whole image: runsc reads it from a file).
func (s *Store) writePagedFile(ctx context.Context, out *os.File, f ImageFile) (int64, error) {
	if err := out.Truncate(f.Size); err != nil {
		return 0, err
	}
	type job struct {
		p   ImagePart
		off int64
	}
	jobs := make(chan job)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		first   error
		written int64
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
		cancel()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := newImageReader(s)
			if err != nil {
				fail(err)
				return
			}
			defer r.close()
			zbuf := make([]byte, 0, ChunkSize)
			bbuf := make([]byte, 0, MaxImageChunk)
			raw := make([]byte, 0, MaxImageChunk)
			for j := range jobs {
				data, err := r.read(j.p, zbuf, bbuf, raw)
				if err != nil {
					fail(err)
					return
				}
				if allZero(data) {
					continue
				}
				if _, err := out.WriteAt(data, j.off); err != nil {
					fail(err)
					return
				}
				mu.Lock()
				written += int64(len(data))
				mu.Unlock()
			}
		}()
	}
	var off int64
feed:
	for _, p := range f.Parts {
		select {
		case jobs <- job{p, off}:
		case <-ctx.Done():
			break feed
		}
		off += int64(p.Len)
	}
	close(jobs)
	wg.Wait()
	if first != nil {
		return written, first
	}
	if err := ctx.Err(); err != nil {
		return written, err
	}
	return f.Size, nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
