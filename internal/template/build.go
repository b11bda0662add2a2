package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// SourceBuildfile is the source of templates built from a build file.
const SourceBuildfile = "buildfile"

// maxStepOutput is how much of a step's output (its tail) is kept for the
// build result and the error of a failed step.
const maxStepOutput = 64 << 10

// MaxStepLog bounds a RUN step's full log kept on disk (BuildfileRequest.LogDir).
const MaxStepLog = 4 << 20

// RunSpec is one RUN step's command and the config it runs under.
type RunSpec struct {
	Argv  []string // exec form; else Shell
	Shell string
	Env   map[string]string
	Cwd   string
	User  string
}

// StepRunner runs RUN steps in real sandboxes (the server implements it
// with the node's driver, so steps get the same isolation and blocked
// egress as any sandbox).
type StepRunner interface {
	// RunStep starts a sandbox whose read-only lower layer is rootfs, runs
	// spec in it with its output written to out, and after the command
	// exited, with every process of the sandbox stopped, calls capture with
	// the sandbox's writable layer directory (an overlay upper dir whose
	// files carry host ids) and the host id of the sandbox's root (its own
	// uid block, or the template range where sandboxes share it). The
	// sandbox is removed before RunStep returns.
	// A non-zero exit is returned as exit with a nil error, and capture is
	// then not called.
	RunStep(ctx context.Context, rootfs string, spec RunSpec, out io.Writer, capture func(layerDir string, uidBase uint32) error) (exit int, err error)
}

// BuildfileRequest asks for a template built from a build file.
type BuildfileRequest struct {
	Name    string
	File    []byte // the build file's text
	Context string // directory holding the build context (COPY sources); "" for none
	Runner  StepRunner
	// LogDir, if set, receives each RUN step's output as step-N.log (the
	// first MaxStepLog bytes; failed steps too). It is created if missing.
	LogDir string
	// Resolve, if set, maps FROM's text to the local template it means
	// (false: none, try it as a registry image). Without it FROM names a
	// local template as it is.
	Resolve func(from string) (string, bool)
	// CacheScope separates step caches ("" = the shared, public scope).
	CacheScope string
}

// StepLogPath is where BuildFromFile writes step n's log under logDir.
func StepLogPath(logDir string, n int) string {
	return filepath.Join(logDir, fmt.Sprintf("step-%d.log", n))
}

// Step states in StepEvents.
const (
	StepRunning = "running"
	StepCached  = "cached"
	StepDone    = "done"
)

// StepEvent reports a build step's progress. Events of one build arrive in
// order, step by step: "running" (repeated with the byte count while a RUN
// writes output) then "done" or "cached"; a step that nothing had to be
// done for (config steps, layers below the newest cached one) is "cached"
// alone.
type StepEvent struct {
	Step        int     `json:"step"`  // 1-based; FROM is step 1
	Steps       int     `json:"steps"` // total
	Instruction string  `json:"instruction"`
	State       string  `json:"state"`
	Cached      bool    `json:"cached"`
	Bytes       int64   `json:"bytes"` // RUN output or COPY data so far
	Seconds     float64 `json:"seconds,omitempty"`
	Layer       string  `json:"layer,omitempty"`
}

// StepResult is one finished step of a build.
type StepResult struct {
	Step        int     `json:"step"`
	Instruction string  `json:"instruction"`
	Cached      bool    `json:"cached"`
	Seconds     float64 `json:"seconds"`
	Bytes       int64   `json:"bytes"`
	Layer       string  `json:"layer,omitempty"`
	// Output is the tail (at most 64 KiB) of a RUN step's output.
	Output          string `json:"output,omitempty"`
	OutputTruncated bool   `json:"output_truncated,omitempty"`
	// LogBytes is what the step's full log on disk holds (at most
	// MaxStepLog); LogTruncated says output beyond it was dropped.
	LogBytes     int64 `json:"log_bytes,omitempty"`
	LogTruncated bool  `json:"log_truncated,omitempty"`
}

// BuildfileResult is a finished build.
type BuildfileResult struct {
	Template Template
	Steps    []StepResult
	// HasStart says the build file itself has START (not only inherited
	// from FROM): the server pre-warms such templates.
	HasStart bool
}

// StepError is a RUN step that exited non-zero.
type StepError struct {
	Step        int
	Instruction string
	ExitCode    int
	Output      string // tail of the step's output
}

func (e *StepError) Error() string {
	out := e.Output
	if len(out) > 4096 {
		out = "…" + out[len(out)-4096:]
	}
	// BuildFromFile's error names the step; this is what happened in it.
	return fmt.Sprintf("exited with code %d; output:\n%s", e.ExitCode, out)
}

// Unwrap lets callers match a failed step as invalid input.
func (e *StepError) Unwrap() error { return ErrInvalid }

// stepKey is what determines a RUN or COPY layer; its hash names the layer.
type stepKey struct {
	Builder int               `json:"builder"`
	Parent  string            `json:"parent"`
	Kind    string            `json:"kind"`
	Shell   string            `json:"shell,omitempty"`
	Argv    []string          `json:"argv,omitempty"`
	Srcs    []string          `json:"srcs,omitempty"`
	Dest    string            `json:"dest,omitempty"`
	Sources string            `json:"sources,omitempty"` // content hash of COPY sources
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	User    string            `json:"user,omitempty"`
	// Scope keeps one project's step cache its own: a RUN that made a
	// secret, or a COPY of private files, is never another project's
	// cache hit (nor a probe of what another project built).
	Scope string `json:"scope,omitempty"`
}

// BuildFromFile builds req.File step by step. Every RUN and COPY step is a
// content-addressed layer (a whole tree under rootfs/, its unchanged files
// hard links to its parent's) named by hash(parent layer, instruction,
// config, COPY sources' content); a step whose layer exists is a cache hit
// and runs nothing. ENV, WORKDIR, USER, START and READY only change the
// template's defaults. The name is pointed at the last layer only when every
// step succeeded; a failed step leaves no template (its earlier layers stay
// as cache).
func (m *Manager) BuildFromFile(ctx context.Context, req BuildfileRequest, events func(StepEvent)) (BuildfileResult, error) {
	var res BuildfileResult
	if events == nil {
		events = func(StepEvent) {}
	}
	if err := validateName(req.Name); err != nil {
		return res, err
	}
	bf, err := ParseBuildfile(req.File)
	if err != nil {
		return res, err
	}
	var ctxRoot *os.Root
	if req.Context != "" {
		if ctxRoot, err = os.OpenRoot(req.Context); err != nil {
			return res, fmt.Errorf("template: open build context: %w", err)
		}
		defer ctxRoot.Close()
	}
	for _, in := range bf.Steps {
		res.HasStart = res.HasStart || in.Kind == InstrStart
	}
	if req.LogDir != "" {
		if err := os.MkdirAll(req.LogDir, 0o700); err != nil {
			return res, fmt.Errorf("template: build log dir: %w", err)
		}
	}
	steps := len(bf.Steps) + 1
	short := func(s string) string {
		if len(s) > 200 {
			return s[:200] + "…"
		}
		return s
	}
	fromText := short("FROM " + bf.From)
	t0 := time.Now()
	events(StepEvent{Step: 1, Steps: steps, Instruction: fromText, State: StepRunning})
	base, err := m.resolveBase(ctx, bf.From, req.Resolve)
	if err != nil {
		return res, fmt.Errorf("step 1 (%s): %w", fromText, err)
	}
	defer base.close()
	m.pin(base.digest)
	defer m.unpin(base.digest)

	// Pass 1: every step's config and layer key, from the inputs alone
	// (COPY sources are hashed here, so a bad source fails before anything
	// runs).
	type planned struct {
		in     Instruction
		n      int
		text   string
		cfg    Defaults // for a layer step, the config it runs under; else the config after it
		pl     *plan    // nil for config steps
		parent string
	}
	cfg := base.defaults
	layer := base.digest
	plans := make([]planned, len(bf.Steps))
	for i, in := range bf.Steps {
		p := planned{in: in, n: i + 2, text: short(in.Text), parent: layer}
		switch in.Kind {
		case InstrEnv, InstrWorkdir, InstrUser, InstrStart, InstrReady:
			cfg = applyConfig(cfg, in)
			if err := cfg.validate(); err != nil {
				return res, fmt.Errorf("step %d (%s): %w", p.n, p.text, err)
			}
			p.cfg = cfg
			plans[i] = p
			continue
		}
		key := stepKey{Builder: builderVersion, Parent: layer, Kind: in.Kind, Shell: in.Shell, Argv: in.Argv,
			Srcs: in.Srcs, Dest: in.Dest, Env: cfg.Env, Cwd: cfg.Cwd, User: cfg.User, Scope: req.CacheScope}
		if in.Kind == InstrCopy {
			if ctxRoot == nil {
				return res, fmt.Errorf("step %d (%s): %w: COPY needs a build context", p.n, p.text, ErrInvalid)
			}
			if key.Sources, err = hashSources(ctx, ctxRoot, in.Srcs, m.limits()); err != nil {
				return res, fmt.Errorf("step %d (%s): %w", p.n, p.text, err)
			}
		}
		raw, err := json.Marshal(key)
		if err != nil {
			return res, fmt.Errorf("template: encode step key: %w", err)
		}
		sum := sha256.Sum256(raw)
		p.pl = &plan{hex: hex.EncodeToString(sum[:]), source: SourceBuildfile + "-step", recipe: raw}
		p.pl.digest = "sha256:" + p.pl.hex
		p.cfg = cfg
		m.pin(p.pl.digest)
		defer m.unpin(p.pl.digest)
		layer = p.pl.digest
		plans[i] = p
	}

	// The newest layer that exists already makes every step up to it a
	// cache hit, even if GC removed the unnamed layers below it (and the
	// base need not be fetched).
	hit := -1
	for i := len(plans) - 1; i >= 0 && hit < 0; i-- {
		if plans[i].pl != nil {
			if _, err := os.Lstat(m.rootfsPath(plans[i].pl.hex)); err == nil {
				hit = i
			}
		}
	}
	fromCached := true
	if hit < 0 {
		built, err := base.ensure(ctx)
		if err != nil {
			return res, fmt.Errorf("step 1 (%s): %w", fromText, err)
		}
		fromCached = !built
	}
	ev := StepEvent{Step: 1, Steps: steps, Instruction: fromText, State: StepDone, Cached: fromCached, Seconds: time.Since(t0).Seconds(), Layer: base.digest}
	if fromCached {
		ev.State = StepCached
	}
	events(ev)
	res.Steps = append(res.Steps, StepResult{Step: 1, Instruction: fromText, Cached: fromCached, Seconds: ev.Seconds, Layer: base.digest})

	// Pass 2: run what the cache does not have, in order.
	layer = base.digest
	for i, p := range plans {
		if p.pl == nil || i <= hit {
			if p.pl != nil {
				layer = p.pl.digest
			}
			events(StepEvent{Step: p.n, Steps: steps, Instruction: p.text, State: StepCached, Cached: true, Layer: layer})
			res.Steps = append(res.Steps, StepResult{Step: p.n, Instruction: p.text, Cached: true, Layer: layer})
			continue
		}
		t0 := time.Now()
		events(StepEvent{Step: p.n, Steps: steps, Instruction: p.text, State: StepRunning})
		out := &tailBuffer{max: maxStepOutput}
		if req.LogDir != "" && p.in.Kind == InstrRun {
			f, err := os.OpenFile(StepLogPath(req.LogDir, p.n), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return res, fmt.Errorf("template: step log: %w", err)
			}
			out.log = &cappedFile{f: f, max: MaxStepLog}
			defer out.log.close()
		}
		var bytesMu sync.Mutex
		var lastEvent time.Time
		out.onWrite = func(total int64) {
			bytesMu.Lock()
			defer bytesMu.Unlock()
			if time.Since(lastEvent) >= time.Second {
				lastEvent = time.Now()
				events(StepEvent{Step: p.n, Steps: steps, Instruction: p.text, State: StepRunning, Bytes: total})
			}
		}
		ran, err := m.singleflight(ctx, p.pl, func() error {
			return m.buildStep(ctx, p.pl, p.parent, p.in, p.cfg, ctxRoot, req.Runner, out, p.n, p.text)
		})
		if err != nil {
			return res, fmt.Errorf("step %d (%s): %w", p.n, p.text, err)
		}
		layer = p.pl.digest
		r := StepResult{Step: p.n, Instruction: p.text, Cached: !ran, Seconds: time.Since(t0).Seconds(), Layer: layer}
		if ran {
			r.Bytes = out.total
			r.Output, r.OutputTruncated = out.String(), out.total > int64(len(out.buf))
			if p.in.Kind == InstrCopy {
				r.Bytes = out.copied
			}
			if out.log != nil {
				r.LogBytes, r.LogTruncated = out.log.n, out.log.dropped > 0
			}
		}
		ev := StepEvent{Step: p.n, Steps: steps, Instruction: p.text, State: StepDone, Cached: !ran, Bytes: r.Bytes, Seconds: r.Seconds, Layer: layer}
		if !ran {
			ev.State = StepCached
		}
		events(ev)
		res.Steps = append(res.Steps, r)
	}
	if len(plans) > 0 {
		cfg = plans[len(plans)-1].cfg
	}
	t, err := m.nameLayer(req.Name, layer, cfg)
	if err != nil {
		return res, err
	}
	res.Template = t
	return res, nil
}

// baseLayer is a resolved FROM: its digest and defaults, and how to make
// sure its tree exists (a registry image is pulled only when a step needs it).
type baseLayer struct {
	digest   string
	defaults Defaults
	ensure   func(ctx context.Context) (built bool, err error)
	close    func()
}

// resolveBase resolves FROM: a local template by name, else a registry
// image (planned like source "image" but without a name of its own).
func (m *Manager) resolveBase(ctx context.Context, from string, resolve func(string) (string, bool)) (baseLayer, error) {
	local, ok := from, validateName(from) == nil
	if resolve != nil {
		local, ok = resolve(from)
	}
	if ok {
		if t, err := m.Get(local); err == nil {
			return baseLayer{digest: t.Digest, defaults: copyDefaults(t.Defaults), close: func() {},
				ensure: func(context.Context) (bool, error) {
					if _, err := os.Lstat(t.RootfsDir); err != nil {
						return false, fmt.Errorf("%w: template %q vanished", ErrNotFound, from)
					}
					return false, nil
				}}, nil
		}
	}
	pl, err := m.plan(ctx, BuildRequest{Source: SourceImage, Image: from}, func(string, int64, int64, string) {})
	if err != nil {
		return baseLayer{}, fmt.Errorf("FROM %q is neither a template here nor a pullable image: %w", from, err)
	}
	var d Defaults
	if pl.defaults != nil {
		d = copyDefaults(*pl.defaults)
	}
	if err := d.validate(); err != nil {
		pl.close()
		return baseLayer{}, err
	}
	return baseLayer{digest: pl.digest, defaults: d, close: pl.close,
		ensure: func(ctx context.Context) (bool, error) {
			return m.singleflight(ctx, pl, func() error {
				return m.buildRootfs(ctx, pl, func(string, int64, int64, string) {})
			})
		}}, nil
}

func copyDefaults(d Defaults) Defaults {
	out := d
	out.Env = make(map[string]string, len(d.Env))
	for k, v := range d.Env {
		out.Env[k] = v
	}
	out.Cmd = append([]string(nil), d.Cmd...)
	out.Ready = append([]string(nil), d.Ready...)
	return out
}

// singleflight makes sure pl's tree exists, building it with build unless
// it is there already or another build of it finishes first. It reports
// whether this call built it. Callers pin pl.digest against GC.
func (m *Manager) singleflight(ctx context.Context, pl *plan, build func() error) (bool, error) {
	for {
		m.mu.Lock()
		if _, err := os.Lstat(m.rootfsPath(pl.hex)); err == nil {
			m.mu.Unlock()
			return false, nil
		}
		f := m.inflight[pl.digest]
		leader := f == nil
		if leader {
			f = &flight{done: make(chan struct{})}
			m.inflight[pl.digest] = f
		}
		m.mu.Unlock()
		if !leader {
			select {
			case <-f.done:
			case <-ctx.Done():
				return false, ctx.Err()
			}
			if f.err != nil && !errors.Is(f.err, context.Canceled) && !errors.Is(f.err, context.DeadlineExceeded) {
				return false, f.err
			}
			if err := ctx.Err(); err != nil {
				return false, err
			}
			continue
		}
		err := build()
		m.mu.Lock()
		delete(m.inflight, pl.digest)
		f.err = err
		close(f.done)
		m.mu.Unlock()
		return err == nil, err
	}
}

// buildStep makes the layer of one RUN or COPY step from its parent.
func (m *Manager) buildStep(ctx context.Context, pl *plan, parent string, in Instruction, cfg Defaults, ctxRoot *os.Root, runner StepRunner, out *tailBuffer, n int, text string) (err error) {
	start := time.Now()
	parentDir := m.rootfsPath(strings.TrimPrefix(parent, "sha256:"))
	root, cleanup, err := m.stageRoot("step-")
	if err != nil {
		return err
	}
	defer cleanup(&err)
	if err := cloneTree(ctx, parentDir, root); err != nil {
		return err
	}
	dst, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("template: open staging: %w", err)
	}
	defer dst.Close()
	switch in.Kind {
	case InstrCopy:
		n, err := copyInto(ctx, ctxRoot, dst, in.Srcs, in.Dest, cfg.Cwd, int(m.opts.UIDBase), m.limits())
		out.copied = n
		if err != nil {
			return err
		}
	case InstrRun:
		if runner == nil {
			return fmt.Errorf("%w: RUN needs a sandbox runner", ErrUnsupported)
		}
		spec := RunSpec{Argv: in.Argv, Shell: in.Shell, Env: cfg.Env, Cwd: cfg.Cwd, User: cfg.User}
		var applied bool
		code, err := runner.RunStep(ctx, parentDir, spec, out, func(layerDir string, layerBase uint32) error {
			_, err := applyUpper(ctx, layerDir, dst, m.limits(), layerBase, m.opts.UIDBase, m.opts.UIDCount)
			applied = err == nil
			return err
		})
		if err != nil {
			return err
		}
		if code != 0 {
			return &StepError{Step: n, Instruction: text, ExitCode: code, Output: out.String()}
		}
		if !applied {
			return errors.New("template: the step runner did not capture the sandbox's layer")
		}
	default:
		return fmt.Errorf("%w: %s makes no layer", ErrInvalid, in.Kind)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !m.opts.NoSync {
		if err := syncFS(root); err != nil {
			return err
		}
	}
	if err := os.Rename(root, m.rootfsPath(pl.hex)); err != nil {
		return fmt.Errorf("template: commit step layer %s: %w", pl.digest, err)
	}
	if !m.opts.NoSync {
		syncDir(m.rootfsRoot())
	}
	stats, err := treeStats(m.rootfsPath(pl.hex))
	if err != nil {
		return err
	}
	meta := rootfsMeta{Digest: pl.digest, Source: pl.source, SizeBytes: stats.size, Files: stats.files,
		BuiltAt: time.Now().UTC(), BuildSeconds: time.Since(start).Seconds(), Recipe: pl.recipe}
	return writeJSONAtomic(m.rootfsRoot(), pl.hex+".json", meta, !m.opts.NoSync)
}

// nameLayer points name at layer with cfg as its defaults.
func (m *Manager) nameLayer(name, layer string, cfg Defaults) (Template, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.builtins, name)
	hx := strings.TrimPrefix(layer, "sha256:")
	if _, err := os.Lstat(m.rootfsPath(hx)); err != nil {
		return Template{}, fmt.Errorf("template: layer %s vanished: %w", layer, err)
	}
	meta, err := m.loadMeta(&plan{digest: layer, hex: hx, source: SourceBuildfile})
	if err != nil {
		return Template{}, err
	}
	if old, err := m.readName(name); err == nil && old.Digest == layer && old.Source == SourceBuildfile && defaultsEqual(old.Defaults, cfg) {
		return m.toTemplate(old), nil // unchanged: keep CreatedAt
	}
	r := nameRecord{Name: name, Digest: layer, Source: SourceBuildfile, Defaults: cfg,
		SizeBytes: meta.SizeBytes, Files: meta.Files, CreatedAt: time.Now().UTC()}
	if err := writeJSONAtomic(m.namesDir(), name+".json", r, !m.opts.NoSync); err != nil {
		return Template{}, err
	}
	return m.toTemplate(r), nil
}

// Alias points name at the same tree and defaults as existing (a tag).
// Templates are immutable: an existing alias is re-pointed, never edited.
func (m *Manager) Alias(existing, name string) (Template, error) {
	if err := validateName(name); err != nil {
		return Template{}, err
	}
	t, err := m.Get(existing)
	if err != nil {
		return Template{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.builtins, name)
	// From t, not existing's file: a builtin is this manager's own build.
	r := nameRecord{Name: name, Digest: t.Digest, Source: t.Source, Defaults: t.Defaults,
		SizeBytes: t.SizeBytes, Files: t.Files, CreatedAt: time.Now().UTC(), Warm: t.Warm}
	if _, err := os.Lstat(t.RootfsDir); err != nil {
		return Template{}, fmt.Errorf("%w: %q: rootfs missing", ErrNotFound, existing)
	}
	if err := writeJSONAtomic(m.namesDir(), name+".json", r, !m.opts.NoSync); err != nil {
		return Template{}, err
	}
	return m.toTemplate(r), nil
}

func (m *Manager) pin(digest string) {
	m.mu.Lock()
	m.pins[digest]++
	m.mu.Unlock()
}

func (m *Manager) unpin(digest string) {
	m.mu.Lock()
	if m.pins[digest]--; m.pins[digest] <= 0 {
		delete(m.pins, digest)
	}
	m.mu.Unlock()
}

// ExtractContext unpacks a build context tarball into the empty directory
// dir with the hardened extractor (no escapes, bounded), ignoring owners.
func (m *Manager) ExtractContext(ctx context.Context, r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("template: open context dir: %w", err)
	}
	defer root.Close()
	lim := m.limits()
	lim.chown = false
	return extractTar(ctx, r, root, lim, func(int64, string) {}, m.opts.Logf)
}

// tailBuffer keeps the last max bytes written and counts them all.
type tailBuffer struct {
	mu      sync.Mutex
	max     int
	buf     []byte
	total   int64
	copied  int64
	onWrite func(total int64)
	log     *cappedFile // nil: no full log
}

// cappedFile keeps the first max bytes written to it and counts the rest.
type cappedFile struct {
	f       *os.File
	max     int64
	n       int64
	dropped int64
	err     error
}

func (c *cappedFile) write(p []byte) {
	if c.err != nil || c.n >= c.max {
		c.dropped += int64(len(p))
		return
	}
	q := p
	if room := c.max - c.n; int64(len(q)) > room {
		q = q[:room]
	}
	w, err := c.f.Write(q)
	c.n += int64(w)
	c.dropped += int64(len(p) - w)
	c.err = err
}

// close notes dropped output at the end of the log (so a reader sees it
// was cut) and closes the file; safe to call twice.
func (c *cappedFile) close() {
	if c.f == nil {
		return
	}
	if c.dropped > 0 {
		fmt.Fprintf(c.f, "\n[space: %d more bytes of output were not kept]\n", c.dropped)
	}
	c.f.Close()
	c.f = nil
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.total += int64(len(p))
	if b.log != nil {
		b.log.write(p)
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	total := b.total
	b.mu.Unlock()
	if b.onWrite != nil {
		b.onWrite(total)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.ToValidUTF8(string(b.buf), "�")
}
