package template

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"
)

const (
	maxNameLen      = 4096
	maxComponentLen = 255
)

// extractLimits bound what one archive or directory may make us write.
type extractLimits struct {
	maxBytes   int64  // sum of entry sizes
	maxEntries int    // number of entries
	uidCount   uint32 // owners must be < uidCount (in-sandbox ids)
	chown      bool   // set owners (needs root); off only in unprivileged tests
}

func (m *Manager) limits() extractLimits {
	return extractLimits{maxBytes: m.opts.MaxBytes, maxEntries: m.opts.MaxEntries, uidCount: m.opts.UIDCount, chown: true}
}

// buildTar extracts the already-hashed tarball f into root, hashing the raw
// bytes again on the way so an in-place modification since planning fails
// the build instead of caching content under the wrong digest.
func (m *Manager) buildTar(ctx context.Context, f *os.File, size int64, wantHex, root string, p Progress) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("template: rewind tarball: %w", err)
	}
	h := sha256.New()
	cr := &countingReader{r: io.LimitReader(&ctxReader{ctx: ctx, r: f}, size)}
	raw := io.TeeReader(cr, h)
	dst, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("template: open staging: %w", err)
	}
	defer dst.Close()
	prog := func(entries int64, msg string) { p("extract", cr.n, size, msg) }
	if err := extractTar(ctx, raw, dst, m.limits(), prog, m.opts.Logf); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, raw); err != nil {
		return fmt.Errorf("template: read tarball: %w", err)
	}
	if cr.n != size || hex.EncodeToString(h.Sum(nil)) != wantHex {
		return fmt.Errorf("%w: tarball changed during the build", ErrUnsafeInput)
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

type dirMeta struct {
	mode     fs.FileMode
	uid, gid int
	mtime    time.Time
}

// extractor holds the state of one tar extraction into an os.Root, which
// confines every operation (symlinks included) to the staging tree.
type extractor struct {
	root    *os.Root
	lim     extractLimits
	regular map[string]bool    // names extracted as regular files: valid hardlink targets
	dirs    map[string]dirMeta // metadata applied after all entries, deepest first
	skipped int
}

// extractTar extracts a .tar or .tar.gz stream into root. Hostile input is
// expected: names with ".." fail, absolute names become relative, hardlinks
// must point at regular files extracted earlier, device nodes and fifos are
// skipped, sizes and entry counts are bounded before anything is read.
func extractTar(ctx context.Context, r io.Reader, root *os.Root, lim extractLimits, prog func(entries int64, msg string), logf func(string, ...any)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var in io.Reader = br
	magic, _ := br.Peek(6)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: gzip: %w", ErrUnsafeInput, err)
		}
		defer gz.Close()
		in = gz
	case bytes.HasPrefix(magic, []byte{0xfd, '7', 'z', 'X', 'Z', 0}),
		bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}),
		bytes.HasPrefix(magic, []byte("BZh")):
		return fmt.Errorf("%w: only .tar and .tar.gz are supported", ErrInvalid)
	}
	x := &extractor{root: root, lim: lim, regular: map[string]bool{}, dirs: map[string]dirMeta{}}
	tr := tar.NewReader(in)
	var total int64
	entries := 0
	prog(0, "extracting")
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: tar: %w", ErrUnsafeInput, err)
		}
		entries++
		if entries > lim.maxEntries {
			return fmt.Errorf("%w: more than %d entries", ErrLimit, lim.maxEntries)
		}
		// Checked before reading: a header may claim terabytes.
		if hdr.Size < 0 || hdr.Size > lim.maxBytes-total {
			return fmt.Errorf("%w: entry %q of %d bytes exceeds the %d-byte limit", ErrLimit, hdr.Name, hdr.Size, lim.maxBytes)
		}
		total += hdr.Size
		if err := x.entry(ctx, hdr, tr); err != nil {
			return err
		}
		if entries%256 == 0 {
			prog(int64(entries), hdr.Name)
		}
	}
	if err := x.finishDirs(); err != nil {
		return err
	}
	msg := fmt.Sprintf("%d entries", entries)
	if x.skipped > 0 {
		msg += fmt.Sprintf(", skipped %d device nodes/fifos", x.skipped)
		logf("template: tar: skipped %d device nodes/fifos", x.skipped)
	}
	prog(int64(entries), msg)
	return nil
}

// cleanEntryName makes an archive name relative and rejects any ".."
// component outright (even harmless ones like "a/../b": nothing legitimate
// needs them). The root itself is ".".
func cleanEntryName(n string) (string, error) {
	if n == "" || len(n) > maxNameLen || strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("%w: bad entry name %q", ErrUnsafeInput, n)
	}
	var parts []string
	for _, c := range strings.Split(n, "/") {
		switch {
		case c == "" || c == ".":
		case c == "..":
			return "", fmt.Errorf("%w: entry name %q escapes the root", ErrUnsafeInput, n)
		case len(c) > maxComponentLen:
			return "", fmt.Errorf("%w: entry name %q has a component longer than %d", ErrUnsafeInput, n, maxComponentLen)
		default:
			parts = append(parts, c)
		}
	}
	if len(parts) == 0 {
		return ".", nil
	}
	return strings.Join(parts, "/"), nil
}

func tarMode(mode int64) fs.FileMode {
	m := fs.FileMode(mode & 0o777)
	if mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func (x *extractor) entry(ctx context.Context, hdr *tar.Header, body io.Reader) error {
	name, err := cleanEntryName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || uint64(hdr.Uid) >= uint64(x.lim.uidCount) || uint64(hdr.Gid) >= uint64(x.lim.uidCount) {
		return fmt.Errorf("%w: %q is owned by %d:%d, outside 0..%d", ErrUnsafeInput, hdr.Name, hdr.Uid, hdr.Gid, x.lim.uidCount-1)
	}
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		x.skipped++
		return nil
	case tar.TypeDir:
		if name != "." {
			if err := x.prepare(name, true); err != nil {
				return err
			}
		}
		x.dirs[name] = dirMeta{mode: tarMode(hdr.Mode), uid: hdr.Uid, gid: hdr.Gid, mtime: hdr.ModTime}
		return nil
	// archive/tar reports the legacy TypeRegA as TypeReg.
	case tar.TypeReg, tar.TypeGNUSparse, tar.TypeSymlink, tar.TypeLink:
	default:
		return fmt.Errorf("%w: %q has unsupported type %q", ErrUnsafeInput, hdr.Name, hdr.Typeflag)
	}
	if name == "." {
		return fmt.Errorf("%w: non-directory entry %q for the root", ErrUnsafeInput, hdr.Name)
	}
	if err := x.prepare(name, false); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeSymlink:
		// The target is kept verbatim: it is only ever resolved inside the
		// sandbox's own root, and os.Root refuses to follow it here.
		if hdr.Linkname == "" || len(hdr.Linkname) > maxNameLen || strings.ContainsRune(hdr.Linkname, 0) {
			return fmt.Errorf("%w: symlink %q has a bad target", ErrUnsafeInput, hdr.Name)
		}
		if err := x.root.Symlink(hdr.Linkname, name); err != nil {
			return fmt.Errorf("template: extract %q: %w", hdr.Name, err)
		}
		return x.chown(name, hdr)
	case tar.TypeLink:
		target, err := cleanEntryName(hdr.Linkname)
		if err != nil {
			return err
		}
		if !x.regular[target] {
			return fmt.Errorf("%w: hardlink %q to %q, which is not an earlier regular file", ErrUnsafeInput, hdr.Name, hdr.Linkname)
		}
		if fi, err := x.root.Lstat(target); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("%w: hardlink %q to %q, which is not a regular file", ErrUnsafeInput, hdr.Name, hdr.Linkname)
		}
		if err := x.root.Link(target, name); err != nil {
			return fmt.Errorf("template: extract %q: %w", hdr.Name, err)
		}
		x.regular[name] = true
		return nil
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscallNoFollow, 0o600)
	if err != nil {
		return fmt.Errorf("template: extract %q: %w", hdr.Name, err)
	}
	n, err := io.CopyN(f, &ctxReader{ctx: ctx, r: body}, hdr.Size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: %q truncated after %d of %d bytes", ErrUnsafeInput, hdr.Name, n, hdr.Size)
		}
		return fmt.Errorf("template: extract %q: %w", hdr.Name, err)
	}
	if err := x.chown(name, hdr); err != nil {
		return err
	}
	if err := x.root.Chmod(name, tarMode(hdr.Mode)); err != nil {
		return fmt.Errorf("template: extract %q: %w", hdr.Name, err)
	}
	if err := x.root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
		return fmt.Errorf("template: extract %q: %w", hdr.Name, err)
	}
	x.regular[name] = true
	return nil
}

func (x *extractor) chown(name string, hdr *tar.Header) error {
	if !x.lim.chown {
		return nil
	}
	if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("template: extract %q: %w", hdr.Name, err)
	}
	return nil
}

// prepare creates missing parents of name and clears the way for it: a
// later entry replaces an earlier non-directory (as tar does), but never a
// directory, whose contents would silently vanish.
func (x *extractor) prepare(name string, isDir bool) error {
	parts := strings.Split(name, "/")
	for i := 1; i < len(parts); i++ {
		dir := strings.Join(parts[:i], "/")
		fi, err := x.root.Lstat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := x.mkdir(dir); err != nil {
				return err
			}
			if _, ok := x.dirs[dir]; !ok {
				x.dirs[dir] = dirMeta{mode: 0o755}
			}
		case err != nil:
			return fmt.Errorf("%w: parent of %q: %w", ErrUnsafeInput, name, err)
		case fi.IsDir(), fi.Mode()&fs.ModeSymlink != 0:
			// A symlinked parent is followed by os.Root, within the root only.
		default:
			return fmt.Errorf("%w: parent of %q is not a directory", ErrUnsafeInput, name)
		}
	}
	fi, err := x.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if isDir {
			return x.mkdir(name)
		}
		return nil
	case err != nil:
		return fmt.Errorf("%w: %q: %w", ErrUnsafeInput, name, err)
	case fi.IsDir():
		if isDir {
			return nil
		}
		return fmt.Errorf("%w: %q would replace a directory", ErrUnsafeInput, name)
	}
	if err := x.root.Remove(name); err != nil {
		return fmt.Errorf("template: replace %q: %w", name, err)
	}
	delete(x.regular, name)
	if isDir {
		return x.mkdir(name)
	}
	return nil
}

func (x *extractor) mkdir(name string) error {
	if err := x.root.Mkdir(name, 0o700); err != nil {
		return fmt.Errorf("template: mkdir %q: %w", name, err)
	}
	return nil
}

// finishDirs applies directory owners, modes and times last, deepest
// first, so adding children does not disturb mtimes and read-only modes do
// not block extraction.
func (x *extractor) finishDirs() error {
	names := make([]string, 0, len(x.dirs))
	for n := range x.dirs {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		di, dj := strings.Count(names[i], "/"), strings.Count(names[j], "/")
		if names[i] == "." {
			di = -1
		}
		if names[j] == "." {
			dj = -1
		}
		if di != dj {
			return di > dj
		}
		return names[i] < names[j]
	})
	for _, n := range names {
		d := x.dirs[n]
		fi, err := x.root.Lstat(n)
		if err != nil || !fi.IsDir() {
			continue // replaced by a later symlink entry? then it is not ours to touch
		}
		if x.lim.chown {
			if err := x.root.Lchown(n, d.uid, d.gid); err != nil {
				return fmt.Errorf("template: chown %q: %w", n, err)
			}
		}
		if err := x.root.Chmod(n, d.mode); err != nil {
			return fmt.Errorf("template: chmod %q: %w", n, err)
		}
		if !d.mtime.IsZero() {
			if err := x.root.Chtimes(n, d.mtime, d.mtime); err != nil {
				return fmt.Errorf("template: chtimes %q: %w", n, err)
			}
		}
	}
	return nil
}
