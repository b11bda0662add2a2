package template

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// OCI whiteout markers (image-spec layer.md): ".wh.NAME" deletes NAME of
// the lower layers, ".wh..wh..opq" in a directory hides everything the
// lower layers had in it.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// layerApplier applies image layers, lowest first, into one staging tree.
// It wraps the hardened tar extractor (tarx.go), which confines every
// operation to the os.Root, and adds what a layer stack needs on top:
// whiteouts, opaque directories, and upper entries replacing lower
// directories. Limits on bytes and entries count across all layers.
type layerApplier struct {
	x       *extractor
	bytes   int64
	entries int
	// this is every name (and every parent of a name) that the layer being
	// applied has produced: whiteouts never remove those.
	this map[string]bool
}

func newLayerApplier(root *os.Root, lim extractLimits) *layerApplier {
	return &layerApplier{x: &extractor{root: root, lim: lim, regular: map[string]bool{}, dirs: map[string]dirMeta{}}}
}

// apply reads one uncompressed layer tar stream.
func (a *layerApplier) apply(ctx context.Context, r io.Reader, onEntry func(name string)) error {
	a.this = map[string]bool{".": true}
	type opaque struct{ dir string }
	var opaques []opaque
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: layer tar: %w", ErrUnsafeInput, err)
		}
		a.entries++
		if a.entries > a.x.lim.maxEntries {
			return fmt.Errorf("%w: more than %d entries", ErrLimit, a.x.lim.maxEntries)
		}
		// Checked before reading: a header may claim terabytes.
		if hdr.Size < 0 || hdr.Size > a.x.lim.maxBytes-a.bytes {
			return fmt.Errorf("%w: entry %q of %d bytes exceeds the %d-byte limit", ErrLimit, hdr.Name, hdr.Size, a.x.lim.maxBytes)
		}
		a.bytes += hdr.Size
		name, err := cleanEntryName(hdr.Name)
		if err != nil {
			return err
		}
		dir, base := path.Split(name)
		dir = strings.TrimSuffix(dir, "/")
		if dir == "" {
			dir = "."
		}
		for _, c := range strings.Split(dir, "/") {
			if strings.HasPrefix(c, whiteoutPrefix) {
				return fmt.Errorf("%w: %q has a whiteout name as a directory", ErrUnsafeInput, hdr.Name)
			}
		}
		if base == whiteoutOpaque {
			a.markThis(dir)
			opaques = append(opaques, opaque{dir})
			continue
		}
		if strings.HasPrefix(base, whiteoutPrefix) {
			target := strings.TrimPrefix(base, whiteoutPrefix)
			if strings.HasPrefix(target, whiteoutPrefix) {
				continue // other AUFS metadata (.wh..wh.plnk etc.): never materialised
			}
			if target == "" || target == "." || target == ".." {
				return fmt.Errorf("%w: whiteout %q names no entry", ErrUnsafeInput, hdr.Name)
			}
			if err := a.whiteout(path.Join(dir, target)); err != nil {
				return err
			}
			continue
		}
		// An upper non-directory replaces a lower directory (the extractor
		// alone refuses that, as plain tar must).
		if hdr.Typeflag != tar.TypeDir && name != "." && !a.this[name] {
			if fi, err := a.x.root.Lstat(name); err == nil && fi.IsDir() {
				if err := a.removeLower(name); err != nil {
					return err
				}
			}
		}
		a.markThis(name)
		if err := a.x.entry(ctx, hdr, tr); err != nil {
			return err
		}
		if onEntry != nil {
			onEntry(name)
		}
	}
	for _, o := range opaques {
		if err := a.prune(o.dir); err != nil {
			return err
		}
	}
	return nil
}

// markThis records name and its parents as produced by the current layer.
func (a *layerApplier) markThis(name string) {
	for name != "." && name != "" && !a.this[name] {
		a.this[name] = true
		name = path.Dir(name)
	}
}

// whiteout removes name as the lower layers left it. A whiteout for a name
// this same layer produced is invalid per spec and ignored.
func (a *layerApplier) whiteout(name string) error {
	if a.this[name] {
		return nil
	}
	if _, err := a.x.root.Lstat(name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // nothing below to hide
		}
		// A parent that is a symlink leading out of the root, or a file.
		return fmt.Errorf("%w: whiteout %q: %w", ErrUnsafeInput, name, err)
	}
	return a.removeLower(name)
}

// removeLower deletes name (recursively) through the root and forgets what
// the extractor knew about it.
func (a *layerApplier) removeLower(name string) error {
	if err := a.x.root.RemoveAll(name); err != nil {
		return fmt.Errorf("template: apply layer: remove %q: %w", name, err)
	}
	prefix := name + "/"
	for n := range a.x.dirs {
		if n == name || strings.HasPrefix(n, prefix) {
			delete(a.x.dirs, n)
		}
	}
	for n := range a.x.regular {
		if n == name || strings.HasPrefix(n, prefix) {
			delete(a.x.regular, n)
		}
	}
	return nil
}

// prune implements an opaque directory: everything under dir that this
// layer did not produce is removed, at any depth.
func (a *layerApplier) prune(dir string) error {
	fi, err := a.x.root.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return nil // the layer replaced it with something else, or removed it
	}
	d, err := a.x.root.Open(dir)
	if err != nil {
		return fmt.Errorf("%w: opaque %q: %w", ErrUnsafeInput, dir, err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("template: opaque %q: %w", dir, err)
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if !a.this[p] {
			if err := a.removeLower(p); err != nil {
				return err
			}
			continue
		}
		if fi, err := a.x.root.Lstat(p); err == nil && fi.IsDir() {
			if err := a.prune(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish applies directory metadata once, after the last layer.
func (a *layerApplier) finish() error { return a.x.finishDirs() }
