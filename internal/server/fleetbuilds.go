package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/template"
)

// remoteTemplates is the template back end of a replica with remote
// nodes: reads come from the node registry (a template exists where a
// ready node has it, and lists those nodes), builds run on one node
// (cluster.Remote.BuildNode) whose layers the other nodes then copy
// (nodebuild.go), and build logs are read from the node that ran the
// build.
type remoteTemplates struct {
	r    *cluster.Remote
	logf func(string, ...any)
}

var _ api.TemplateAdmin = (*remoteTemplates)(nil)

// contextFile is the build context as a replica spools it for the node.
const contextFile = "context.tar"

// templates aggregates the ready nodes' templates: one entry per ref,
// described by its newest layer when it was built over the API, with the
// nodes that have that build (a node still holding an older build of the
// name is not listed).
func (t *remoteTemplates) templates(ctx context.Context) (map[string]*core.TemplateInfo, int, error) {
	nodes, err := t.r.ReadyNodes(ctx)
	if err != nil {
		return nil, 0, err
	}
	newest := map[string]core.TemplateLayer{}
	for _, n := range nodes {
		for _, l := range n.TemplateLayers {
			if cur, ok := newest[l.Ref]; !ok || l.CreatedAt.After(cur.CreatedAt) {
				newest[l.Ref] = l
			}
		}
	}
	out := map[string]*core.TemplateInfo{}
	for _, n := range nodes {
		layers := map[string]string{}
		for _, l := range n.TemplateLayers {
			layers[l.Ref] = l.Manifest
		}
		for _, ref := range n.Templates {
			l, built := newest[ref]
			if built && (l.Deleted || layers[ref] != l.Manifest) {
				continue // an older build, or one not copied here yet
			}
			ti := out[ref]
			if ti == nil {
				project, name := core.SplitTemplateRef(ref)
				ti = &core.TemplateInfo{Name: name, Public: project == "", Project: project, Source: "node " + n.Name}
				if built {
					ti.Digest, ti.Source, ti.SizeBytes, ti.Files, ti.CreatedAt = l.Digest, l.Source, l.SizeBytes, l.Files, l.CreatedAt
					ti.Env, ti.Cwd, ti.User, ti.Cmd, ti.Ready = l.Env, l.Cwd, l.User, l.Cmd, l.Ready
				}
				out[ref] = ti
			}
			ti.Nodes = append(ti.Nodes, n.Name)
		}
	}
	for _, ti := range out {
		sort.Strings(ti.Nodes)
	}
	return out, len(nodes), nil
}

// ListTemplates implements core.Templates.
func (t *remoteTemplates) ListTemplates(ctx context.Context) ([]core.TemplateInfo, error) {
	all, _, err := t.templates(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]core.TemplateInfo, 0, len(all))
	for _, ti := range all {
		out = append(out, *ti)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Project < out[j].Project
	})
	return out, nil
}

// GetTemplate implements core.Templates.
func (t *remoteTemplates) GetTemplate(ctx context.Context, ref string) (core.TemplateInfo, error) {
	all, ready, err := t.templates(ctx)
	if err != nil {
		return core.TemplateInfo{}, err
	}
	if ti := all[ref]; ti != nil {
		return *ti, nil
	}
	if ready == 0 {
		return core.TemplateInfo{}, fmt.Errorf("no ready node: %w", core.ErrUnavailable)
	}
	return core.TemplateInfo{}, fmt.Errorf("template %q is on none of the %d ready nodes: %w", displayName(ref), ready, core.ErrNotFound)
}

// BuildTemplate implements core.Templates: the build runs on the node
// with the most free capacity.
func (t *remoteTemplates) BuildTemplate(ctx context.Context, req core.TemplateBuildRequest, progress core.Progress) (core.TemplateInfo, error) {
	c, err := t.r.BuildNode(ctx)
	if err != nil {
		return core.TemplateInfo{}, err
	}
	progress(0, "building on node "+c.Name)
	payload := ""
	if req.Source == "archive" {
		payload = req.Path
	}
	raw, err := c.BuildTemplate(ctx, cluster.TemplateBuildSpec{Kind: "source", Request: req}, payload, progress)
	if err != nil {
		return core.TemplateInfo{}, err
	}
	var ti core.TemplateInfo
	if err := json.Unmarshal(raw, &ti); err != nil {
		return core.TemplateInfo{}, fmt.Errorf("node %s: build result: %v: %w", c.Name, err, core.ErrUnavailable)
	}
	return ti, nil
}

// ValidateBuildfile implements api.TemplateAdmin. START (a pre-warmed
// template) needs a sandbox service on the node, which remote nodes do
// not run yet: refused at once.
func (t *remoteTemplates) ValidateBuildfile(b []byte) error {
	bf, err := template.ParseBuildfile(b)
	if err != nil {
		return mapTemplateErr(err)
	}
	for _, in := range bf.Steps {
		if in.Kind == template.InstrStart {
			return fmt.Errorf("START (a pre-warmed template) is not available with remote nodes yet: %w", core.ErrInvalid)
		}
	}
	return nil
}

// ExtractContext implements api.TemplateAdmin: the context is spooled as
// it came (the node that builds extracts it, with the same bounds).
func (t *remoteTemplates) ExtractContext(ctx context.Context, r io.Reader, dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, contextFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// BuildFromFile implements api.TemplateAdmin.
func (t *remoteTemplates) BuildFromFile(ctx context.Context, req api.BuildfileRequest, progress core.Progress) (any, error) {
	// On a node that has the FROM template (the project's, else the
	// public one): one built a moment ago may not have reached every node.
	var base []string
	if bf, err := template.ParseBuildfile(req.File); err == nil {
		base = []string{core.TemplateRef(req.ProjectID, bf.From), bf.From}
	}
	c, err := t.r.BuildNode(ctx, base...)
	if err != nil {
		return nil, err
	}
	progress(0, "building on node "+c.Name)
	payload := ""
	if req.ContextDir != "" {
		payload = filepath.Join(req.ContextDir, contextFile)
	}
	raw, err := c.BuildTemplate(ctx, cluster.TemplateBuildSpec{Kind: "buildfile", Name: req.Name, File: req.File,
		ProjectID: req.ProjectID, OpID: req.OpID}, payload, progress)
	if err != nil {
		return nil, err
	}
	return raw, nil
}

// BuildLog implements api.TemplateAdmin: the log is read from the node
// that ran the build (a private, unlinked temp file holds a step's log).
func (t *remoteTemplates) BuildLog(ctx context.Context, opID string, step int) (*os.File, []api.StepLog, error) {
	rc, err := t.r.TemplateBuildLog(ctx, opID, step)
	if errors.Is(err, core.ErrNotFound) && step == 0 {
		return nil, []api.StepLog{}, nil // no node has a log: no RUN step ran
	}
	if err != nil {
		return nil, nil, err
	}
	defer rc.Close()
	if step == 0 {
		list := []api.StepLog{}
		if err := json.NewDecoder(io.LimitReader(rc, 1<<20)).Decode(&list); err != nil {
			return nil, nil, fmt.Errorf("build %s: step list: %v: %w", opID, err, core.ErrUnavailable)
		}
		return nil, list, nil
	}
	f, err := os.CreateTemp("", "space-build-log-")
	if err != nil {
		return nil, nil, err
	}
	os.Remove(f.Name())
	if _, err := io.Copy(f, io.LimitReader(rc, 8<<20)); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("build %s: step %d log: %v: %w", opID, step, err, core.ErrUnavailable)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, nil, nil
}

// DeleteTemplate implements api.TemplateAdmin: the first node that has
// the template and answers checks and deletes it as a single host would
// (builtins and templates in use are refused), then every other ready
// node; each leaves a tombstone, so a node that was away drops its copy
// when it is back.
func (t *remoteTemplates) DeleteTemplate(ctx context.Context, ref string) error {
	ti, err := t.GetTemplate(ctx, ref)
	if err != nil {
		return err
	}
	req := cluster.TemplateAdminReq{Op: cluster.TemplateDelete, Ref: ref, At: time.Now().UTC()}
	_, _, err = t.first(ctx, ti.Nodes, req)
	return err
}

// AliasTemplate implements api.TemplateAdmin: every ready node that has
// the template makes the alias; the others copy it like a build.
func (t *remoteTemplates) AliasTemplate(ctx context.Context, ref, alias string) (core.TemplateInfo, error) {
	ti, err := t.GetTemplate(ctx, ref)
	if err != nil {
		return core.TemplateInfo{}, err
	}
	req := cluster.TemplateAdminReq{Op: cluster.TemplateAlias, Ref: ref, Alias: alias, At: time.Now().UTC()}
	raw, done, err := t.first(ctx, ti.Nodes, req)
	if err != nil {
		return core.TemplateInfo{}, err
	}
	var out core.TemplateInfo
	if err := json.Unmarshal(raw, &out); err != nil {
		return core.TemplateInfo{}, fmt.Errorf("alias result: %v: %w", err, core.ErrUnavailable)
	}
	out.Nodes = done
	return out, nil
}

// GCTemplates implements api.TemplateAdmin: every ready node collects
// its own unreferenced layers; the result lists what each removed.
func (t *remoteTemplates) GCTemplates(ctx context.Context) (api.TemplateGCResult, error) {
	nodes, err := t.r.ReadyNodes(ctx)
	if err != nil {
		return api.TemplateGCResult{}, err
	}
	if len(nodes) == 0 {
		return api.TemplateGCResult{}, fmt.Errorf("no ready node: %w", core.ErrUnavailable)
	}
	res := api.TemplateGCResult{Removed: []string{}}
	var errs []error
	for _, n := range nodes {
		c, err := t.r.NodeClient(ctx, n.Name)
		if err == nil {
			var raw json.RawMessage
			if raw, err = c.TemplateAdmin(ctx, cluster.TemplateAdminReq{Op: cluster.TemplateGC, At: time.Now().UTC()}); err == nil {
				var one api.TemplateGCResult
				if err = json.Unmarshal(raw, &one); err == nil {
					res.Removed = append(res.Removed, one.Removed...)
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
		}
	}
	sort.Strings(res.Removed)
	res.Removed = slices.Compact(res.Removed)
	return res, errors.Join(errs...)
}

// first sends req to the nodes named in turn until one does it (one that
// cannot be reached is passed by; any other refusal, such as a template in
// use, is the answer), then to the rest, whose failures are only logged:
// their peers' heartbeats carry the change to them. It returns the first
// answer and the nodes that did it.
func (t *remoteTemplates) first(ctx context.Context, names []string, req cluster.TemplateAdminReq) (json.RawMessage, []string, error) {
	var (
		answer json.RawMessage
		done   []string
		err    error = fmt.Errorf("no ready node: %w", core.ErrUnavailable)
	)
	for _, name := range names {
		c, cerr := t.r.NodeClient(ctx, name)
		if cerr == nil {
			var raw json.RawMessage
			if raw, cerr = c.TemplateAdmin(ctx, req); cerr == nil {
				if answer == nil {
					answer = raw
				}
				done = append(done, name)
				continue
			}
		}
		if answer == nil && !errors.Is(cerr, core.ErrUnavailable) && !errors.Is(cerr, core.ErrNotFound) {
			return nil, nil, cerr
		}
		err = cerr
		t.logf("template %s on node %s: %v (its peers' heartbeats carry it there)", req.Op, name, cerr)
	}
	if answer == nil {
		return nil, nil, err
	}
	return answer, done, nil
}
