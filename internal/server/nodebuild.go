package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/template"
)

// nodeBuilds is a `space node`'s side of template builds over the API:
// it runs the builds replicas send it, stores each built tree as a
// snapshot manifest and chunks (in its snapshot store, and the shared one
// when it has one), advertises it in its heartbeat, serves its objects to
// peers, and copies the trees its peers advertise and it lacks, checking
// every object against its digest.
type nodeBuilds struct {
	p    *NodeProcess
	file string // <data-dir>/template-layers.json: what this node advertises
	// link and signer: how this node calls its peers for their objects.
	link   cluster.LinkOptions
	signer *cluster.Signer
	// retryAfter is the pause after a failed copy of a layer.
	retryAfter time.Duration

	mu      sync.Mutex
	layers  map[string]core.TemplateLayer // ref → layer
	chunks  map[string]map[string]bool    // manifest → its chunks (served to peers)
	clients map[string]*cluster.Client
	failed  map[string]time.Time // ref+manifest → when a copy may be tried again
	// stale: the refs a peer has a newer build of that this node has not
	// copied yet; its heartbeat leaves them out, so nothing is placed
	// here on the older tree.
	stale map[string]bool
}

// templateLayersFile is the list of layers a node advertises.
const templateLayersFile = "template-layers.json"

func newNodeBuilds(p *NodeProcess) (*nodeBuilds, error) {
	b := &nodeBuilds{p: p, file: filepath.Join(p.cfg.DataDir, templateLayersFile), link: nodeLinkClient(p.nc, p.cfg.Logf),
		signer: cluster.NewSigner(p.nc.Secret, time.Now), retryAfter: 10 * time.Second,
		layers: map[string]core.TemplateLayer{}, chunks: map[string]map[string]bool{}, clients: map[string]*cluster.Client{}, failed: map[string]time.Time{}}
	raw, err := os.ReadFile(b.file)
	if errors.Is(err, fs.ErrNotExist) {
		return b, nil
	}
	if err != nil {
		return nil, fmt.Errorf("template layers: %w", err)
	}
	var list []core.TemplateLayer
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("template layers %s: %w", b.file, err)
	}
	for _, l := range list {
		b.layers[l.Ref] = l
	}
	return b, nil
}

func (b *nodeBuilds) uidBase() uint32 {
	if b.p.cfg.UIDBase == 0 {
		return 100000 // the template manager's default
	}
	return b.p.cfg.UIDBase
}

// save writes the layers (b.mu held).
func (b *nodeBuilds) save() error {
	list := make([]core.TemplateLayer, 0, len(b.layers))
	for _, l := range b.layers {
		list = append(list, l)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Ref < list[j].Ref })
	raw, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	tmp := b.file + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return fmt.Errorf("template layers: %w", err)
	}
	return os.Rename(tmp, b.file)
}

// manifests returns the manifests of the layers this node keeps (its
// snapshot collection must keep them).
func (b *nodeBuilds) manifests() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.layers))
	for _, l := range b.layers {
		if !l.Deleted {
			out = append(out, l.Manifest)
		}
	}
	return out
}

// adverts returns the layers whose name still points at their tree here,
// and the tombstones of deleted names.
func (b *nodeBuilds) adverts() []core.TemplateLayer {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []core.TemplateLayer
	for ref, l := range b.layers {
		if l.Deleted {
			out = append(out, l)
		} else if tp, err := b.p.tm.Get(ref); err == nil && tp.Digest == l.Digest {
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out
}

// BuildTemplate implements cluster.TemplateBuilder.
func (b *nodeBuilds) BuildTemplate(ctx context.Context, spec cluster.TemplateBuildSpec, payload string, progress core.Progress) (json.RawMessage, error) {
	var (
		ref string
		res any
	)
	switch spec.Kind {
	case "source":
		req := spec.Request
		switch req.Source {
		case "busybox", "debian", "image":
		case "archive":
			if payload == "" {
				return nil, fmt.Errorf("an archive build needs the archive: %w", core.ErrInvalid)
			}
			req.Path = payload
		default:
			return nil, fmt.Errorf("source %.40q: %w", req.Source, core.ErrInvalid)
		}
		info, err := b.p.templates.BuildTemplate(ctx, req, progress)
		if err != nil {
			return nil, mapTemplateErr(err)
		}
		ref, res = req.Name, &info
	case "buildfile":
		bf, err := template.ParseBuildfile(spec.File)
		if err != nil {
			return nil, mapTemplateErr(err)
		}
		for _, in := range bf.Steps {
			if in.Kind == template.InstrStart {
				return nil, fmt.Errorf("START (a pre-warmed template) is not available with remote nodes yet: %w", core.ErrUnavailable)
			}
		}
		req := api.BuildfileRequest{Name: spec.Name, File: spec.File, ProjectID: spec.ProjectID, OpID: spec.OpID}
		if payload != "" {
			dir, err := os.MkdirTemp("", "space-node-context-")
			if err != nil {
				return nil, fmt.Errorf("build context: %w", err)
			}
			defer os.RemoveAll(dir)
			f, err := os.Open(payload)
			if err != nil {
				return nil, fmt.Errorf("build context: %w", err)
			}
			err = b.p.tm.ExtractContext(ctx, f, dir)
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("build context: %w", mapTemplateErr(err))
			}
			req.ContextDir = dir
		}
		out, err := b.p.templates.BuildFromFile(ctx, req, progress)
		if err != nil {
			return nil, err
		}
		r, ok := out.(BuildfileResult)
		if !ok {
			return nil, fmt.Errorf("build file result of type %T", out)
		}
		ref, res = spec.Name, &r
	default:
		return nil, fmt.Errorf("build kind %.40q: %w", spec.Kind, core.ErrInvalid)
	}
	tp, err := b.p.tm.Get(ref)
	if err != nil {
		return nil, mapTemplateErr(err)
	}
	progress(100, "publish: storing the template's layer for the other nodes")
	l, err := b.publish(ctx, tp)
	if err != nil {
		return nil, fmt.Errorf("publish template %s: %w", displayName(ref), err)
	}
	progress(100, fmt.Sprintf("publish: manifest %s", l.Manifest))
	switch r := res.(type) {
	case *core.TemplateInfo:
		r.Nodes = []string{b.p.cfg.NodeName}
	case *BuildfileResult:
		r.Template.Nodes = []string{b.p.cfg.NodeName}
	}
	return json.Marshal(res)
}

// publish stores tp's tree as a manifest and chunks (captured like a
// sandbox's layer: owners relative to this node's uid base) and adds it
// to what this node advertises.
func (b *nodeBuilds) publish(ctx context.Context, tp template.Template) (core.TemplateLayer, error) {
	res, err := b.p.node.Snapshots().Capture(ctx, driver.Layer{Dir: tp.RootfsDir, UIDBase: b.uidBase(), UIDCount: 65536}, nil)
	if err != nil {
		return core.TemplateLayer{}, err
	}
	l := core.TemplateLayer{Ref: tp.Name, Digest: tp.Digest, Manifest: res.Manifest, Source: tp.Source,
		SizeBytes: tp.SizeBytes, Files: tp.Files, Env: tp.Defaults.Env, Cwd: tp.Defaults.Cwd, User: tp.Defaults.User,
		Cmd: tp.Defaults.Cmd, Ready: tp.Defaults.Ready, CreatedAt: tp.CreatedAt.UTC()}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.layers[l.Ref] = l
	return l, b.save()
}

// TemplateBuildLog implements cluster.TemplateBuilder.
func (b *nodeBuilds) TemplateBuildLog(ctx context.Context, opID string, step int) (io.ReadCloser, error) {
	t := b.p.templates
	if t.logDir == "" || !api.ValidOpID(opID) {
		return nil, fmt.Errorf("no build logs: %w", core.ErrNotFound)
	}
	if _, err := os.Stat(filepath.Join(t.logDir, opID)); err != nil {
		return nil, fmt.Errorf("build %s did not run here: %w", opID, core.ErrNotFound)
	}
	f, list, err := t.BuildLog(ctx, opID, step)
	if err != nil {
		return nil, err
	}
	if f != nil {
		return f, nil
	}
	raw, err := json.Marshal(list)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(raw)), nil
}

// TemplateObject implements cluster.TemplateBuilder: only the manifests
// this node advertises and their chunks are served, never a sandbox's
// snapshot data.
func (b *nodeBuilds) TemplateObject(ctx context.Context, key string) ([]byte, error) {
	snaps := b.p.node.Snapshots()
	allowed := false
	for _, m := range b.manifests() {
		if key == "manifests/"+m {
			allowed = true
			break
		}
		set, err := b.chunkSet(ctx, m)
		if err != nil {
			b.p.cfg.Logf("template layer %s: %v", m, err)
			continue
		}
		if d, ok := strings.CutPrefix(key, "chunks/"); ok && len(d) > 3 && set[d[3:]] {
			allowed = true
			break
		}
	}
	if !allowed {
		return nil, fmt.Errorf("object %.100q is not part of a template this node advertises: %w", key, core.ErrNotFound)
	}
	data, err := snaps.ReadLocal(key, 512<<20)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("object %.100q: %w", key, core.ErrNotFound)
	}
	return data, err
}

// chunkSet returns the chunks manifest m names.
func (b *nodeBuilds) chunkSet(ctx context.Context, m string) (map[string]bool, error) {
	b.mu.Lock()
	set := b.chunks[m]
	b.mu.Unlock()
	if set != nil {
		return set, nil
	}
	st, err := b.p.node.Snapshots().LoadState(ctx, []string{m})
	if err != nil {
		return nil, err
	}
	set = map[string]bool{}
	for _, e := range st {
		if e.Type == snapshot.TypeFile {
			for _, c := range e.Chunks {
				set[c] = true
			}
		}
	}
	b.mu.Lock()
	b.chunks[m] = set
	b.mu.Unlock()
	return set, nil
}

// run copies, every interval, the newest layer of each template the
// ready peers advertise that this node lacks.
func (b *nodeBuilds) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.syncOnce(ctx, max(10*interval, 5*time.Second))
	}
}

// candidate is the newest layer of a ref and the peers that hold it.
type candidate struct {
	layer   core.TemplateLayer
	holders []core.NodeRecord
}

func (b *nodeBuilds) syncOnce(ctx context.Context, maxAge time.Duration) {
	nodes, err := b.p.ns.ListNodes(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	best := map[string]*candidate{}
	for _, n := range nodes {
		if n.Name == b.p.cfg.NodeName || n.Kind != core.NodeKindNode || n.State != core.NodeReady || now.Sub(n.HeartbeatAt) > maxAge {
			continue
		}
		for _, l := range n.TemplateLayers {
			c := best[l.Ref]
			switch {
			case c == nil || l.CreatedAt.After(c.layer.CreatedAt):
				best[l.Ref] = &candidate{layer: l, holders: []core.NodeRecord{n}}
			case l.Manifest == c.layer.Manifest:
				c.holders = append(c.holders, n)
			}
		}
	}
	refs := make([]string, 0, len(best))
	for ref := range best {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	stale := map[string]bool{}
	defer func() {
		b.mu.Lock()
		b.stale = stale
		b.mu.Unlock()
	}()
	for _, ref := range refs {
		c := best[ref]
		b.mu.Lock()
		mine, have := b.layers[ref]
		key := ref + " " + c.layer.Manifest
		wait := now.Before(b.failed[key])
		b.mu.Unlock()
		if have && (mine.Manifest == c.layer.Manifest && mine.Deleted == c.layer.Deleted || !c.layer.CreatedAt.After(mine.CreatedAt)) {
			continue // as new here (a tombstone here beats an older build a peer still has)
		}
		if tp, err := b.p.tm.Get(ref); err == nil && !c.layer.CreatedAt.After(tp.CreatedAt) {
			continue // this node's build of the name is as new
		}
		if c.layer.Deleted {
			// Deleted while this node was away (or its build was older):
			// drop it here too; while a sandbox still uses it, keep it
			// out of the heartbeat and try again.
			if err := b.tombstone(ctx, c.layer); err != nil {
				stale[ref] = true
				if ctx.Err() == nil {
					b.p.cfg.Logf("template %s: deleted on the other nodes, not here yet: %v", displayName(ref), err)
				}
			}
			continue
		}
		stale[ref] = true
		if wait {
			continue
		}
		if err := b.copyLayer(ctx, c); err != nil {
			if ctx.Err() != nil {
				return
			}
			b.p.cfg.Logf("template %s: copy from %s: %v (next try in %v)", displayName(ref), c.holders[0].Name, err, b.retryAfter)
			b.mu.Lock()
			b.failed[key] = time.Now().Add(b.retryAfter)
			b.mu.Unlock()
			continue
		}
		delete(stale, ref)
	}
}

// tombstone removes ref's template here if it has one (refused while a
// sandbox uses it) and records the tombstone t.
func (b *nodeBuilds) tombstone(ctx context.Context, t core.TemplateLayer) error {
	if err := b.p.templates.DeleteTemplate(ctx, t.Ref); err != nil && !errors.Is(err, core.ErrNotFound) {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.layers[t.Ref] = core.TemplateLayer{Ref: t.Ref, Deleted: true, CreatedAt: t.CreatedAt}
	return b.save()
}

// TemplateAdmin implements cluster.TemplateBuilder: a delete (with the
// single host's checks: builtins and templates in use are refused) leaves
// a tombstone the other nodes follow; an alias is advertised like a build
// of the alias, on the source's tree; a collection is this node's.
func (b *nodeBuilds) TemplateAdmin(ctx context.Context, req cluster.TemplateAdminReq) (json.RawMessage, error) {
	switch req.Op {
	case cluster.TemplateDelete:
		if err := b.tombstone(ctx, core.TemplateLayer{Ref: req.Ref, CreatedAt: req.At.UTC()}); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]bool{"deleted": true})
	case cluster.TemplateAlias:
		info, err := b.p.templates.AliasTemplate(ctx, req.Ref, req.Alias)
		if err != nil {
			return nil, err
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if src, ok := b.layers[req.Ref]; ok && !src.Deleted {
			src.Ref, src.CreatedAt = req.Alias, req.At.UTC()
			b.layers[req.Alias] = src
		} else {
			delete(b.layers, req.Alias) // an alias of a builtin: every node has it
		}
		if err := b.save(); err != nil {
			return nil, err
		}
		info.Nodes = []string{b.p.cfg.NodeName}
		return json.Marshal(info)
	case cluster.TemplateGC:
		res, err := b.p.templates.GCTemplates(ctx)
		if err != nil {
			return nil, err
		}
		return json.Marshal(res)
	}
	return nil, fmt.Errorf("template op %.40q: %w", req.Op, core.ErrInvalid)
}

// isStale reports whether a peer has a newer build of ref than this node.
func (b *nodeBuilds) isStale(ref string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stale[ref]
}

// copyLayer fetches c's manifest and chunks (from the shared snapshot
// store when a holder shares this node's, else from the holders over the
// node link), checks each against its digest, and commits the tree under
// this node's uid base.
func (b *nodeBuilds) copyLayer(ctx context.Context, c *candidate) error {
	t0 := time.Now()
	snaps := b.p.node.Snapshots()
	l := c.layer
	chain := []string{l.Manifest}
	var (
		st   snapshot.State
		err  error
		from string
	)
	if b.p.snapStore != "" {
		for _, h := range c.holders {
			if h.SnapshotStore == b.p.snapStore {
				from = "the shared snapshot store"
				st, err = snaps.LoadStateFrom(ctx, snaps.Shared(), chain)
				break
			}
		}
	}
	if st == nil {
		for _, h := range c.holders {
			cl, cerr := b.client(h)
			if cerr != nil {
				err = cerr
				continue
			}
			from = "node " + h.Name
			if st, err = snaps.LoadStateFrom(ctx, cluster.PeerObjects{C: cl}, chain); err == nil {
				break
			}
		}
	}
	if st == nil {
		if err == nil {
			err = errors.New("no holder reachable")
		}
		return err
	}
	_, err = b.p.tm.Import(ctx, template.ImportRequest{Name: l.Ref, Digest: l.Digest, Source: l.Source, CreatedAt: l.CreatedAt,
		Defaults: template.Defaults{Env: l.Env, Cwd: l.Cwd, User: l.User, Cmd: l.Cmd, Ready: l.Ready}},
		func(ctx context.Context, dir string) error {
			_, err := snaps.Materialize(ctx, st, driver.Layer{Dir: dir, UIDBase: b.uidBase(), UIDCount: 65536})
			return err
		})
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.layers[l.Ref] = l
	err = b.save()
	b.mu.Unlock()
	b.p.cfg.Logf("template %s: copied %s (%d files) from %s in %v, every object checked against its digest",
		displayName(l.Ref), l.Manifest, l.Files, from, time.Since(t0).Round(time.Millisecond))
	return err
}

// client returns a node-link client for peer n.
func (b *nodeBuilds) client(n core.NodeRecord) (*cluster.Client, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.clients[n.Name]; c != nil && c.URL == n.RPCURL {
		return c, nil
	}
	hc, err := b.link.HTTPClient(n.Name, n.RPCURL)
	if err != nil {
		return nil, err
	}
	c := cluster.NewClient(n.Name, n.RPCURL, b.signer, hc)
	b.clients[n.Name] = c
	return c, nil
}

// collectShared collects the shared snapshot store keeping, beside keep,
// the template manifests every node advertises (a node that cannot read
// them collects nothing).
func (b *nodeBuilds) collectShared(ctx context.Context, keep []string, minAge time.Duration) (snapshot.SharedGCResult, error) {
	nodes, err := b.p.ns.ListNodes(ctx)
	if err != nil {
		return snapshot.SharedGCResult{}, fmt.Errorf("template layers of the nodes: %w", err)
	}
	keep = append(keep, b.manifests()...)
	for _, n := range nodes {
		for _, l := range n.TemplateLayers {
			keep = append(keep, l.Manifest)
		}
	}
	return b.p.node.Snapshots().GCShared(ctx, keep, minAge)
}
