package template

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/zstd"
)

// Image sources.
const (
	// SourceImage pulls BuildRequest.Image from an OCI/Docker registry.
	SourceImage = "image"
	// SourceArchive reads a docker-archive ("docker save") or OCI-layout
	// tarball at BuildRequest.Path.
	SourceArchive = "archive"
)

// recipeSourceOCI is the recipe source of both image sources: the same
// image (same config digest) pulled or loaded from a file is the same tree.
const recipeSourceOCI = "oci"

const (
	maxLayers      = 256
	maxConfigBytes = 4 << 20
	maxCmdArgs     = 256
	maxEnvVars     = 1024
	maxTrailing    = 1 << 20 // bytes after a layer's tar end that we still read (padding)
)

// ociImage is an image resolved far enough to name it: its config is read
// and verified; its layers are only opened by the build.
type ociImage struct {
	ref            string // what the user asked for, for messages
	manifestDigest string // "sha256:…"; "" for a docker-archive
	configDigest   string // "sha256:…" of the config bytes
	config         *v1.ConfigFile
	layers         []ociLayer
	close          func()
}

// ociLayer is one layer blob. open returns the blob as stored (gzip, zstd
// or plain tar); when the source knows the blob digest the reader verifies
// it. Content is verified independently against the config's diff_ids.
type ociLayer struct {
	digest string // blob digest when known
	size   int64  // blob size; -1 if unknown
	open   func(ctx context.Context) (io.ReadCloser, error)
}

// planImage resolves an image source into r and pl.
func (m *Manager) planImage(ctx context.Context, req BuildRequest, r *recipe, pl *plan, p Progress) error {
	var img *ociImage
	var err error
	switch req.Source {
	case SourceImage:
		p("resolve", 0, 1, req.Image)
		img, err = m.remoteImage(ctx, req.Image)
	case SourceArchive:
		p("resolve", 0, 1, filepath.Base(req.Path))
		img, err = m.archiveImage(ctx, req.Path)
	}
	if err != nil {
		return err
	}
	pl.close = img.close
	if err := m.checkImage(img); err != nil {
		img.close()
		return err
	}
	d, err := imageDefaults(img.config)
	if err != nil {
		img.close()
		return err
	}
	p("resolve", 1, 1, fmt.Sprintf("%s: config %s, %d layers", img.ref, img.configDigest, len(img.layers)))
	r.Source = recipeSourceOCI
	r.ImageConfig = img.configDigest
	pl.defaults = &d
	pl.build = func(ctx context.Context, root string, p Progress) error {
		return m.applyImage(ctx, img, root, p)
	}
	return nil
}

// checkImage validates what the image claims before any layer is read.
func (m *Manager) checkImage(img *ociImage) error {
	cfg := img.config
	if cfg.OS != "" && cfg.OS != "linux" {
		return fmt.Errorf("%w: image %s is for %q, not linux", ErrUnsupported, img.ref, cfg.OS)
	}
	if cfg.Architecture != "" && cfg.Architecture != runtime.GOARCH {
		return fmt.Errorf("%w: image %s is for %s, this node is %s", ErrUnsupported, img.ref, cfg.Architecture, runtime.GOARCH)
	}
	if len(img.layers) > maxLayers {
		return fmt.Errorf("%w: image has %d layers (at most %d)", ErrLimit, len(img.layers), maxLayers)
	}
	if len(cfg.RootFS.DiffIDs) != len(img.layers) {
		return fmt.Errorf("%w: image has %d layers but its config lists %d diff_ids", ErrUnsafeInput, len(img.layers), len(cfg.RootFS.DiffIDs))
	}
	for _, d := range cfg.RootFS.DiffIDs {
		if d.Algorithm != "sha256" || len(d.Hex) != 64 {
			return fmt.Errorf("%w: diff_id %q", ErrUnsafeInput, d.String())
		}
	}
	var total int64
	for _, l := range img.layers {
		if l.size < -1 || l.size > m.opts.MaxBytes-total {
			return fmt.Errorf("%w: layers exceed %d bytes", ErrLimit, m.opts.MaxBytes)
		}
		if l.size > 0 {
			total += l.size
		}
	}
	return nil
}

// imageDefaults takes env, working dir, user and entrypoint+cmd from the
// image config, refusing values the sandbox could not honour safely.
func imageDefaults(cfg *v1.ConfigFile) (Defaults, error) {
	c := cfg.Config
	var d Defaults
	if len(c.Env) > maxEnvVars {
		return d, fmt.Errorf("%w: image has %d env vars (at most %d)", ErrLimit, len(c.Env), maxEnvVars)
	}
	for _, kv := range c.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(kv, 0) {
			return d, fmt.Errorf("%w: image env entry %q", ErrUnsafeInput, kv)
		}
		if d.Env == nil {
			d.Env = map[string]string{}
		}
		d.Env[k] = v
	}
	if wd := c.WorkingDir; wd != "" {
		if strings.ContainsRune(wd, 0) || len(wd) > maxNameLen {
			return d, fmt.Errorf("%w: image working dir %q", ErrUnsafeInput, wd)
		}
		d.Cwd = path.Clean("/" + wd) // Docker treats a relative WORKDIR as relative to /
	}
	if u := c.User; u != "" {
		// "user:group": the agent takes a user name or uid and that user's
		// primary group, so only the user part is kept.
		u, _, _ = strings.Cut(u, ":")
		if u == "" || strings.ContainsAny(u, "\x00\n") || len(u) > 256 {
			return d, fmt.Errorf("%w: image user %q", ErrUnsafeInput, c.User)
		}
		d.User = u
	}
	cmd := append(append([]string{}, c.Entrypoint...), c.Cmd...)
	if len(cmd) > maxCmdArgs {
		return d, fmt.Errorf("%w: image command has %d arguments (at most %d)", ErrLimit, len(cmd), maxCmdArgs)
	}
	for _, a := range cmd {
		if strings.ContainsRune(a, 0) || len(a) > 64<<10 {
			return d, fmt.Errorf("%w: image command argument %.64q", ErrUnsafeInput, a)
		}
	}
	if len(cmd) > 0 {
		d.Cmd = cmd
	}
	return d, d.validate()
}

// mergeDefaults lays the request's explicit defaults over the image's.
func mergeDefaults(img, req Defaults) Defaults {
	out := Defaults{Cwd: img.Cwd, User: img.User, Cmd: img.Cmd}
	if len(img.Env)+len(req.Env) > 0 {
		out.Env = map[string]string{}
		for k, v := range img.Env {
			out.Env[k] = v
		}
		for k, v := range req.Env {
			out.Env[k] = v
		}
	}
	if req.Cwd != "" {
		out.Cwd = req.Cwd
	}
	if req.User != "" {
		out.User = req.User
	}
	if len(req.Cmd) > 0 {
		out.Cmd = req.Cmd
	}
	return out
}

// applyImage extracts every layer, lowest first, into root, verifying each
// uncompressed stream against the config's diff_id.
func (m *Manager) applyImage(ctx context.Context, img *ociImage, root string, p Progress) error {
	dst, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("template: open staging: %w", err)
	}
	defer dst.Close()
	var total int64
	for _, l := range img.layers {
		if l.size > 0 {
			total += l.size
		}
	}
	a := newLayerApplier(dst, m.limits())
	var done int64
	n := len(img.layers)
	for i, l := range img.layers {
		msg := fmt.Sprintf("layer %d/%d %s", i+1, n, shortDigest(l.digest))
		p("pull", done, total, msg)
		rc, err := l.open(ctx)
		if err != nil {
			return fmt.Errorf("template: layer %d/%d: %w", i+1, n, err)
		}
		cr := &progressReader{r: &ctxReader{ctx: ctx, r: rc}, n: done, every: 1 << 20,
			fn: func(got int64) { p("pull", got, total, fmt.Sprintf("%s (%s of %s)", msg, mib(got), mib(total))) }}
		err = m.applyLayer(ctx, a, cr, img.config.RootFS.DiffIDs[i].Hex, i)
		rc.Close()
		if err != nil {
			return fmt.Errorf("template: layer %d/%d (%s): %w", i+1, n, shortDigest(l.digest), err)
		}
		done = cr.n
		p("pull", done, total, msg+" done")
	}
	if err := a.finish(); err != nil {
		return err
	}
	msg := fmt.Sprintf("%d layers, %d entries, %d bytes", n, a.entries, a.bytes)
	if a.x.skipped > 0 {
		msg += fmt.Sprintf(", skipped %d device nodes/fifos", a.x.skipped)
		m.opts.Logf("template: image %s: skipped %d device nodes/fifos", img.ref, a.x.skipped)
	}
	p("extract", int64(n), int64(n), msg)
	return nil
}

func (m *Manager) applyLayer(ctx context.Context, a *layerApplier, raw io.Reader, wantHex string, idx int) error {
	un, closeFn, err := decompress(raw)
	if err != nil {
		return err
	}
	defer closeFn()
	h := sha256.New()
	tee := io.TeeReader(un, h)
	if err := a.apply(ctx, tee, nil); err != nil {
		return err
	}
	// Tar padding after the end marker is part of the diff_id.
	if n, err := io.Copy(io.Discard, io.LimitReader(tee, maxTrailing+1)); err != nil {
		return fmt.Errorf("%w: layer: %w", ErrUnsafeInput, err)
	} else if n > maxTrailing {
		return fmt.Errorf("%w: more than %d bytes after the end of the layer tar", ErrUnsafeInput, maxTrailing)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != wantHex {
		return fmt.Errorf("%w: uncompressed content is sha256:%s, config says sha256:%s", ErrUnsafeInput, got, wantHex)
	}
	// Read the compressed stream to its end so a blob digest check (which
	// happens at EOF) runs.
	if _, err := io.Copy(io.Discard, raw); err != nil {
		return fmt.Errorf("%w: layer blob: %w", ErrUnsafeInput, err)
	}
	return nil
}

// decompress detects gzip, zstd or a plain tar by magic bytes.
func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: gzip: %w", ErrUnsafeInput, err)
		}
		return gz, func() { gz.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(256<<20))
		if err != nil {
			return nil, nil, fmt.Errorf("%w: zstd: %w", ErrUnsafeInput, err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func shortDigest(d string) string {
	if _, h, ok := strings.Cut(d, ":"); ok && len(h) > 12 {
		return d[:len(d)-len(h)] + h[:12]
	}
	return d
}

// progressReader counts bytes and reports every `every` bytes.
type progressReader struct {
	r     io.Reader
	n     int64
	last  int64
	every int64
	fn    func(n int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if p.n-p.last >= p.every {
		p.last = p.n
		p.fn(p.n)
	}
	return n, err
}

// verifyReader fails at EOF when the bytes read are not the wanted digest
// or size: a blob is only trusted after all of it was read.
type verifyReader struct {
	r    io.Reader
	h    hash.Hash
	want string // hex
	size int64
	n    int64
}

func newVerifyReader(r io.Reader, digest string, size int64) (*verifyReader, error) {
	alg, hx, ok := strings.Cut(digest, ":")
	if !ok || alg != "sha256" || len(hx) != 64 {
		return nil, fmt.Errorf("%w: unsupported digest %q", ErrUnsafeInput, digest)
	}
	return &verifyReader{r: io.LimitReader(r, size+1), h: sha256.New(), want: hx, size: size}, nil
}

func (v *verifyReader) Read(b []byte) (int, error) {
	n, err := v.r.Read(b)
	v.h.Write(b[:n])
	v.n += int64(n)
	if v.n > v.size {
		return n, fmt.Errorf("%w: blob longer than its %d bytes", ErrUnsafeInput, v.size)
	}
	if errors.Is(err, io.EOF) {
		if v.n != v.size || hex.EncodeToString(v.h.Sum(nil)) != v.want {
			return n, fmt.Errorf("%w: blob does not match sha256:%s", ErrUnsafeInput, v.want)
		}
	}
	return n, err
}
