// Package template builds and caches sandbox templates: immutable,
// content-addressed root filesystems plus defaults.
//
// Layout under the manager's directory:
//
//	rootfs/<digest-hex>/       final tree, owned by the shifted uid range, never written again;
//	                           also build-file layers (build.go), whose files may be hard
//	                           links shared with their parent layer's
//	rootfs/<digest-hex>.json   build metadata (size, file count); recomputed if missing
//	names/<name>.json          name → digest + defaults
//	tmp/<random>/              staging; anything here after a crash is removed by NewManager
//
// A rootfs becomes visible only through one rename from tmp/ into rootfs/, so
// a reader never sees a half-built tree.
package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Sentinel errors; callers match with errors.Is.
var (
	ErrNotFound       = errors.New("template: not found")
	ErrInvalid        = errors.New("template: invalid request")
	ErrUnsafeInput    = errors.New("template: unsafe input")
	ErrLimit          = errors.New("template: input exceeds limits")
	ErrLocked         = errors.New("template: directory in use by another manager")
	ErrUnknownBuiltin = errors.New("template: unknown builtin")
	ErrUnsupported    = errors.New("template: not supported on this host")
)

// Sources.
const (
	SourceBusybox = "busybox"
	SourceDebian  = "debian"
	SourceDir     = "dir"
	SourceTar     = "tar"
)

// Builtin template names.
const (
	BuiltinMinimal = "minimal"
	BuiltinBase    = "base"
)

const (
	defaultUIDBase    = 100000
	defaultUIDCount   = 65536
	defaultMaxBytes   = 8 << 30
	defaultMaxEntries = 1 << 20
	defaultSuite      = "bookworm"
	defaultMirror     = "http://deb.debian.org/debian"
	defaultPath       = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// builderVersion is part of every digest: bump it when the produced
	// tree changes for the same inputs, so stale caches are not reused.
	builderVersion = 1
)

// Defaults are applied to processes started in a sandbox of the template.
type Defaults struct {
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	User string            `json:"user,omitempty"`
	// Cmd is the start command (an image's entrypoint followed by its cmd).
	Cmd []string `json:"cmd,omitempty"`
	// Ready is the ready check of a build file's READY (run by the
	// server's pre-warm after a build whose file has START).
	Ready []string `json:"ready,omitempty"`
}

// Template is a named, built root filesystem.
type Template struct {
	Name      string
	Digest    string // "sha256:<hex>" of the build recipe and its inputs
	RootfsDir string // read-only; owned by the shifted uid range
	Defaults  Defaults
	SizeBytes int64     // disk usage (allocated blocks, hardlinks counted once)
	Files     int       // entries in the tree, directories included
	CreatedAt time.Time // when the name was (last) pointed at this digest
	Source    string    // SourceBusybox, SourceDebian, SourceDir or SourceTar
	// Warm is the pre-warmed snapshot of this name's tree (a build file
	// with START), nil when there is none.
	Warm *Warm
}

// Warm records a template's pre-warmed snapshot: a sandbox of the template
// ran the start command until the ready check passed, then was
// snapshotted through the normal snapshot path. Sandboxes of the template
// start from it.
type Warm struct {
	Snapshot  string    `json:"snapshot"`  // snapshot id in the server's store
	Kind      string    `json:"kind"`      // "process" or "filesystem"
	Processes string    `json:"processes"` // what a create does about the start command
	CreatedAt time.Time `json:"created_at"`
}

// Progress is called during builds with a stage name ("hash", "busybox",
// "debian", "copy", "extract", "customize", "shift", "commit", "cached"),
// counters (total 0 when unknown) and a short message. It runs on the build
// goroutine, so it must be cheap and must not block.
type Progress func(stage string, done, total int64, msg string)

// BuildRequest describes a template to build.
type BuildRequest struct {
	Name     string
	Source   string   // SourceBusybox, SourceDebian, SourceDir or SourceTar
	Path     string   // host path of the directory or tarball (dir, tar, archive); callers must restrict who may name host paths
	Image    string   // registry reference, e.g. "docker.io/library/alpine:3.20" or "host:5000/app@sha256:…" (image)
	Packages []string // extra Debian packages (debian)
	Files    []File   // files added on top of the packages (debian)
	// NoRecommends leaves out the packages' Recommends (debian): a
	// smaller tree that builds faster.
	NoRecommends bool
	Suite        string // Debian suite (debian); default "bookworm"
	Defaults     Defaults
}

// Options configure a Manager. Zero values pick the defaults.
type Options struct {
	UIDBase  uint32 // host uid of uid 0 inside the sandbox; default 100000
	UIDCount uint32 // size of the mapped range; default 65536
	Logf     func(format string, args ...any)
	// Mirror is the Debian mirror for mmdebstrap; default: the first Debian
	// mirror in the host's apt sources, else deb.debian.org.
	Mirror         string
	MmdebstrapPath string // default: "mmdebstrap" from PATH
	BusyboxPath    string // default: /bin/busybox
	MaxBytes       int64  // bound on file data of dir/tar inputs; default 8 GiB
	MaxEntries     int    // bound on entries of dir/tar inputs; default 1<<20
	// DockerConfig is the docker config.json with registry credentials
	// ("auths"); default $DOCKER_CONFIG/config.json, else ~/.docker/config.json.
	DockerConfig string
	// AllowPrivateRegistries lets image pulls dial loopback, private and
	// link-local addresses (off: API users cannot probe internal hosts).
	AllowPrivateRegistries bool
	// NoSync skips syncfs before a rootfs is committed. Only for tests: a
	// power loss could then leave a committed but incomplete tree.
	NoSync bool
}

// Manager builds templates and resolves names. It holds a shared lock on its
// directory until Close; deleting (tmp/ cleanup, GC) needs the lock alone.
type Manager struct {
	dir      string
	opts     Options
	lockFile *os.File

	mu       sync.Mutex // guards inflight, name/rootfs commits, GC and mmdeb
	inflight map[string]*flight
	mmdeb    map[string]string // mmdebstrap path → version output
	// pins counts builds using a tree (a build file's base and step
	// layers, which no name refers to yet), so GC leaves it alone.
	pins map[string]int
	// builtins are the builtin templates this manager ensured
	// (EnsureBuiltin), by name: Get answers them whatever the name's file
	// says now. Servers of different versions sharing one directory (test
	// servers of several checkouts, a rolling upgrade) each point the
	// builtin names at their own build when they start; without this the
	// last one to start decided, for all of them, which tree (which
	// code-interpreter server) new sandboxes got.
	builtins map[string]Template
}

type flight struct {
	done chan struct{}
	err  error
}

// NewManager opens (creating if needed) a template directory and removes
// leftovers of interrupted builds.
func NewManager(dir string, opts Options) (*Manager, error) {
	if opts.UIDBase == 0 {
		opts.UIDBase = defaultUIDBase
	}
	if opts.UIDCount == 0 {
		opts.UIDCount = defaultUIDCount
	}
	if uint64(opts.UIDBase)+uint64(opts.UIDCount) > 1<<32-1 {
		return nil, fmt.Errorf("%w: uid range %d+%d overflows", ErrInvalid, opts.UIDBase, opts.UIDCount)
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.BusyboxPath == "" {
		opts.BusyboxPath = "/bin/busybox"
	}
	if opts.MmdebstrapPath == "" {
		opts.MmdebstrapPath = "mmdebstrap"
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = defaultMaxBytes
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = defaultMaxEntries
	}
	if opts.Mirror == "" {
		opts.Mirror = hostMirror()
	}
	if err := validateMirror(opts.Mirror); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("template: resolve %q: %w", dir, err)
	}
	m := &Manager{dir: abs, opts: opts, inflight: map[string]*flight{}, mmdeb: map[string]string{}, pins: map[string]int{}, builtins: map[string]Template{}}
	// 0711 on the path to rootfs/ lets the sandbox's (shifted) root traverse
	// it to mount the overlay without being able to list other templates.
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{abs, 0o711}, {m.rootfsRoot(), 0o711}, {m.namesDir(), 0o700}, {m.tmpDir(), 0o700}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("template: create %s: %w", d.path, err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("template: chmod %s: %w", d.path, err)
		}
	}
	lf, err := os.OpenFile(filepath.Join(abs, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("template: open lock: %w", err)
	}
	// Several managers (servers, tests, the CLI) may share a directory:
	// builds stage in private temp dirs and commit with an atomic rename, so
	// they only hold a shared lock. Leftovers of crashed builds are cleaned
	// only when no other manager holds the directory, since their tmp/ may
	// be in use.
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		if err := m.cleanTmp(); err != nil {
			lf.Close()
			return nil, err
		}
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		lf.Close()
		return nil, fmt.Errorf("template: lock %s: %w", abs, err)
	}
	// Another manager may hold the lock alone for a moment (cleanup, GC);
	// wait a bounded time rather than forever.
	for i := 0; ; i++ {
		err := syscall.Flock(int(lf.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || i == 200 {
			lf.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: %s", ErrLocked, abs)
			}
			return nil, fmt.Errorf("template: lock %s: %w", abs, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	m.lockFile = lf
	return m, nil
}

// Close releases the directory lock. Builds in progress must have returned.
func (m *Manager) Close() error {
	if m.lockFile == nil {
		return nil
	}
	err := m.lockFile.Close() // closing drops the flock
	m.lockFile = nil
	return err
}

func (m *Manager) rootfsRoot() string           { return filepath.Join(m.dir, "rootfs") }
func (m *Manager) namesDir() string             { return filepath.Join(m.dir, "names") }
func (m *Manager) tmpDir() string               { return filepath.Join(m.dir, "tmp") }
func (m *Manager) rootfsPath(hex string) string { return filepath.Join(m.rootfsRoot(), hex) }
func (m *Manager) metaPath(hex string) string   { return filepath.Join(m.rootfsRoot(), hex+".json") }
func (m *Manager) namePath(name string) string  { return filepath.Join(m.namesDir(), name+".json") }

func (m *Manager) cleanTmp() error {
	ents, err := os.ReadDir(m.tmpDir())
	if err != nil {
		return fmt.Errorf("template: read tmp: %w", err)
	}
	for _, e := range ents {
		p := filepath.Join(m.tmpDir(), e.Name())
		m.opts.Logf("template: removing leftover %s", p)
		if err := removeTree(p); err != nil {
			return fmt.Errorf("template: clean leftover %s: %w", p, err)
		}
	}
	// Half-written name records (see writeJSONAtomic).
	names, err := os.ReadDir(m.namesDir())
	if err != nil {
		return fmt.Errorf("template: read names: %w", err)
	}
	for _, e := range names {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			os.Remove(filepath.Join(m.namesDir(), e.Name()))
		}
	}
	return nil
}

// A name may carry a tag ("py:3.12"); name and tag are one opaque key. A
// "~scope~" prefix puts the name in one project's scope (the server's
// template refs); the manager treats the whole ref as the key.
var nameRE = regexp.MustCompile(`^(~[a-z0-9_-]{1,64}~)?[A-Za-z0-9][A-Za-z0-9._-]{0,127}(:[A-Za-z0-9][A-Za-z0-9._-]{0,63})?$`)

func validateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: name %q (want [A-Za-z0-9][A-Za-z0-9._-]{0,127} and an optional :tag)", ErrInvalid, name)
	}
	return nil
}

func (d Defaults) validate() error {
	if d.Cwd != "" && (!filepath.IsAbs(d.Cwd) || strings.ContainsRune(d.Cwd, 0)) {
		return fmt.Errorf("%w: cwd %q must be an absolute path", ErrInvalid, d.Cwd)
	}
	if strings.ContainsAny(d.User, "\x00:\n") {
		return fmt.Errorf("%w: user %q", ErrInvalid, d.User)
	}
	for k, v := range d.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%w: env %q", ErrInvalid, k)
		}
	}
	return nil
}

// nameRecord is the on-disk form of names/<name>.json.
type nameRecord struct {
	Name      string    `json:"name"`
	Digest    string    `json:"digest"`
	Source    string    `json:"source"`
	Defaults  Defaults  `json:"defaults"`
	SizeBytes int64     `json:"size_bytes"`
	Files     int       `json:"files"`
	CreatedAt time.Time `json:"created_at"`
	Warm      *Warm     `json:"warm,omitempty"`
}

// rootfsMeta is the on-disk form of rootfs/<hex>.json.
type rootfsMeta struct {
	Digest       string          `json:"digest"`
	Source       string          `json:"source"`
	SizeBytes    int64           `json:"size_bytes"`
	Files        int             `json:"files"`
	BuiltAt      time.Time       `json:"built_at"`
	BuildSeconds float64         `json:"build_seconds"`
	Recipe       json.RawMessage `json:"recipe"`
}

func (m *Manager) toTemplate(r nameRecord) Template {
	return Template{
		Name:      r.Name,
		Digest:    r.Digest,
		RootfsDir: m.rootfsPath(strings.TrimPrefix(r.Digest, "sha256:")),
		Defaults:  r.Defaults,
		SizeBytes: r.SizeBytes,
		Files:     r.Files,
		CreatedAt: r.CreatedAt,
		Source:    r.Source,
		Warm:      r.Warm,
	}
}

func (m *Manager) readName(name string) (nameRecord, error) {
	var r nameRecord
	b, err := os.ReadFile(m.namePath(name))
	if errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return r, fmt.Errorf("template: read %q: %w", name, err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("template: decode %q: %w", name, err)
	}
	if !digestRE.MatchString(r.Digest) || r.Name != name {
		return r, fmt.Errorf("template: corrupt record for %q", name)
	}
	return r, nil
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Get returns the named template, or ErrNotFound if the name is unknown or
// its rootfs is gone.
func (m *Manager) Get(name string) (Template, error) {
	if err := validateName(name); err != nil {
		return Template{}, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	r, err := m.readName(name)
	m.mu.Lock()
	b, pinned := m.builtins[name]
	m.mu.Unlock()
	var t Template
	switch {
	case pinned && (err != nil || r.Digest != b.Digest):
		t = b // another manager re-pointed (or removed) the name
	case err != nil:
		return Template{}, err
	default:
		t = m.toTemplate(r)
	}
	if _, err := os.Lstat(t.RootfsDir); err != nil {
		return Template{}, fmt.Errorf("%w: %q: rootfs %s missing", ErrNotFound, name, t.Digest)
	}
	return t, nil
}

// List returns all named templates sorted by name. Records that cannot be
// read are skipped and logged, so one bad file does not hide the others.
func (m *Manager) List() ([]Template, error) {
	ents, err := os.ReadDir(m.namesDir())
	if err != nil {
		return nil, fmt.Errorf("template: list: %w", err)
	}
	var out []Template
	for _, e := range ents {
		n, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || validateName(n) != nil {
			continue
		}
		t, err := m.Get(n)
		if err != nil {
			m.opts.Logf("template: list: skipping %q: %v", n, err)
			continue
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove deletes the name. The rootfs stays until GC, since running
// sandboxes may still use it.
func (m *Manager) Remove(name string) error {
	if err := validateName(name); err != nil {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.builtins, name)
	if err := os.Remove(m.namePath(name)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		return fmt.Errorf("template: remove %q: %w", name, err)
	}
	return nil
}

// SetWarm records w (nil: none) as name's pre-warmed snapshot, provided
// name still points at digest (a rebuild meanwhile wins).
func (m *Manager) SetWarm(name, digest string, w *Warm) (Template, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.readName(name)
	if err != nil {
		return Template{}, err
	}
	if r.Digest != digest {
		return Template{}, fmt.Errorf("%w: template %q was re-pointed while it was pre-warmed", ErrLocked, name)
	}
	r.Warm = w
	if err := writeJSONAtomic(m.namesDir(), name+".json", r, !m.opts.NoSync); err != nil {
		return Template{}, err
	}
	return m.toTemplate(r), nil
}

// RestoreName puts name back as prev (nil: removes it), undoing a build
// whose later stage (pre-warm) failed.
func (m *Manager) RestoreName(name string, prev *Template) error {
	if err := validateName(name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.builtins, name)
	if prev == nil {
		if err := os.Remove(m.namePath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("template: remove %q: %w", name, err)
		}
		return nil
	}
	r := nameRecord{Name: name, Digest: prev.Digest, Source: prev.Source, Defaults: prev.Defaults,
		SizeBytes: prev.SizeBytes, Files: prev.Files, CreatedAt: prev.CreatedAt, Warm: prev.Warm}
	return writeJSONAtomic(m.namesDir(), name+".json", r, !m.opts.NoSync)
}

// GC deletes rootfs trees that no name refers to and for which keep (may be
// nil) returns false; keep lets the caller protect digests that running
// sandboxes still use. It returns the digests removed.
func (m *Manager) GC(ctx context.Context, keep func(digest string) bool) ([]string, error) {
	// Another manager may be about to name a tree GC would see as unused.
	if err := syscall.Flock(int(m.lockFile.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return nil, fmt.Errorf("%w: %s (GC needs it alone)", ErrLocked, m.dir)
	}
	defer syscall.Flock(int(m.lockFile.Fd()), syscall.LOCK_SH)
	m.mu.Lock()
	used := map[string]bool{}
	names, err := os.ReadDir(m.namesDir())
	if err != nil {
		m.mu.Unlock()
		return nil, fmt.Errorf("template: gc: %w", err)
	}
	for _, e := range names {
		n, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || validateName(n) != nil {
			continue
		}
		r, err := m.readName(n)
		if err != nil {
			// An unreadable record might still matter: keep everything.
			m.mu.Unlock()
			return nil, fmt.Errorf("template: gc: %w", err)
		}
		used[r.Digest] = true
	}
	for _, b := range m.builtins {
		used[b.Digest] = true
	}
	ents, err := os.ReadDir(m.rootfsRoot())
	if err != nil {
		m.mu.Unlock()
		return nil, fmt.Errorf("template: gc: %w", err)
	}
	var removed, doomed []string
	for _, e := range ents {
		hex, isMeta := strings.CutSuffix(e.Name(), ".json")
		d := "sha256:" + hex
		if !digestRE.MatchString(d) {
			continue
		}
		if isMeta {
			if _, err := os.Lstat(m.rootfsPath(hex)); errors.Is(err, os.ErrNotExist) {
				os.Remove(m.metaPath(hex))
			}
			continue
		}
		if used[d] || m.inflight[d] != nil || m.pins[d] > 0 || (keep != nil && keep(d)) {
			continue
		}
		// Move out of rootfs/ first so the tree vanishes atomically; the slow
		// delete happens outside the lock and a crash leaves it in tmp/.
		dst, err := os.MkdirTemp(m.tmpDir(), "gc-")
		if err != nil {
			m.mu.Unlock()
			return removed, fmt.Errorf("template: gc: %w", err)
		}
		if err := os.Rename(m.rootfsPath(hex), filepath.Join(dst, "rootfs")); err != nil {
			os.Remove(dst)
			m.mu.Unlock()
			return removed, fmt.Errorf("template: gc %s: %w", d, err)
		}
		os.Remove(m.metaPath(hex))
		removed = append(removed, d)
		doomed = append(doomed, dst)
	}
	m.mu.Unlock()
	for _, p := range doomed {
		if err := ctx.Err(); err != nil {
			return removed, err // the rest is cleaned by the next NewManager
		}
		if err := removeTree(p); err != nil {
			return removed, fmt.Errorf("template: gc: %w", err)
		}
	}
	return removed, nil
}

// EnsureBuiltin returns the builtin template "minimal" (busybox), "base"
// (Debian minbase + python3) or "code-interpreter-v1" (interpreter.go),
// building it only if its digest is not cached.
func (m *Manager) EnsureBuiltin(ctx context.Context, name string, p Progress) (Template, error) {
	req, err := builtinRequest(name)
	if err != nil {
		return Template{}, err
	}
	t, err := m.Build(ctx, req, p)
	if err != nil {
		return t, err
	}
	m.mu.Lock()
	m.builtins[name] = t
	m.mu.Unlock()
	return t, nil
}

func builtinRequest(name string) (BuildRequest, error) {
	switch name {
	case BuiltinMinimal:
		return BuildRequest{
			Name:   BuiltinMinimal,
			Source: SourceBusybox,
			Defaults: Defaults{
				Env:  map[string]string{"PATH": defaultPath},
				Cwd:  "/home/user",
				User: "user",
			},
		}, nil
	case BuiltinCodeInterpreter:
		return interpreterRequest()
	case BuiltinBase:
		return BuildRequest{
			Name:     BuiltinBase,
			Source:   SourceDebian,
			Suite:    defaultSuite,
			Packages: []string{"python3", "ca-certificates"},
			Defaults: Defaults{
				Env:  map[string]string{"PATH": defaultPath, "LANG": "C.UTF-8"},
				Cwd:  "/home/user",
				User: "user",
			},
		}, nil
	}
	return BuildRequest{}, fmt.Errorf("%w: %q", ErrUnknownBuiltin, name)
}

// Build builds (or reuses, when the digest is cached) the rootfs for req and
// points req.Name at it. Concurrent builds of the same digest run once.
func (m *Manager) Build(ctx context.Context, req BuildRequest, p Progress) (Template, error) {
	if p == nil {
		p = func(string, int64, int64, string) {}
	}
	if err := validateName(req.Name); err != nil {
		return Template{}, err
	}
	if err := req.Defaults.validate(); err != nil {
		return Template{}, err
	}
	// A build of the name here replaces this manager's builtin of it
	// (EnsureBuiltin pins its own build again when this returns).
	m.mu.Lock()
	delete(m.builtins, req.Name)
	m.mu.Unlock()
	pl, err := m.plan(ctx, req, p)
	if err != nil {
		return Template{}, err
	}
	defer pl.close()
	if pl.defaults != nil {
		req.Defaults = mergeDefaults(*pl.defaults, req.Defaults)
		if err := req.Defaults.validate(); err != nil {
			return Template{}, err
		}
	}
	built := false
	for {
		if t, ok, err := m.commitName(req, pl); err != nil || ok {
			if ok && !built {
				p("cached", 1, 1, pl.digest)
			}
			return t, err
		}
		m.mu.Lock()
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
				return Template{}, ctx.Err()
			}
			// A leader that was merely cancelled says nothing about our
			// build: retry (and maybe lead). Real failures are shared.
			if f.err != nil && !errors.Is(f.err, context.Canceled) && !errors.Is(f.err, context.DeadlineExceeded) {
				return Template{}, f.err
			}
			if err := ctx.Err(); err != nil {
				return Template{}, err
			}
			continue
		}
		err := m.buildRootfs(ctx, pl, p)
		m.mu.Lock()
		delete(m.inflight, pl.digest)
		f.err = err
		close(f.done)
		m.mu.Unlock()
		if err != nil {
			return Template{}, err
		}
		built = true
	}
}

// commitName points req.Name at pl's rootfs if that rootfs exists. Done under
// m.mu so GC cannot delete the tree between the check and the name write.
func (m *Manager) commitName(req BuildRequest, pl *plan) (Template, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := os.Lstat(m.rootfsPath(pl.hex)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Template{}, false, nil
		}
		return Template{}, false, fmt.Errorf("template: stat rootfs: %w", err)
	}
	meta, err := m.loadMeta(pl)
	if err != nil {
		return Template{}, false, err
	}
	if old, err := m.readName(req.Name); err == nil && old.Digest == pl.digest &&
		old.Source == req.Source && defaultsEqual(old.Defaults, req.Defaults) {
		return m.toTemplate(old), true, nil // unchanged: keep CreatedAt
	}
	r := nameRecord{
		Name:      req.Name,
		Digest:    pl.digest,
		Source:    req.Source,
		Defaults:  req.Defaults,
		SizeBytes: meta.SizeBytes,
		Files:     meta.Files,
		CreatedAt: time.Now().UTC(),
	}
	if err := writeJSONAtomic(m.namesDir(), req.Name+".json", r, !m.opts.NoSync); err != nil {
		return Template{}, false, err
	}
	return m.toTemplate(r), true, nil
}

func defaultsEqual(a, b Defaults) bool {
	if a.Cwd != b.Cwd || a.User != b.User || len(a.Env) != len(b.Env) || !slices.Equal(a.Cmd, b.Cmd) || !slices.Equal(a.Ready, b.Ready) {
		return false
	}
	for k, v := range a.Env {
		if bv, ok := b.Env[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// loadMeta reads rootfs/<hex>.json, recomputing it when a crash after the
// commit rename lost it.
func (m *Manager) loadMeta(pl *plan) (rootfsMeta, error) {
	var meta rootfsMeta
	b, err := os.ReadFile(m.metaPath(pl.hex))
	if err == nil && json.Unmarshal(b, &meta) == nil && meta.Digest == pl.digest {
		return meta, nil
	}
	st, err := treeStats(m.rootfsPath(pl.hex))
	if err != nil {
		return meta, fmt.Errorf("template: stats of %s: %w", pl.digest, err)
	}
	meta = rootfsMeta{Digest: pl.digest, Source: pl.source, SizeBytes: st.size, Files: st.files, BuiltAt: time.Now().UTC(), Recipe: pl.recipe}
	if err := writeJSONAtomic(m.rootfsRoot(), pl.hex+".json", meta, !m.opts.NoSync); err != nil {
		return meta, err
	}
	return meta, nil
}

// stageRoot makes a staging directory under tmpDir with an empty rootfs
// directory in it (0755 whatever the umask). cleanup removes the staging
// directory and reports a failure to do so through *err when nothing
// failed before.
func (m *Manager) stageRoot(prefix string) (root string, cleanup func(*error), err error) {
	stage, err := os.MkdirTemp(m.tmpDir(), prefix)
	if err != nil {
		return "", nil, fmt.Errorf("template: staging: %w", err)
	}
	cleanup = func(errp *error) {
		if rerr := removeTree(stage); rerr != nil {
			m.opts.Logf("template: cleanup %s: %v", stage, rerr)
			if *errp == nil {
				*errp = fmt.Errorf("template: cleanup staging: %w", rerr)
			}
		}
	}
	root = filepath.Join(stage, "rootfs")
	err = os.Mkdir(root, 0o755)
	if err == nil {
		err = os.Chmod(root, 0o755)
	}
	if err != nil {
		var none error
		cleanup(&none)
		return "", nil, fmt.Errorf("template: staging: %w", err)
	}
	return root, cleanup, nil
}

// buildRootfs stages, shifts and commits one rootfs.
func (m *Manager) buildRootfs(ctx context.Context, pl *plan, p Progress) (err error) {
	start := time.Now()
	root, cleanup, err := m.stageRoot("build-")
	if err != nil {
		return err
	}
	defer cleanup(&err)
	if err := pl.build(ctx, root, p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	st, err := shiftTree(ctx, root, m.opts.UIDBase, m.opts.UIDCount, p, m.opts.Logf)
	if err != nil {
		return err
	}
	p("commit", 0, 1, pl.digest)
	if !m.opts.NoSync {
		if err := syncFS(root); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	final := m.rootfsPath(pl.hex)
	if err := os.Rename(root, final); err != nil {
		if !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.ENOTEMPTY) {
			return fmt.Errorf("template: commit %s: %w", pl.digest, err)
		}
		// Already committed (only possible after a crash between rename and
		// metadata write in an earlier run); the existing tree wins.
	}
	if !m.opts.NoSync {
		syncDir(m.rootfsRoot())
	}
	meta := rootfsMeta{
		Digest: pl.digest, Source: pl.source, SizeBytes: st.size, Files: st.files,
		BuiltAt: time.Now().UTC(), BuildSeconds: time.Since(start).Seconds(), Recipe: pl.recipe,
	}
	if err := writeJSONAtomic(m.rootfsRoot(), pl.hex+".json", meta, !m.opts.NoSync); err != nil {
		return err
	}
	p("commit", 1, 1, pl.digest)
	m.opts.Logf("template: built %s (%s) in %s: %d files, %d bytes", pl.digest, pl.source, time.Since(start).Round(time.Millisecond), st.files, st.size)
	return nil
}

// writeJSONAtomic writes v to dir/name via a temp file and rename.
func writeJSONAtomic(dir, name string, v any, sync bool) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("template: encode %s: %w", name, err)
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("template: write %s: %w", name, err)
	}
	tmp := f.Name()
	_, werr := f.Write(append(b, '\n'))
	if werr == nil && sync {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp, 0o644)
	}
	if werr == nil {
		werr = os.Rename(tmp, filepath.Join(dir, name))
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("template: write %s: %w", name, werr)
	}
	if sync {
		syncDir(dir)
	}
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// syncFS flushes the filesystem holding path, so a committed rootfs is never
// missing data after a power loss.
func syncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("template: syncfs: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("template: syncfs: %w", err)
	}
	return nil
}
