package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
)

// recipe is everything that determines a rootfs. Its JSON encoding (struct
// field order, sorted package list) is hashed into the template digest.
type recipe struct {
	Builder  int    `json:"builder"`
	Source   string `json:"source"`
	UIDBase  uint32 `json:"uid_base"`
	UIDCount uint32 `json:"uid_count"`

	BusyboxSHA256 string `json:"busybox_sha256,omitempty"`

	Suite        string   `json:"suite,omitempty"`
	Variant      string   `json:"variant,omitempty"`
	Packages     []string `json:"packages,omitempty"`
	Mirror       string   `json:"mirror,omitempty"`
	Mmdebstrap   string   `json:"mmdebstrap,omitempty"`
	NoRecommends bool     `json:"no_recommends,omitempty"`
	// FilesSHA256 hashes the files added on top of the packages.
	FilesSHA256 string `json:"files_sha256,omitempty"`

	TreeSHA256 string `json:"tree_sha256,omitempty"`
	TarSHA256  string `json:"tar_sha256,omitempty"`
	TarSize    int64  `json:"tar_size,omitempty"`

	// ImageConfig is the sha256 digest of an image's config, which names
	// its layers' uncompressed contents (diff_ids, verified on extraction)
	// and its defaults.
	ImageConfig string `json:"image_config,omitempty"`
}

// plan is a resolved build: its digest plus the function that produces the
// tree into an empty staging directory (ownership not yet shifted).
type plan struct {
	digest string // "sha256:<hex>"
	hex    string
	source string
	recipe json.RawMessage
	build  func(ctx context.Context, root string, p Progress) error
	close  func()
	// defaults, when set, come from the source (an image config) and lie
	// under the request's own.
	defaults *Defaults
}

var (
	suiteRE   = regexp.MustCompile(`^[a-z][a-z0-9.-]{0,31}$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{0,127}$`)
)

const (
	maxPackages     = 256
	maxBusyboxBytes = 64 << 20
)

func (m *Manager) plan(ctx context.Context, req BuildRequest, p Progress) (*plan, error) {
	r := recipe{Builder: builderVersion, Source: req.Source, UIDBase: m.opts.UIDBase, UIDCount: m.opts.UIDCount}
	pl := &plan{source: req.Source, close: func() {}}
	if req.Source != SourceDebian && (len(req.Packages) > 0 || req.Suite != "" || len(req.Files) > 0 || req.NoRecommends) {
		return nil, fmt.Errorf("%w: packages, suite and files only apply to source %q", ErrInvalid, SourceDebian)
	}
	if (req.Source == SourceDir || req.Source == SourceTar || req.Source == SourceArchive) != (req.Path != "") {
		return nil, fmt.Errorf("%w: path is required for sources %q, %q and %q and only for them", ErrInvalid, SourceDir, SourceTar, SourceArchive)
	}
	if (req.Source == SourceImage) != (req.Image != "") {
		return nil, fmt.Errorf("%w: image is required for source %q and only for it", ErrInvalid, SourceImage)
	}
	switch req.Source {
	case SourceBusybox:
		bin, err := readBounded(m.opts.BusyboxPath, maxBusyboxBytes)
		if err != nil {
			return nil, fmt.Errorf("template: busybox: %w", err)
		}
		sum := sha256.Sum256(bin)
		r.BusyboxSHA256 = hex.EncodeToString(sum[:])
		pl.build = func(ctx context.Context, root string, p Progress) error {
			return m.buildBusybox(ctx, root, bin, p)
		}
	case SourceDebian:
		r.Suite = req.Suite
		if r.Suite == "" {
			r.Suite = defaultSuite
		}
		if !suiteRE.MatchString(r.Suite) {
			return nil, fmt.Errorf("%w: suite %q", ErrInvalid, r.Suite)
		}
		if len(req.Packages) > maxPackages {
			return nil, fmt.Errorf("%w: more than %d packages", ErrInvalid, maxPackages)
		}
		for _, pkg := range req.Packages {
			if !packageRE.MatchString(pkg) {
				return nil, fmt.Errorf("%w: package name %q", ErrInvalid, pkg)
			}
		}
		r.Packages = slices.Compact(slices.Sorted(slices.Values(req.Packages)))
		r.Variant = "minbase"
		r.NoRecommends = req.NoRecommends
		r.Mirror = m.opts.Mirror
		v, err := m.mmdebstrapVersion(ctx)
		if err != nil {
			return nil, err
		}
		r.Mmdebstrap = v
		if r.FilesSHA256, err = filesDigest(req.Files); err != nil {
			return nil, err
		}
		rc, files := r, slices.Clone(req.Files)
		pl.build = func(ctx context.Context, root string, p Progress) error {
			if err := m.buildDebian(ctx, root, rc, p); err != nil {
				return err
			}
			return writeFiles(root, files)
		}
	case SourceDir:
		src, err := os.OpenRoot(req.Path)
		if err != nil {
			return nil, fmt.Errorf("template: open source dir: %w", err)
		}
		pl.close = func() { src.Close() }
		sum, err := m.copyTree(ctx, src, nil, p)
		if err != nil {
			src.Close()
			return nil, err
		}
		r.TreeSHA256 = sum
		pl.build = func(ctx context.Context, root string, p Progress) error {
			dst, err := os.OpenRoot(root)
			if err != nil {
				return fmt.Errorf("template: open staging: %w", err)
			}
			defer dst.Close()
			got, err := m.copyTree(ctx, src, dst, p)
			if err != nil {
				return err
			}
			if got != sum {
				return fmt.Errorf("%w: source directory changed during the build", ErrUnsafeInput)
			}
			return nil
		}
	case SourceTar:
		f, err := os.Open(req.Path)
		if err != nil {
			return nil, fmt.Errorf("template: open tarball: %w", err)
		}
		pl.close = func() { f.Close() }
		fi, err := f.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			f.Close()
			return nil, fmt.Errorf("%w: tarball %q is not a regular file", ErrInvalid, req.Path)
		}
		p("hash", 0, fi.Size(), req.Path)
		h := sha256.New()
		n, err := io.Copy(h, &ctxReader{ctx: ctx, r: f})
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("template: hash tarball: %w", err)
		}
		p("hash", n, n, req.Path)
		r.TarSHA256 = hex.EncodeToString(h.Sum(nil))
		r.TarSize = n
		pl.build = func(ctx context.Context, root string, p Progress) error {
			return m.buildTar(ctx, f, n, r.TarSHA256, root, p)
		}
	case SourceImage, SourceArchive:
		if err := m.planImage(ctx, req, &r, pl, p); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: source %q", ErrInvalid, req.Source)
	}
	b, err := json.Marshal(r)
	if err != nil {
		pl.close()
		return nil, fmt.Errorf("template: encode recipe: %w", err)
	}
	sum := sha256.Sum256(b)
	pl.hex = hex.EncodeToString(sum[:])
	pl.digest = "sha256:" + pl.hex
	pl.recipe = b
	return pl, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}

// ctxReader makes long reads (hashing gigabytes) cancellable.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}
