package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	agentclient "github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/template"
)

// Templates adapts the template manager to core.Templates and remembers
// which builtin templates are still being built at start-up.
type Templates struct {
	m      *template.Manager
	logf   func(string, ...any)
	runner *stepRunner // nil: no build-file builds
	store  core.Store  // sandboxes' templates, for delete
	// For pre-warm (set once the service exists) and build logs.
	svc    *core.Service
	engine *core.Engine
	node   *node.Node
	logDir string // <data-dir>/template-builds: one directory per build operation
	// readyTimeout bounds a pre-warm's wait for READY (0: prewarmReadyTimeout).
	readyTimeout time.Duration
	// onBuild, if set, is told of each builtin built at start (metrics).
	onBuild func(source string, d time.Duration, err error)

	mu       sync.Mutex
	building map[string]bool
	failed   map[string]string // builtin name -> why its build failed
	started  map[string]string // sandbox id -> tree digest it was started on (this process)
}

// info describes a template as clients see it: by its name in its scope.
func info(t template.Template) core.TemplateInfo {
	project, name := core.SplitTemplateRef(t.Name)
	ti := core.TemplateInfo{Name: name, Public: project == "", Project: project, Digest: t.Digest, Source: t.Source, SizeBytes: t.SizeBytes,
		Files: t.Files, Env: t.Defaults.Env, Cwd: t.Defaults.Cwd, User: t.Defaults.User, Cmd: t.Defaults.Cmd, Ready: t.Defaults.Ready, CreatedAt: t.CreatedAt}
	if t.Warm != nil {
		ti.WarmSnapshot, ti.WarmProcesses = t.Warm.Snapshot, t.Warm.Processes
	}
	return ti
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
		return core.TemplateInfo{}, fmt.Errorf("template %q: %w", displayName(name), core.ErrNotFound)
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

// resolve maps a name a project uses (a build file's FROM) to the
// template it means: the project's own, else the public one.
func (t *Templates) resolve(projectID, name string) (string, bool) {
	if !core.ValidTemplateName(name) {
		return "", false
	}
	for _, ref := range []string{core.TemplateRef(projectID, name), name} {
		if _, err := t.m.Get(ref); err == nil {
			return ref, true
		}
	}
	return "", false
}

// displayName is a template ref's name within its scope.
func displayName(ref string) string {
	_, name := core.SplitTemplateRef(ref)
	return name
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
		t0, missing := time.Now(), t.isBuilding(name)
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
		if missing && t.onBuild != nil {
			t.onBuild("builtin", time.Since(t0), err)
		}
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

// StartSandbox starts sb cold, notes its tree for template GC and runs
// the template's start command (waiting for its ready check).
func (r *runtime) StartSandbox(ctx context.Context, sb core.Sandbox, progress core.Progress) (core.Placement, error) {
	r.t.noteStarted(sb.ID, sb.TemplateKey())
	pl, err := r.Node.StartSandbox(ctx, sb, progress)
	if err != nil {
		return pl, err
	}
	if tp, terr := r.t.m.Get(sb.TemplateKey()); terr == nil {
		if err := r.runStart(ctx, sb, tp, progress); err != nil {
			if serr := r.Node.StopSandbox(context.WithoutCancel(ctx), sb.ID); serr != nil {
				r.t.logf("sandbox %s: stop after failed start command: %v", sb.ID, serr)
			}
			return core.Placement{}, err
		}
	}
	return pl, nil
}

func (r *runtime) HasTemplate(ctx context.Context, name string) error {
	_, err := r.t.GetTemplate(ctx, name)
	return err
}

// mapTemplateErr maps template errors onto core's, so operations and the
// API report stable codes.
func mapTemplateErr(err error) error {
	var se *template.StepError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se), errors.Is(err, template.ErrInvalid), errors.Is(err, template.ErrUnsafeInput),
		errors.Is(err, template.ErrPrivateRegistry):
		return fmt.Errorf("%w: %w", core.ErrInvalid, err)
	case errors.Is(err, template.ErrNotFound):
		return fmt.Errorf("%w: %w", core.ErrNotFound, err)
	case errors.Is(err, template.ErrLimit):
		return fmt.Errorf("%w: %w", core.ErrExhausted, err)
	case errors.Is(err, template.ErrUnsupported), errors.Is(err, template.ErrLocked):
		return fmt.Errorf("%w: %w", core.ErrUnavailable, err)
	}
	return err
}

// BuildFromFile implements api.TemplateAdmin: a build file's steps run in
// sandboxes of this node's driver; progress reports one line per step state.
func (t *Templates) BuildFromFile(ctx context.Context, req api.BuildfileRequest, progress core.Progress) (any, error) {
	if t.runner == nil {
		return nil, fmt.Errorf("template builds from build files need a driver: %w", core.ErrUnavailable)
	}
	logDir := ""
	if t.logDir != "" && api.ValidOpID(req.OpID) {
		t.pruneLogs()
		logDir = filepath.Join(t.logDir, req.OpID)
	}
	hasStart := false
	if bf, err := template.ParseBuildfile(req.File); err == nil {
		for _, in := range bf.Steps {
			hasStart = hasStart || in.Kind == template.InstrStart
		}
	}
	// The name as it was, to put back if the pre-warm fails.
	var prev *template.Template
	if old, err := t.m.Get(req.Name); err == nil {
		prev = &old
	}
	scope, _ := core.SplitTemplateRef(req.Name)
	res, err := t.m.BuildFromFile(ctx, template.BuildfileRequest{Name: req.Name, File: req.File, Context: req.ContextDir, Runner: t.runner, LogDir: logDir,
		Resolve: func(from string) (string, bool) { return t.resolve(req.ProjectID, from) }, CacheScope: scope},
		func(ev template.StepEvent) {
			// Steps take 0–90% when a pre-warm follows, else 0–100%.
			scale := 100
			if hasStart {
				scale = 90
			}
			pct := scale * (ev.Step - 1) / ev.Steps
			if ev.State != template.StepRunning {
				pct = scale * ev.Step / ev.Steps
			}
			progress(pct, stepMessage(ev))
		})
	if err != nil {
		return nil, mapTemplateErr(err)
	}
	steps := res.Steps
	if steps == nil {
		steps = []template.StepResult{}
	}
	out := BuildfileResult{Template: info(res.Template), Steps: steps}
	if res.HasStart && len(res.Template.Defaults.Cmd) > 0 {
		if t.warmUsable(ctx, res.Template) {
			w := res.Template.Warm
			out.Warm = &WarmResult{Snapshot: w.Snapshot, Kind: w.Kind, Processes: w.Processes, Cached: true}
			progress(100, "prewarm: cached ("+w.Snapshot+")")
			return out, nil
		}
		progress(90, "prewarm: starting a sandbox of "+displayName(req.Name))
		wr, tp, err := t.prewarm(ctx, req.ProjectID, res.Template, func(msg string) { progress(95, msg) })
		if err != nil {
			// No half-made template: the name goes back to what it was.
			if rerr := t.m.RestoreName(req.Name, prev); rerr != nil {
				t.logf("template %s: restore name after failed pre-warm: %v", req.Name, rerr)
			}
			return nil, mapTemplateErr(err)
		}
		out.Warm, out.Template = &wr, info(tp)
		progress(100, fmt.Sprintf("prewarm: snapshot %s (%s) in %.2fs", wr.Snapshot, wr.Kind, wr.Seconds))
	}
	return out, nil
}

// BuildfileResult is a build-file operation's result.
type BuildfileResult struct {
	Template core.TemplateInfo     `json:"template"`
	Steps    []template.StepResult `json:"steps"`
	Warm     *WarmResult           `json:"warm,omitempty"` // the pre-warm of a build file with START
}

// maxBuildLogDirs bounds the build log directories kept (oldest go first);
// logs older than buildLogTTL go too.
const (
	maxBuildLogDirs = 200
	buildLogTTL     = 7 * 24 * time.Hour
)

// pruneLogs removes old build logs before a build adds one.
func (t *Templates) pruneLogs() {
	ents, err := os.ReadDir(t.logDir)
	if err != nil {
		return
	}
	type dir struct {
		name string
		mod  time.Time
	}
	var dirs []dir
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !e.IsDir() {
			continue
		}
		dirs = append(dirs, dir{e.Name(), fi.ModTime()})
	}
	sort.Slice(dirs, func(i, j int) bool { return dirs[i].mod.Before(dirs[j].mod) })
	for i, d := range dirs {
		if len(dirs)-i >= maxBuildLogDirs || time.Since(d.mod) > buildLogTTL {
			os.RemoveAll(filepath.Join(t.logDir, d.name))
		}
	}
}

// BuildLog implements api.TemplateAdmin: step's full log of build
// operation opID (the caller checked the operation is the project's).
// step 0 lists the steps that have a log.
func (t *Templates) BuildLog(ctx context.Context, opID string, step int) (*os.File, []api.StepLog, error) {
	if t.logDir == "" || !api.ValidOpID(opID) {
		return nil, nil, fmt.Errorf("no build logs: %w", core.ErrNotFound)
	}
	dir := filepath.Join(t.logDir, opID)
	if step > 0 {
		f, err := os.Open(template.StepLogPath(dir, step))
		if err != nil {
			return nil, nil, fmt.Errorf("build %s has no log for step %d (only RUN steps that ran have one): %w", opID, step, core.ErrNotFound)
		}
		return f, nil, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, []api.StepLog{}, nil
	}
	list := []api.StepLog{}
	for _, e := range ents {
		var n int
		if _, err := fmt.Sscanf(e.Name(), "step-%d.log", &n); err != nil || n <= 0 {
			continue
		}
		if fi, err := e.Info(); err == nil {
			list = append(list, api.StepLog{Step: n, Bytes: fi.Size()})
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Step < list[j].Step })
	return nil, list, nil
}

// GCTemplates implements api.TemplateAdmin: removes layers no name
// refers to and no live sandbox may be using (see liveDigests).
func (t *Templates) GCTemplates(ctx context.Context) (api.TemplateGCResult, error) {
	keep, err := t.liveDigests(ctx)
	if err != nil {
		return api.TemplateGCResult{}, err
	}
	removed, err := t.m.GC(ctx, func(d string) bool { return keep[d] })
	if removed == nil {
		removed = []string{}
	}
	if err != nil {
		return api.TemplateGCResult{Removed: removed}, mapTemplateErr(err)
	}
	return api.TemplateGCResult{Removed: removed}, nil
}

// liveDigests is the trees sandboxes that are not deleted may use: the one
// recorded when this process started them, else their template name's.
// A live sandbox whose name is gone and whose tree this process did not
// record makes GC refuse (it cannot tell which tree is under it).
func (t *Templates) liveDigests(ctx context.Context) (map[string]bool, error) {
	keep := map[string]bool{}
	if t.store == nil {
		return keep, nil
	}
	t.mu.Lock()
	for _, d := range t.started {
		keep[d] = true
	}
	t.mu.Unlock()
	after := ""
	for {
		list, err := t.store.ListSandboxes(ctx, core.SandboxFilter{After: after, Limit: 500})
		if err != nil {
			return nil, err
		}
		for _, sb := range list {
			if sb.State == core.SandboxDeleted || sb.State == core.SandboxFailed {
				continue
			}
			t.mu.Lock()
			d, ok := t.started[sb.ID]
			t.mu.Unlock()
			if ok {
				keep[d] = true
				continue
			}
			tp, err := t.m.Get(sb.TemplateKey())
			if err != nil {
				return nil, fmt.Errorf("sandbox %s uses template %q, which no longer has a name, and this server did not start it: run GC once it is deleted: %w", sb.ID, sb.Template, core.ErrConflict)
			}
			keep[tp.Digest] = true
		}
		if len(list) < 500 {
			break
		}
		after = list[len(list)-1].ID
	}
	return keep, nil
}

// noteStarted records the tree a sandbox was started on, for GC.
func (t *Templates) noteStarted(id, template string) {
	tp, err := t.m.Get(template)
	if err != nil {
		return
	}
	t.mu.Lock()
	if t.started == nil {
		t.started = map[string]string{}
	}
	t.started[id] = tp.Digest
	t.mu.Unlock()
}

// StopSandbox destroys the instance and forgets its tree.
func (r *runtime) StopSandbox(ctx context.Context, id string) error {
	err := r.Node.StopSandbox(ctx, id)
	if err == nil {
		r.t.mu.Lock()
		delete(r.t.started, id)
		r.t.mu.Unlock()
	}
	return err
}

// stepMessage is the operation message of a step event, in the fixed form
// "step N/M INSTRUCTION: STATE[ detail]" that clients may parse.
func stepMessage(ev template.StepEvent) string {
	msg := fmt.Sprintf("step %d/%d %s: %s", ev.Step, ev.Steps, ev.Instruction, ev.State)
	switch {
	case ev.State == template.StepRunning && ev.Bytes > 0:
		msg += fmt.Sprintf(" (%d bytes)", ev.Bytes)
	case ev.State == template.StepDone:
		msg += fmt.Sprintf(" in %.2fs (%d bytes)", ev.Seconds, ev.Bytes)
	}
	return msg
}

// ValidateBuildfile implements api.TemplateAdmin.
func (t *Templates) ValidateBuildfile(b []byte) error {
	_, err := template.ParseBuildfile(b)
	return mapTemplateErr(err)
}

// ExtractContext implements api.TemplateAdmin.
func (t *Templates) ExtractContext(ctx context.Context, r io.Reader, dir string) error {
	return mapTemplateErr(t.m.ExtractContext(ctx, r, dir))
}

// DeleteTemplate implements api.TemplateAdmin: refused while any sandbox
// (of any project, hibernated ones included) was created from the name.
// The tree stays until GC.
func (t *Templates) DeleteTemplate(ctx context.Context, name string) error {
	if _, err := t.m.Get(name); err != nil {
		return mapTemplateErr(err)
	}
	if name == template.BuiltinMinimal || name == template.BuiltinBase {
		// The warm pool and the default sandbox template depend on them.
		return fmt.Errorf("template %q is a builtin: %w", name, core.ErrConflict)
	}
	if t.store != nil {
		after := ""
		for {
			list, err := t.store.ListSandboxes(ctx, core.SandboxFilter{After: after, Limit: 500})
			if err != nil {
				return err
			}
			for _, sb := range list {
				if sb.TemplateKey() == name {
					return fmt.Errorf("template %q is used by sandbox %s (%s): %w", displayName(name), sb.ID, sb.State, core.ErrConflict)
				}
			}
			if len(list) < 500 {
				break
			}
			after = list[len(list)-1].ID
		}
	}
	tp, _ := t.m.Get(name)
	if err := t.m.Remove(name); err != nil {
		return mapTemplateErr(err)
	}
	// The warm snapshot goes with the last name that uses it.
	if tp.Warm != nil && t.svc != nil && !t.warmShared(tp.Warm.Snapshot) {
		if sn, err := t.store.GetSnapshot(ctx, "", tp.Warm.Snapshot); err == nil {
			t.dropSnapshot(ctx, sn.ProjectID, sn.ID)
		}
	}
	return nil
}

// warmShared reports whether another name (an alias) uses snapshot id.
func (t *Templates) warmShared(id string) bool {
	list, err := t.m.List()
	if err != nil {
		return true
	}
	for _, o := range list {
		if o.Warm != nil && o.Warm.Snapshot == id {
			return true
		}
	}
	return false
}

// AliasTemplate implements api.TemplateAdmin.
func (t *Templates) AliasTemplate(ctx context.Context, name, alias string) (core.TemplateInfo, error) {
	tp, err := t.m.Alias(name, alias)
	if err != nil {
		return core.TemplateInfo{}, mapTemplateErr(err)
	}
	return info(tp), nil
}

// stepRunner runs build-file RUN steps in sandboxes made directly by the
// node's driver: same isolation and limits as any sandbox, and, where the
// egress gateway runs, its default blocked network (no policy is ever
// applied to a build sandbox). Build sandboxes are not sandboxes of any
// project; one left by a crash is removed by the driver's start-up sweep.
type stepRunner struct {
	drv     driver.Driver
	limits  driver.Limits
	timeout time.Duration
}

func (r *stepRunner) RunStep(ctx context.Context, rootfs string, spec template.RunSpec, out io.Writer, capture func(string, uint32) error) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	inst, err := r.drv.Create(ctx, driver.Spec{ID: core.NewID("bld-"), Hostname: "build", RootfsDir: rootfs, Limits: r.limits})
	if err != nil {
		return -1, fmt.Errorf("create build sandbox: %w", err)
	}
	defer inst.Destroy(context.WithoutCancel(ctx))
	ag := agentclient.New(inst.Dial)
	defer ag.Close()
	if spec.Cwd != "" {
		// WORKDIR creates the directory (as root), as in Dockerfiles.
		if err := ag.Mkdir(ctx, spec.Cwd); err != nil {
			return -1, fmt.Errorf("create workdir %s: %w", spec.Cwd, err)
		}
	}
	if err := ag.SetConfig(ctx, agent.Config{Env: spec.Env, Cwd: spec.Cwd, User: spec.User}); err != nil {
		if agentclient.IsBadRequest(err) { // e.g. a USER the tree does not know
			fmt.Fprintf(out, "cannot run with this config: %v\n", err)
			return 127, nil
		}
		return -1, fmt.Errorf("configure build sandbox: %w", err)
	}
	pi, err := ag.Start(ctx, agent.ProcessSpec{Argv: spec.Argv, Shell: spec.Shell, TimeoutMs: r.timeout.Milliseconds()})
	if err != nil {
		if agentclient.IsBadRequest(err) || agentclient.IsNotFound(err) {
			fmt.Fprintf(out, "cannot start: %v\n", err)
			return 127, nil
		}
		return -1, fmt.Errorf("start step: %w", err)
	}
	ex, err := follow(ctx, ag, pi.ID, out)
	if err != nil {
		return -1, err
	}
	code := ex.Code
	if ex.Error != "" {
		fmt.Fprintf(out, "%s\n", ex.Error)
	}
	if code == 0 && (ex.Signal != "" || ex.Error != "") {
		code = -1
	}
	if ex.TimedOut {
		fmt.Fprintf(out, "step timed out after %s\n", r.timeout)
	}
	if code != 0 {
		return code, nil
	}
	// Freeze whatever the step left running, then read its layer.
	p, ok := driver.As[driver.Pauser](inst)
	li, ok2 := driver.As[driver.LayerInstance](inst)
	if !ok || !ok2 {
		return -1, fmt.Errorf("driver %s cannot stop a sandbox and expose its writable layer, which builds need: %w", r.drv.Name(), core.ErrUnavailable)
	}
	if err := p.Pause(ctx); err != nil {
		return -1, fmt.Errorf("freeze build sandbox: %w", err)
	}
	layer, err := li.WritableLayer()
	if err != nil {
		return -1, err
	}
	return 0, capture(layer.Dir, layer.UIDBase)
}

// follow copies a command's output to out until it exits.
func follow(ctx context.Context, ag *agentclient.Client, id string, out io.Writer) (agent.Exit, error) {
	var after uint64
	for attempt := 0; attempt < 5; attempt++ {
		er, err := ag.Events(ctx, id, after)
		if err != nil {
			if ctx.Err() != nil {
				return agent.Exit{}, ctx.Err()
			}
			time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond)
			continue
		}
		for {
			ev, err := er.Next()
			if err != nil {
				er.Close()
				break
			}
			after = ev.Seq
			switch ev.Type {
			case agent.EventStdout, agent.EventStderr:
				out.Write(ev.Data)
			case agent.EventExit:
				er.Close()
				var ex agent.Exit
				if json.Unmarshal(ev.Data, &ex) != nil {
					ex = agent.Exit{Code: -1, Error: "agent sent a malformed exit event"}
				}
				return ex, nil
			}
		}
		if ctx.Err() != nil {
			return agent.Exit{}, ctx.Err()
		}
	}
	return agent.Exit{}, errors.New("lost contact with the build sandbox's agent")
}

// buildStepRunner runs build-file RUN steps on drv with the default
// limits (a server's or a node's).
func buildStepRunner(cfg Config, drv driver.Driver) *stepRunner {
	return &stepRunner{drv: drv, timeout: time.Hour, limits: driver.Limits{MemoryBytes: cfg.DefaultLimits.MemoryBytes,
		CPUMillis: cfg.DefaultLimits.CPUMillis, Pids: cfg.DefaultLimits.Pids,
		// A build step's layer may grow to the largest disk a sandbox may have.
		DiskBytes: cmp.Or(cfg.MaxLimits.DiskBytes, cfg.DefaultLimits.DiskBytes)}}
}
