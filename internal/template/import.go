package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// ImportRequest names a tree another manager built and how its name
// should read here.
type ImportRequest struct {
	Name     string
	Digest   string // the builder's tree digest, kept so both nodes name the tree alike
	Source   string // the builder's source (busybox, buildfile, …)
	Defaults Defaults
	// CreatedAt is when the builder pointed the name at the tree: kept,
	// so that every node agrees on which build of a name is the newest.
	CreatedAt time.Time
}

// Import points req.Name at tree req.Digest, having fill write the tree
// into an empty staging directory first when this manager lacks it. The
// caller vouches for what fill writes (it checked it against the
// builder's hashes) and for its ownership (this manager's uid range).
// The tree becomes visible only through one rename, as a built one.
func (m *Manager) Import(ctx context.Context, req ImportRequest, fill func(ctx context.Context, dir string) error) (Template, error) {
	if err := validateName(req.Name); err != nil {
		return Template{}, err
	}
	if !digestRE.MatchString(req.Digest) {
		return Template{}, fmt.Errorf("%w: tree digest %.80q", ErrInvalid, req.Digest)
	}
	if err := req.Defaults.validate(); err != nil {
		return Template{}, err
	}
	hx := strings.TrimPrefix(req.Digest, "sha256:")
	m.pin(req.Digest) // GC leaves a tree being imported alone
	defer m.unpin(req.Digest)
	if _, err := os.Lstat(m.rootfsPath(hx)); errors.Is(err, os.ErrNotExist) {
		if err := m.importTree(ctx, hx, req, fill); err != nil {
			return Template{}, err
		}
	} else if err != nil {
		return Template{}, fmt.Errorf("template: stat rootfs: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := os.Lstat(m.rootfsPath(hx)); err != nil {
		return Template{}, fmt.Errorf("template: imported tree %s vanished: %w", req.Digest, err)
	}
	meta, err := m.loadMeta(&plan{digest: req.Digest, hex: hx, source: req.Source, recipe: json.RawMessage(`{"import":true}`)})
	if err != nil {
		return Template{}, err
	}
	r := nameRecord{Name: req.Name, Digest: req.Digest, Source: req.Source, Defaults: req.Defaults,
		SizeBytes: meta.SizeBytes, Files: meta.Files, CreatedAt: req.CreatedAt.UTC()}
	if err := writeJSONAtomic(m.namesDir(), req.Name+".json", r, !m.opts.NoSync); err != nil {
		return Template{}, err
	}
	return m.toTemplate(r), nil
}

func (m *Manager) importTree(ctx context.Context, hx string, req ImportRequest, fill func(ctx context.Context, dir string) error) (err error) {
	start := time.Now()
	root, cleanup, err := m.stageRoot("import-")
	if err != nil {
		return err
	}
	defer cleanup(&err)
	if err := fill(ctx, root); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !m.opts.NoSync {
		if err := syncFS(root); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := os.Rename(root, m.rootfsPath(hx)); err != nil && !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.ENOTEMPTY) {
		return fmt.Errorf("template: commit %s: %w", req.Digest, err)
	}
	if !m.opts.NoSync {
		syncDir(m.rootfsRoot())
	}
	m.opts.Logf("template: imported %s (%s) as %s in %s", req.Digest, req.Source, req.Name, time.Since(start).Round(time.Millisecond))
	return nil
}
