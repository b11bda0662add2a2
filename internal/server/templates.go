package server

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/template"
)

// Templates adapts the template manager to core.Templates and remembers
// which builtin templates are still being built at start-up.
type Templates struct {
	m    *template.Manager
	logf func(string, ...any)

	mu       sync.Mutex
	building map[string]bool
	failed   map[string]string // builtin name -> why its build failed
}

func info(t template.Template) core.TemplateInfo {
	return core.TemplateInfo{Name: t.Name, Digest: t.Digest, Source: t.Source, SizeBytes: t.SizeBytes,
		Files: t.Files, Env: t.Defaults.Env, Cwd: t.Defaults.Cwd, User: t.Defaults.User, Cmd: t.Defaults.Cmd, CreatedAt: t.CreatedAt}
}

// ListTemplates implements core.Templates.
func (t *Templates) ListTemplates(ctx context.Context) ([]core.TemplateInfo, error) {
	list, err := t.m.List()
	if err != nil {
		return nil, err
	}
	out := make([]core.TemplateInfo, len(list))
	for i, tp := range list {
		out[i] = info(tp)
	}
	return out, nil
}

// GetTemplate implements core.Templates.
func (t *Templates) GetTemplate(ctx context.Context, name string) (core.TemplateInfo, error) {
	tp, err := t.m.Get(name)
	if errors.Is(err, template.ErrNotFound) {
		if t.isBuilding(name) {
			return core.TemplateInfo{}, fmt.Errorf("template %q is still being built: %w", name, core.ErrUnavailable)
		}
		t.mu.Lock()
		why := t.failed[name]
		t.mu.Unlock()
		if why != "" {
			return core.TemplateInfo{}, fmt.Errorf("template %q: its build failed at start (%s): %w", name, why, core.ErrNotFound)
		}
		return core.TemplateInfo{}, fmt.Errorf("template %q: %w", name, core.ErrNotFound)
	}
	if err != nil {
		return core.TemplateInfo{}, err
	}
	return info(tp), nil
}

// BuildTemplate implements core.Templates.
func (t *Templates) BuildTemplate(ctx context.Context, req core.TemplateBuildRequest, progress core.Progress) (core.TemplateInfo, error) {
	tp, err := t.m.Build(ctx, template.BuildRequest{
		Name: req.Name, Source: req.Source, Path: req.Path, Packages: req.Packages, Image: req.Image,
		Defaults: template.Defaults{Env: req.Env, Cwd: req.Cwd, User: req.User},
	}, stageProgress(progress))
	if err != nil {
		return core.TemplateInfo{}, err
	}
	return info(tp), nil
}

// stageProgress turns build progress into an operation's percentage.
func stageProgress(progress core.Progress) template.Progress {
	// An image build's stages get percentage bands, so its progress only
	// moves forward: resolve, pull (by bytes), shift, commit.
	imageStages := map[string][2]int{"resolve": {0, 5}, "pull": {5, 85}, "extract": {85, 86}, "shift": {86, 95}, "commit": {95, 100}}
	image := false
	return func(stage string, done, total int64, msg string) {
		pct := 50
		if total > 0 {
			pct = int(5 + 90*done/total)
		}
		if stage == "resolve" {
			image = true
		}
		if b, ok := imageStages[stage]; ok && image {
			pct = b[0]
			if total > 0 && done <= total {
				pct = b[0] + int(int64(b[1]-b[0])*done/total)
			}
		}
		if msg == "" {
			msg = stage
		}
		progress(pct, msg)
	}
}

func (t *Templates) isBuilding(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.building[name]
}

// ensure builds missing builtin templates, one after another, then fills
// the warm pool (which needs them).
func (t *Templates) ensure(ctx context.Context, names []string, n *node.Node) {
	t.mu.Lock()
	for _, name := range names {
		if _, err := t.m.Get(name); err != nil {
			t.building[name] = true
		}
	}
	t.mu.Unlock()
	for _, name := range names {
		last := -1
		_, err := t.m.EnsureBuiltin(ctx, name, func(stage string, done, total int64, msg string) {
			pct := -1
			if total > 0 {
				pct = int(100 * done / total)
			}
			if pct/10 != last/10 || pct < 0 && msg != "" {
				t.logf("template %s: %s %s", name, stage, msg)
				last = pct
			}
		})
		t.mu.Lock()
		delete(t.building, name)
		if err != nil {
			t.failed[name] = err.Error()
		}
		t.mu.Unlock()
		if err != nil {
			t.logf("template %s: build failed: %v", name, err)
			continue
		}
		t.logf("template %s: ready", name)
	}
	n.StartPool()
}

// runtime is the node as core.Runtime, with HasTemplate aware of builds in
// progress.
type runtime struct {
	*node.Node
	t *Templates
}

func (r *runtime) HasTemplate(ctx context.Context, name string) error {
	_, err := r.t.GetTemplate(ctx, name)
	return err
}
