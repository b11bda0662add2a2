package template

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	maxArchiveEntries  = 1 << 16
	maxArchiveMetaSize = 4 << 20 // index.json, manifest.json, manifests
	maxIndexDepth      = 4
	maxIndexEntries    = 1024 // descriptors visited over all nested indexes
)

// tarIndex maps the regular files (and symlinks) of an uncompressed,
// seekable tarball to their byte ranges, so blobs are read in place.
type tarIndex struct {
	f     *os.File
	files map[string][2]int64 // name → offset, size
	links map[string]string   // name → cleaned target name
}

// archiveImage opens a docker-archive or OCI-layout tarball (plain or
// gzip-compressed) and resolves its single linux image.
func (m *Manager) archiveImage(ctx context.Context, p string) (img *ociImage, err error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("template: open archive: %w", err)
	}
	closeAll := func() { f.Close() }
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: archive %q is not a regular file", ErrInvalid, p)
	}
	var magic [2]byte
	if _, err := io.ReadFull(f, magic[:]); err == nil && magic == [2]byte{0x1f, 0x8b} {
		// Blobs are read in place, so a compressed archive is unpacked
		// into a private temp file first (bounded like any input).
		tmp, err := m.gunzipToTemp(ctx, f)
		if err != nil {
			return nil, err
		}
		f.Close()
		f = tmp
		closeAll = func() { tmp.Close() }
		if fi, err = tmp.Stat(); err != nil {
			return nil, fmt.Errorf("template: archive: %w", err)
		}
	}
	idx, err := indexTar(ctx, f, fi.Size())
	if err != nil {
		return nil, err
	}
	if _, ok := idx.files["index.json"]; ok {
		if _, ok := idx.files["oci-layout"]; ok {
			img, err = idx.ociLayout(p)
		}
	}
	if img == nil && err == nil {
		if _, ok := idx.files["manifest.json"]; ok {
			img, err = idx.dockerArchive(p)
		} else {
			err = fmt.Errorf("%w: %s is neither an OCI layout (oci-layout, index.json) nor a docker-archive (manifest.json)", ErrInvalid, filepath.Base(p))
		}
	}
	if err != nil {
		return nil, err
	}
	img.close = closeAll
	return img, nil
}

func (m *Manager) gunzipToTemp(ctx context.Context, f *os.File) (*os.File, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("template: archive: %w", err)
	}
	gz, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%w: archive gzip: %w", ErrUnsafeInput, err)
	}
	defer gz.Close()
	tmp, err := os.CreateTemp(m.tmpDir(), "archive-")
	if err != nil {
		return nil, fmt.Errorf("template: archive: %w", err)
	}
	os.Remove(tmp.Name()) // unlinked: gone with the last close, even after a crash
	limit := m.opts.MaxBytes + m.opts.MaxBytes/8 + 1<<20
	n, err := io.Copy(tmp, io.LimitReader(&ctxReader{ctx: ctx, r: gz}, limit+1))
	if err == nil && n > limit {
		err = fmt.Errorf("%w: archive unpacks to more than %d bytes", ErrLimit, limit)
	}
	if err != nil {
		tmp.Close()
		if errors.Is(err, ErrLimit) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: archive gzip: %w", ErrUnsafeInput, err)
	}
	return tmp, nil
}

func indexTar(ctx context.Context, f *os.File, size int64) (*tarIndex, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("template: archive: %w", err)
	}
	idx := &tarIndex{f: f, files: map[string][2]int64{}, links: map[string]string{}}
	tr := tar.NewReader(f) // unbuffered: the file offset after Next is the data offset
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: archive tar: %w", ErrUnsafeInput, err)
		}
		if n >= maxArchiveEntries {
			return nil, fmt.Errorf("%w: archive has more than %d entries", ErrLimit, maxArchiveEntries)
		}
		name, err := cleanEntryName(hdr.Name)
		if err != nil {
			return nil, err
		}
		switch hdr.Typeflag {
		case tar.TypeReg:
			off, err := f.Seek(0, io.SeekCurrent)
			if err != nil {
				return nil, fmt.Errorf("template: archive: %w", err)
			}
			if hdr.Size < 0 || off+hdr.Size > size {
				return nil, fmt.Errorf("%w: archive entry %q runs past the end", ErrUnsafeInput, hdr.Name)
			}
			idx.files[name] = [2]int64{off, hdr.Size}
		case tar.TypeSymlink, tar.TypeLink:
			t := hdr.Linkname
			if hdr.Typeflag == tar.TypeSymlink && !strings.HasPrefix(t, "/") {
				t = path.Join(path.Dir(name), t)
			}
			target, err := cleanEntryName(t)
			if err != nil {
				return nil, err
			}
			idx.links[name] = target
		}
	}
	return idx, nil
}

// open returns the byte range of name, following up to 8 links.
func (idx *tarIndex) open(name string) (*io.SectionReader, error) {
	for i := 0; i < 8; i++ {
		if r, ok := idx.files[name]; ok {
			return io.NewSectionReader(idx.f, r[0], r[1]), nil
		}
		t, ok := idx.links[name]
		if !ok {
			break
		}
		name = t
	}
	return nil, fmt.Errorf("%w: archive has no file %q", ErrInvalid, name)
}

func (idx *tarIndex) readFile(name string, limit int64) ([]byte, error) {
	sr, err := idx.open(name)
	if err != nil {
		return nil, err
	}
	if sr.Size() > limit {
		return nil, fmt.Errorf("%w: archive file %q is %d bytes (at most %d)", ErrLimit, name, sr.Size(), limit)
	}
	return io.ReadAll(sr)
}

func blobPath(d v1.Hash) (string, error) {
	if d.Algorithm != "sha256" || len(d.Hex) != 64 {
		return "", fmt.Errorf("%w: digest %q", ErrUnsafeInput, d.String())
	}
	if _, err := hex.DecodeString(d.Hex); err != nil {
		return "", fmt.Errorf("%w: digest %q", ErrUnsafeInput, d.String())
	}
	return "blobs/sha256/" + d.Hex, nil
}

// readBlob reads a small blob whole and checks its digest and size.
func (idx *tarIndex) readBlob(d v1.Descriptor, limit int64) ([]byte, error) {
	if d.Size < 0 || d.Size > limit {
		return nil, fmt.Errorf("%w: blob %s of %d bytes (at most %d)", ErrLimit, d.Digest, d.Size, limit)
	}
	p, err := blobPath(d.Digest)
	if err != nil {
		return nil, err
	}
	b, err := idx.readFile(p, limit)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	if int64(len(b)) != d.Size || hex.EncodeToString(sum[:]) != d.Digest.Hex {
		return nil, fmt.Errorf("%w: blob %s does not match its digest or size", ErrUnsafeInput, d.Digest)
	}
	return b, nil
}

func isImageManifest(mt types.MediaType) bool {
	return mt == types.OCIManifestSchema1 || mt == types.DockerManifestSchema2
}

func isIndex(mt types.MediaType) bool {
	return mt == types.OCIImageIndex || mt == types.DockerManifestList
}

func platformOK(p *v1.Platform) bool {
	return p == nil || (p.OS == "linux" || p.OS == "") && (p.Architecture == runtime.GOARCH || p.Architecture == "")
}

// pickManifest finds the one linux image manifest for this architecture
// under an index, descending into nested indexes.
func (idx *tarIndex) pickManifest(ix *v1.IndexManifest, depth int, budget *int) ([]v1.Descriptor, error) {
	if depth > maxIndexDepth {
		return nil, fmt.Errorf("%w: indexes nested deeper than %d", ErrUnsafeInput, maxIndexDepth)
	}
	var out []v1.Descriptor
	for _, d := range ix.Manifests {
		if *budget--; *budget < 0 {
			return nil, fmt.Errorf("%w: indexes list more than %d entries", ErrLimit, maxIndexEntries)
		}
		switch {
		case isImageManifest(d.MediaType) && platformOK(d.Platform):
			out = append(out, d)
		case isIndex(d.MediaType):
			b, err := idx.readBlob(d, maxArchiveMetaSize)
			if err != nil {
				return nil, err
			}
			sub, err := v1.ParseIndexManifest(bytes.NewReader(b))
			if err != nil {
				return nil, fmt.Errorf("%w: index %s: %w", ErrUnsafeInput, d.Digest, err)
			}
			more, err := idx.pickManifest(sub, depth+1, budget)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		}
	}
	return out, nil
}

func (idx *tarIndex) ociLayout(p string) (*ociImage, error) {
	b, err := idx.readFile("index.json", maxArchiveMetaSize)
	if err != nil {
		return nil, err
	}
	ix, err := v1.ParseIndexManifest(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%w: index.json: %w", ErrUnsafeInput, err)
	}
	budget := maxIndexEntries
	cands, err := idx.pickManifest(ix, 0, &budget)
	if err != nil {
		return nil, err
	}
	// The same manifest may be listed under several tags.
	uniq := map[v1.Hash]v1.Descriptor{}
	for _, c := range cands {
		uniq[c.Digest] = c
	}
	if len(uniq) != 1 {
		return nil, fmt.Errorf("%w: OCI layout %s holds %d linux/%s images, want exactly one", ErrInvalid, filepath.Base(p), len(uniq), runtime.GOARCH)
	}
	md := cands[0]
	mb, err := idx.readBlob(md, maxArchiveMetaSize)
	if err != nil {
		return nil, err
	}
	mf, err := v1.ParseManifest(bytes.NewReader(mb))
	if err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrUnsafeInput, err)
	}
	if len(mf.Layers) > maxLayers {
		return nil, fmt.Errorf("%w: image has %d layers (at most %d)", ErrLimit, len(mf.Layers), maxLayers)
	}
	cb, err := idx.readBlob(mf.Config, maxConfigBytes)
	if err != nil {
		return nil, err
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(cb))
	if err != nil {
		return nil, fmt.Errorf("%w: image config: %w", ErrUnsafeInput, err)
	}
	img := &ociImage{ref: filepath.Base(p), manifestDigest: md.Digest.String(), configDigest: mf.Config.Digest.String(), config: cfg}
	for _, l := range mf.Layers {
		bp, err := blobPath(l.Digest)
		if err != nil {
			return nil, err
		}
		img.layers = append(img.layers, ociLayer{digest: l.Digest.String(), size: l.Size,
			open: func(context.Context) (io.ReadCloser, error) {
				sr, err := idx.open(bp)
				if err != nil {
					return nil, err
				}
				vr, err := newVerifyReader(sr, l.Digest.String(), l.Size)
				if err != nil {
					return nil, err
				}
				return io.NopCloser(vr), nil
			}})
	}
	return img, nil
}

// dockerManifest is one entry of a docker-archive's manifest.json.
type dockerManifest struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

func (idx *tarIndex) dockerArchive(p string) (*ociImage, error) {
	b, err := idx.readFile("manifest.json", maxArchiveMetaSize)
	if err != nil {
		return nil, err
	}
	var ms []dockerManifest
	if err := json.Unmarshal(b, &ms); err != nil {
		return nil, fmt.Errorf("%w: manifest.json: %w", ErrUnsafeInput, err)
	}
	if len(ms) != 1 {
		return nil, fmt.Errorf("%w: docker-archive %s holds %d images, want exactly one", ErrInvalid, filepath.Base(p), len(ms))
	}
	dm := ms[0]
	if len(dm.Layers) > maxLayers {
		return nil, fmt.Errorf("%w: image has %d layers (at most %d)", ErrLimit, len(dm.Layers), maxLayers)
	}
	cname, err := cleanEntryName(dm.Config)
	if err != nil {
		return nil, err
	}
	cb, err := idx.readFile(cname, maxConfigBytes)
	if err != nil {
		return nil, err
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(cb))
	if err != nil {
		return nil, fmt.Errorf("%w: image config: %w", ErrUnsafeInput, err)
	}
	sum := sha256.Sum256(cb)
	img := &ociImage{ref: filepath.Base(p), configDigest: "sha256:" + hex.EncodeToString(sum[:]), config: cfg}
	for _, l := range dm.Layers {
		lname, err := cleanEntryName(l)
		if err != nil {
			return nil, err
		}
		sr, err := idx.open(lname)
		if err != nil {
			return nil, err
		}
		// No blob digest here: the content is checked against diff_ids.
		img.layers = append(img.layers, ociLayer{digest: lname, size: sr.Size(),
			open: func(context.Context) (io.ReadCloser, error) {
				s, err := idx.open(lname)
				if err != nil {
					return nil, err
				}
				return io.NopCloser(s), nil
			}})
	}
	return img, nil
}
