package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const testBase = 100000

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: builds chown files to the shifted uid range")
	}
}

func newTestManager(t *testing.T, opts Options) *Manager {
	t.Helper()
	requireRoot(t)
	if opts.UIDBase == 0 {
		opts.UIDBase = testBase
	}
	opts.NoSync = true
	opts.Logf = t.Logf
	if _, err := os.Stat("/bin/busybox"); err != nil && opts.BusyboxPath == "" {
		t.Skip("needs /bin/busybox (busybox-static)")
	}
	m, err := NewManager(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

type progressLog struct {
	mu     sync.Mutex
	stages map[string]int
}

func (l *progressLog) fn(stage string, done, total int64, msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stages == nil {
		l.stages = map[string]int{}
	}
	l.stages[stage]++
}

func (l *progressLog) count(stage string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stages[stage]
}

func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func assertOwner(t *testing.T, p string, uid, gid uint32) {
	t.Helper()
	st := lstat(t, p)
	if st.Uid != uid || st.Gid != gid {
		t.Errorf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
	}
}

func assertEmptyDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("%s not empty: %v", dir, names)
	}
}

func TestMinimalBuild(t *testing.T) {
	m := newTestManager(t, Options{})
	m.opts.NoSync = false // measure the real thing once
	ctx := context.Background()
	var pl progressLog
	start := time.Now()
	tpl, err := m.EnsureBuiltin(ctx, BuiltinMinimal, pl.fn)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(start)
	t.Logf("minimal: first build %s, %d files, %d bytes, %s", first, tpl.Files, tpl.SizeBytes, tpl.Digest)
	if first > 2*time.Second {
		t.Errorf("minimal build took %s, want well under a second", first)
	}
	if !digestRE.MatchString(tpl.Digest) || tpl.Source != SourceBusybox || tpl.Name != BuiltinMinimal {
		t.Errorf("bad template %+v", tpl)
	}
	if tpl.RootfsDir != filepath.Join(m.dir, "rootfs", strings.TrimPrefix(tpl.Digest, "sha256:")) {
		t.Errorf("rootfs dir %s", tpl.RootfsDir)
	}
	if pl.count("busybox") == 0 || pl.count("shift") == 0 || pl.count("commit") == 0 || pl.count("cached") != 0 {
		t.Errorf("progress stages: %v", pl.stages)
	}
	r := tpl.RootfsDir
	for _, p := range []string{".", "bin", "bin/busybox", "bin/sh", "usr/bin/awk", "etc/passwd", "tmp", "proc", "dev"} {
		assertOwner(t, filepath.Join(r, p), testBase, testBase)
	}
	assertOwner(t, filepath.Join(r, "home/user"), testBase+1000, testBase+1000)
	if target, err := os.Readlink(filepath.Join(r, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh -> %q, %v", target, err)
	}
	if target, err := os.Readlink(filepath.Join(r, "usr/bin/awk")); err != nil || target != "../../bin/busybox" {
		t.Errorf("usr/bin/awk -> %q, %v", target, err)
	}
	if st := lstat(t, filepath.Join(r, "tmp")); st.Mode&0o7777 != 0o1777 {
		t.Errorf("tmp mode %o", st.Mode&0o7777)
	}
	passwd, _ := os.ReadFile(filepath.Join(r, "etc/passwd"))
	for _, want := range []string{"root:x:0:0:root:/root:/bin/sh", "user:x:1000:1000:user:/home/user:", "nobody:x:65534:65534:"} {
		if !strings.Contains(string(passwd), want) {
			t.Errorf("passwd lacks %q:\n%s", want, passwd)
		}
	}
	if tpl.Defaults.Env["PATH"] == "" {
		t.Errorf("no default PATH: %+v", tpl.Defaults)
	}
	// The applets work inside the tree.
	if out, err := exec.Command("chroot", r, "/bin/sh", "-c", "ls /bin/ls && echo hi | tr a-z A-Z").CombinedOutput(); err != nil || !strings.Contains(string(out), "HI") {
		t.Errorf("chroot sh: %v: %s", err, out)
	}

	// Second build: cache hit, same record, nothing rebuilt.
	var pl2 progressLog
	start = time.Now()
	tpl2, err := m.EnsureBuiltin(ctx, BuiltinMinimal, pl2.fn)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("minimal: cached build %s", time.Since(start))
	if tpl2.Digest != tpl.Digest || !tpl2.CreatedAt.Equal(tpl.CreatedAt) {
		t.Errorf("cache hit changed the template: %+v vs %+v", tpl2, tpl)
	}
	if pl2.count("busybox") != 0 || pl2.count("shift") != 0 || pl2.count("cached") != 1 {
		t.Errorf("cache hit rebuilt: %v", pl2.stages)
	}
	assertEmptyDir(t, m.tmpDir())

	got, err := m.Get(BuiltinMinimal)
	if err != nil || got.Digest != tpl.Digest {
		t.Errorf("Get: %+v, %v", got, err)
	}
	list, err := m.List()
	if err != nil || len(list) != 1 || list[0].Name != BuiltinMinimal {
		t.Errorf("List: %+v, %v", list, err)
	}
}

func TestDigestDependsOnUIDBase(t *testing.T) {
	a := newTestManager(t, Options{})
	b := newTestManager(t, Options{UIDBase: 200000})
	ta, err := a.EnsureBuiltin(context.Background(), BuiltinMinimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := b.EnsureBuiltin(context.Background(), BuiltinMinimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ta.Digest == tb.Digest {
		t.Error("different uid bases produced the same digest")
	}
	assertOwner(t, filepath.Join(tb.RootfsDir, "bin/busybox"), 200000, 200000)
}

func TestSingleFlight(t *testing.T) {
	m := newTestManager(t, Options{})
	const n = 8
	var wg sync.WaitGroup
	logs := make([]progressLog, n)
	tpls := make([]Template, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tpls[i], errs[i] = m.Build(context.Background(), BuildRequest{
				Name: "mini-" + string(rune('a'+i)), Source: SourceBusybox,
			}, logs[i].fn)
		}()
	}
	wg.Wait()
	builders := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("build %d: %v", i, errs[i])
		}
		if tpls[i].Digest != tpls[0].Digest {
			t.Errorf("digests differ: %s vs %s", tpls[i].Digest, tpls[0].Digest)
		}
		if logs[i].count("busybox") > 0 {
			builders++
		}
	}
	if builders != 1 {
		t.Errorf("%d builds ran, want 1", builders)
	}
	ents, _ := os.ReadDir(m.rootfsRoot())
	dirs := 0
	for _, e := range ents {
		if e.IsDir() {
			dirs++
		}
	}
	if dirs != 1 {
		t.Errorf("%d rootfs dirs, want 1", dirs)
	}
	list, _ := m.List()
	if len(list) != n {
		t.Errorf("%d names, want %d", len(list), n)
	}
	assertEmptyDir(t, m.tmpDir())
}

func TestSingleFlightCancelledLeader(t *testing.T) {
	m := newTestManager(t, Options{})
	// A waiter must not inherit its leader's cancellation.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Build(ctx, BuildRequest{Name: "x", Source: SourceBusybox}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled build: %v", err)
	}
	assertEmptyDir(t, m.tmpDir())
	if _, err := m.Build(context.Background(), BuildRequest{Name: "x", Source: SourceBusybox}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestCrashLeftoversCleaned(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	m, err := NewManager(dir, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	// A second manager shares the directory but must not clean tmp/ (a
	// build of the first may be staged there), nor run GC.
	os.MkdirAll(filepath.Join(dir, "tmp", "build-live"), 0o700)
	m2, err := NewManager(dir, Options{NoSync: true})
	if err != nil {
		t.Fatalf("second manager on the same dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tmp", "build-live")); err != nil {
		t.Fatalf("second manager removed a live staging dir: %v", err)
	}
	if _, err := m2.GC(context.Background(), nil); !errors.Is(err, ErrLocked) {
		t.Errorf("GC while another manager holds the dir: %v, want ErrLocked", err)
	}
	m2.Close()
	tpl, err := m.EnsureBuiltin(context.Background(), BuiltinMinimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()

	// Simulate a build killed mid-way: a partial tree with a read-only dir,
	// a half-written name record, and a leaked bind mount of a directory
	// that must survive the cleanup.
	stage := filepath.Join(dir, "tmp", "build-123")
	os.MkdirAll(filepath.Join(stage, "rootfs/usr/lib/ro"), 0o755)
	os.WriteFile(filepath.Join(stage, "rootfs/usr/lib/ro/f"), []byte("x"), 0o644)
	os.Chmod(filepath.Join(stage, "rootfs/usr/lib/ro"), 0o500)
	os.WriteFile(filepath.Join(dir, "names", ".tmp-99"), []byte("{"), 0o644)
	precious := t.TempDir()
	os.WriteFile(filepath.Join(precious, "keep"), []byte("keep"), 0o644)
	mnt := filepath.Join(stage, "rootfs/dev")
	os.MkdirAll(mnt, 0o755)
	mounted := syscall.Mount(precious, mnt, "", syscall.MS_BIND, "") == nil
	if !mounted {
		t.Log("bind mount not permitted here; skipping the leaked-mount part")
	}

	m2, err = NewManager(dir, Options{NoSync: true})
	if err != nil {
		if mounted {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
		t.Fatal(err)
	}
	defer m2.Close()
	assertEmptyDir(t, filepath.Join(dir, "tmp"))
	if _, err := os.Stat(filepath.Join(dir, "names", ".tmp-99")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale name temp file survived: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(precious, "keep")); err != nil || string(b) != "keep" {
		t.Errorf("cleanup recursed into a mount: %q, %v", b, err)
	}
	if got, err := m2.Get(BuiltinMinimal); err != nil || got.Digest != tpl.Digest {
		t.Errorf("committed template lost: %+v, %v", got, err)
	}
}

func TestMissingMetaRecomputed(t *testing.T) {
	m := newTestManager(t, Options{})
	tpl, err := m.Build(context.Background(), BuildRequest{Name: "a", Source: SourceBusybox}, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(m.metaPath(strings.TrimPrefix(tpl.Digest, "sha256:")))
	tpl2, err := m.Build(context.Background(), BuildRequest{Name: "b", Source: SourceBusybox}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tpl2.Files != tpl.Files || tpl2.SizeBytes != tpl.SizeBytes {
		t.Errorf("recomputed meta %d/%d, want %d/%d", tpl2.Files, tpl2.SizeBytes, tpl.Files, tpl.SizeBytes)
	}
}

func TestRemoveAndGC(t *testing.T) {
	m := newTestManager(t, Options{})
	ctx := context.Background()
	a, err := m.Build(ctx, BuildRequest{Name: "a", Source: SourceBusybox}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Build(ctx, BuildRequest{Name: "b", Source: SourceBusybox, Defaults: Defaults{Cwd: "/tmp"}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: %v", err)
	}
	if _, err := m.Get("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get removed: %v", err)
	}
	if removed, err := m.GC(ctx, nil); err != nil || len(removed) != 0 {
		t.Errorf("GC with b still named: %v, %v", removed, err)
	}
	m.Remove("b")
	if removed, err := m.GC(ctx, func(d string) bool { return d == a.Digest }); err != nil || len(removed) != 0 {
		t.Errorf("GC with keep: %v, %v", removed, err)
	}
	removed, err := m.GC(ctx, nil)
	if err != nil || len(removed) != 1 || removed[0] != a.Digest {
		t.Errorf("GC: %v, %v", removed, err)
	}
	assertEmptyDir(t, m.rootfsRoot())
	assertEmptyDir(t, m.tmpDir())
}

func TestInvalidRequests(t *testing.T) {
	m := newTestManager(t, Options{})
	ctx := context.Background()
	for _, req := range []BuildRequest{
		{Name: "../x", Source: SourceBusybox},
		{Name: "", Source: SourceBusybox},
		{Name: "a/b", Source: SourceBusybox},
		{Name: "ok", Source: "oci"},
		{Name: "ok", Source: SourceBusybox, Path: "/tmp"},
		{Name: "ok", Source: SourceDir},
		{Name: "ok", Source: SourceBusybox, Packages: []string{"vim"}},
		{Name: "ok", Source: SourceDebian, Packages: []string{"--foo"}},
		{Name: "ok", Source: SourceDebian, Packages: []string{"a,b"}},
		{Name: "ok", Source: SourceDebian, Suite: "bookworm main"},
		{Name: "ok", Source: SourceBusybox, Defaults: Defaults{Cwd: "relative"}},
		{Name: "ok", Source: SourceBusybox, Defaults: Defaults{Env: map[string]string{"A=B": "c"}}},
	} {
		if _, err := m.Build(ctx, req, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", req, err)
		}
	}
	if _, err := m.EnsureBuiltin(ctx, "nope", nil); !errors.Is(err, ErrUnknownBuiltin) {
		t.Errorf("unknown builtin: %v", err)
	}
	if _, err := m.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get: %v", err)
	}
	if _, err := m.Get("../../etc/passwd"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get traversal: %v", err)
	}
	assertEmptyDir(t, m.tmpDir())
	assertEmptyDir(t, m.rootfsRoot())
}

// makeSourceTree creates a small rootfs-like directory with the cases a
// copy must preserve.
func makeSourceTree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "usr/bin"), 0o755))
	must(os.MkdirAll(filepath.Join(src, "home/user/.cache"), 0o700))
	must(os.WriteFile(filepath.Join(src, "usr/bin/tool"), []byte("#!/bin/sh\necho tool\n"), 0o755))
	must(syscall.Chmod(filepath.Join(src, "usr/bin/tool"), 0o4755))
	must(os.WriteFile(filepath.Join(src, "home/user/notes"), []byte("hello"), 0o600))
	must(os.Lchown(filepath.Join(src, "home/user"), 1000, 1000))
	must(os.Lchown(filepath.Join(src, "home/user/notes"), 1000, 1000))
	must(os.Link(filepath.Join(src, "usr/bin/tool"), filepath.Join(src, "usr/bin/tool2")))
	must(os.Symlink("/usr/bin/tool", filepath.Join(src, "abs-link")))
	must(os.Symlink("usr", filepath.Join(src, "rel-link")))
	must(syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644))
	must(syscall.Mknod(filepath.Join(src, "null"), syscall.S_IFCHR|0o666, 1<<8|3))
	must(os.Chtimes(filepath.Join(src, "home/user/notes"), time.Unix(1000, 0), time.Unix(1000, 0)))
	return src
}

func checkCopiedTree(t *testing.T, r string) {
	t.Helper()
	assertOwner(t, filepath.Join(r, "usr/bin/tool"), testBase, testBase)
	assertOwner(t, filepath.Join(r, "home/user/notes"), testBase+1000, testBase+1000)
	assertOwner(t, filepath.Join(r, "abs-link"), testBase, testBase)
	if st := lstat(t, filepath.Join(r, "usr/bin/tool")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("setuid lost: mode %o", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(r, "home/user/.cache")); st.Mode&0o7777 != 0o700 {
		t.Errorf("dir mode %o", st.Mode&0o7777)
	}
	if a, b := lstat(t, filepath.Join(r, "usr/bin/tool")), lstat(t, filepath.Join(r, "usr/bin/tool2")); a.Ino != b.Ino {
		t.Error("hardlink not preserved")
	}
	if tg, _ := os.Readlink(filepath.Join(r, "abs-link")); tg != "/usr/bin/tool" {
		t.Errorf("abs-link -> %q", tg)
	}
	if st := lstat(t, filepath.Join(r, "home/user/notes")); st.Mtim.Sec != 1000 {
		t.Errorf("mtime %d", st.Mtim.Sec)
	}
	for _, p := range []string{"fifo", "null"} {
		if _, err := os.Lstat(filepath.Join(r, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s copied: %v", p, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(r, "home/user/notes")); string(b) != "hello" {
		t.Errorf("content %q", b)
	}
}

func TestDirBuild(t *testing.T) {
	m := newTestManager(t, Options{})
	ctx := context.Background()
	src := makeSourceTree(t)
	tpl, err := m.Build(ctx, BuildRequest{Name: "d", Source: SourceDir, Path: src}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkCopiedTree(t, tpl.RootfsDir)
	var pl progressLog
	tpl2, err := m.Build(ctx, BuildRequest{Name: "d2", Source: SourceDir, Path: src}, pl.fn)
	if err != nil {
		t.Fatal(err)
	}
	if tpl2.Digest != tpl.Digest || pl.count("copy") != 0 {
		t.Errorf("same tree rebuilt: %s vs %s, %v", tpl2.Digest, tpl.Digest, pl.stages)
	}
	os.WriteFile(filepath.Join(src, "home/user/notes"), []byte("changed"), 0o600)
	tpl3, err := m.Build(ctx, BuildRequest{Name: "d3", Source: SourceDir, Path: src}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tpl3.Digest == tpl.Digest {
		t.Error("changed content kept the digest")
	}
	// The source is untouched: its owners were not shifted.
	assertOwner(t, filepath.Join(src, "usr/bin/tool"), 0, 0)
}

func TestDirRejects(t *testing.T) {
	ctx := context.Background()
	t.Run("socket", func(t *testing.T) {
		m := newTestManager(t, Options{})
		src := t.TempDir()
		l, err := net.Listen("unix", filepath.Join(src, "sock"))
		if err != nil {
			t.Skip(err)
		}
		defer l.Close()
		if _, err := m.Build(ctx, BuildRequest{Name: "s", Source: SourceDir, Path: src}, nil); !errors.Is(err, ErrUnsafeInput) {
			t.Errorf("socket: %v", err)
		}
		assertEmptyDir(t, m.tmpDir())
		assertEmptyDir(t, m.rootfsRoot())
	})
	t.Run("uid-out-of-range", func(t *testing.T) {
		m := newTestManager(t, Options{})
		src := t.TempDir()
		os.WriteFile(filepath.Join(src, "f"), nil, 0o644)
		os.Lchown(filepath.Join(src, "f"), 70000, 0)
		if _, err := m.Build(ctx, BuildRequest{Name: "s", Source: SourceDir, Path: src}, nil); !errors.Is(err, ErrUnsafeInput) {
			t.Errorf("uid 70000: %v", err)
		}
		assertEmptyDir(t, m.rootfsRoot())
	})
	t.Run("too-big", func(t *testing.T) {
		m := newTestManager(t, Options{MaxBytes: 10})
		src := t.TempDir()
		os.WriteFile(filepath.Join(src, "f"), make([]byte, 11), 0o644)
		if _, err := m.Build(ctx, BuildRequest{Name: "s", Source: SourceDir, Path: src}, nil); !errors.Is(err, ErrLimit) {
			t.Errorf("11 bytes with MaxBytes 10: %v", err)
		}
		assertEmptyDir(t, m.rootfsRoot())
	})
	t.Run("not-a-dir", func(t *testing.T) {
		m := newTestManager(t, Options{})
		f := filepath.Join(t.TempDir(), "f")
		os.WriteFile(f, nil, 0o644)
		if _, err := m.Build(ctx, BuildRequest{Name: "s", Source: SourceDir, Path: f}, nil); err == nil {
			t.Error("file as dir source accepted")
		}
	})
}

// tarEntry is one entry for mkTar; raw lets a test bypass tar.Writer's checks.
type tarEntry struct {
	hdr  tar.Header
	body string
}

func mkTar(t testing.TB, ents []tarEntry, gz bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(e.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if !gz {
		return buf.Bytes()
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(buf.Bytes())
	zw.Close()
	return z.Bytes()
}

func writeTemp(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "in.tar")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func goodTarEntries() []tarEntry {
	return []tarEntry{
		{hdr: tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}},
		{hdr: tar.Header{Name: "./usr/bin/tool", Mode: 0o4755}, body: "#!/bin/sh\n"},
		{hdr: tar.Header{Name: "./usr/bin/tool2", Typeflag: tar.TypeLink, Linkname: "./usr/bin/tool"}},
		{hdr: tar.Header{Name: "./home/user/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: 1000, Gid: 1000}},
		{hdr: tar.Header{Name: "./home/user/notes", Mode: 0o600, Uid: 1000, Gid: 1000, ModTime: time.Unix(1000, 0)}, body: "hello"},
		{hdr: tar.Header{Name: "./home/user/.cache/", Typeflag: tar.TypeDir, Mode: 0o700}},
		{hdr: tar.Header{Name: "abs-link", Typeflag: tar.TypeSymlink, Linkname: "/usr/bin/tool"}},
		{hdr: tar.Header{Name: "rel-link", Typeflag: tar.TypeSymlink, Linkname: "usr"}},
		{hdr: tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666}},
		{hdr: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo}},
		{hdr: tar.Header{Name: "/etc/abs-name", Mode: 0o644}, body: "made relative"},
		// A later entry replaces an earlier file, as with tar(1).
		{hdr: tar.Header{Name: "etc/dup"}, body: "old"},
		{hdr: tar.Header{Name: "etc/dup"}, body: "new"},
	}
}

func TestTarBuild(t *testing.T) {
	for _, gz := range []bool{false, true} {
		t.Run(map[bool]string{false: "tar", true: "tar.gz"}[gz], func(t *testing.T) {
			m := newTestManager(t, Options{})
			ctx := context.Background()
			path := writeTemp(t, mkTar(t, goodTarEntries(), gz))
			var pl progressLog
			tpl, err := m.Build(ctx, BuildRequest{Name: "t", Source: SourceTar, Path: path}, pl.fn)
			if err != nil {
				t.Fatal(err)
			}
			if pl.count("extract") == 0 || pl.count("hash") == 0 {
				t.Errorf("progress: %v", pl.stages)
			}
			r := tpl.RootfsDir
			checkCopiedTree(t, r)
			if b, _ := os.ReadFile(filepath.Join(r, "etc/abs-name")); string(b) != "made relative" {
				t.Errorf("absolute name: %q", b)
			}
			if b, _ := os.ReadFile(filepath.Join(r, "etc/dup")); string(b) != "new" {
				t.Errorf("dup: %q", b)
			}
			assertOwner(t, filepath.Join(r, "etc"), testBase, testBase) // implicit parent
			if _, err := os.Stat("/etc/abs-name"); err == nil {
				t.Error("absolute tar name written to the host")
			}
			tpl2, err := m.Build(ctx, BuildRequest{Name: "t2", Source: SourceTar, Path: path}, nil)
			if err != nil || tpl2.Digest != tpl.Digest {
				t.Errorf("second build: %v, %s vs %s", err, tpl2.Digest, tpl.Digest)
			}
			assertEmptyDir(t, m.tmpDir())
		})
	}
}

func TestHostileTarballs(t *testing.T) {
	outside := t.TempDir()
	huge := func() []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Size: 1 << 40, Mode: 0o644})
		tw.Flush()
		return append(buf.Bytes(), make([]byte, 4096)...)
	}
	truncated := func() []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "short", Typeflag: tar.TypeReg, Size: 100, Mode: 0o644})
		tw.Write([]byte("only ten.."))
		tw.Flush()
		return buf.Bytes()
	}
	cases := []struct {
		name    string
		data    []byte
		opts    Options
		wantErr error
	}{
		{"dotdot", mkTar(t, []tarEntry{{hdr: tar.Header{Name: "../evil"}, body: "x"}}, false), Options{}, ErrUnsafeInput},
		{"dotdot-deep", mkTar(t, []tarEntry{{hdr: tar.Header{Name: "a/../../" + outside + "/evil"}, body: "x"}}, true), Options{}, ErrUnsafeInput},
		{"hardlink-outside-abs", mkTar(t, []tarEntry{{hdr: tar.Header{Name: "pw", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}}}, false), Options{}, ErrUnsafeInput},
		{"hardlink-outside-rel", mkTar(t, []tarEntry{{hdr: tar.Header{Name: "pw", Typeflag: tar.TypeLink, Linkname: "../../../../etc/passwd"}}}, false), Options{}, ErrUnsafeInput},
		{"hardlink-to-symlink", mkTar(t, []tarEntry{
			{hdr: tar.Header{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}},
			{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "s"}}}, false), Options{}, ErrUnsafeInput},
		{"hardlink-forward", mkTar(t, []tarEntry{
			{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "later"}},
			{hdr: tar.Header{Name: "later"}, body: "x"}}, false), Options{}, ErrUnsafeInput},
		{"write-through-abs-symlink", mkTar(t, []tarEntry{
			{hdr: tar.Header{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: outside}},
			{hdr: tar.Header{Name: "esc/pwned"}, body: "x"}}, false), Options{}, nil},
		{"write-through-rel-symlink", mkTar(t, []tarEntry{
			{hdr: tar.Header{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../../../" + outside}},
			{hdr: tar.Header{Name: "esc/pwned"}, body: "x"}}, false), Options{}, nil},
		{"huge-header", huge(), Options{}, ErrLimit},
		{"too-many-entries", mkTar(t, []tarEntry{{hdr: tar.Header{Name: "a"}}, {hdr: tar.Header{Name: "b"}}, {hdr: tar.Header{Name: "c"}}}, false), Options{MaxEntries: 2}, ErrLimit},
		{"total-size", mkTar(t, []tarEntry{{hdr: tar.Header{Name: "a"}, body: "123456"}, {hdr: tar.Header{Name: "b"}, body: "123456"}}, false), Options{MaxBytes: 10}, ErrLimit},
		{"uid-out-of-range", mkTar(t, []tarEntry{{hdr: tar.Header{Name: "a", Uid: 65536}}}, false), Options{}, ErrUnsafeInput},
		{"replace-dir", mkTar(t, []tarEntry{{hdr: tar.Header{Name: "d", Typeflag: tar.TypeDir}}, {hdr: tar.Header{Name: "d/f"}, body: "x"}, {hdr: tar.Header{Name: "d"}, body: "x"}}, false), Options{}, ErrUnsafeInput},
		{"root-as-file", mkTar(t, []tarEntry{{hdr: tar.Header{Name: "."}, body: "x"}}, false), Options{}, ErrUnsafeInput},
		{"truncated", truncated(), Options{}, ErrUnsafeInput},
		{"garbage", []byte("this is not a tarball at all, just text that goes on and on"), Options{}, ErrUnsafeInput},
		{"bad-gzip", append([]byte{0x1f, 0x8b, 8, 0}, make([]byte, 100)...), Options{}, ErrUnsafeInput},
		{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0, 0, 0}, Options{}, ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newTestManager(t, c.opts)
			_, err := m.Build(context.Background(), BuildRequest{Name: "h", Source: SourceTar, Path: writeTemp(t, c.data)}, nil)
			if err == nil {
				t.Fatal("hostile tarball accepted")
			}
			if c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Errorf("error %v, want %v", err, c.wantErr)
			}
			t.Logf("rejected: %v", err)
			assertEmptyDir(t, m.tmpDir())
			assertEmptyDir(t, m.rootfsRoot())
			assertEmptyDir(t, m.namesDir())
			assertEmptyDir(t, outside)
		})
	}
}

func TestParseAptSources(t *testing.T) {
	deb822 := `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
`
	if got := parseAptSources(deb822, true); got != "http://mirror.example/debian" {
		t.Errorf("deb822: %q", got)
	}
	if got := parseAptSources("Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\n", true); got != "" {
		t.Errorf("third-party repo picked: %q", got)
	}
	if got := parseAptSources("Enabled: no\nTypes: deb\nURIs: http://x/debian\nSuites: bookworm\n", true); got != "" {
		t.Errorf("disabled picked: %q", got)
	}
	oneLine := "# comment\ndeb-src http://src/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://one/debian bookworm main\n"
	if got := parseAptSources(oneLine, false); got != "http://one/debian" {
		t.Errorf("one-line: %q", got)
	}
}

func TestLineWriter(t *testing.T) {
	var lines []string
	w := &lineWriter{max: 8, keep: 2, onLine: func(s string) { lines = append(lines, s) }}
	w.Write([]byte("I: a\nI: b"))
	w.Write([]byte("c\nthis line is too long\n"))
	w.Write([]byte("x"))
	if strings.Join(lines, "|") != "I: a|I: bc|this lin" {
		t.Errorf("lines %q", lines)
	}
	if tail := w.tail(); tail != "  this lin\n  x\n" {
		t.Errorf("tail %q", tail)
	}
}

func TestCleanEntryName(t *testing.T) {
	for in, want := range map[string]string{
		"a/b": "a/b", "./a//b/": "a/b", "/etc/passwd": "etc/passwd", "./": ".", "/": ".", "a/./b": "a/b",
	} {
		if got, err := cleanEntryName(in); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "..", "../a", "a/..", "a/../b", "a\x00b", strings.Repeat("a", 256)} {
		if got, err := cleanEntryName(in); err == nil {
			t.Errorf("%q accepted as %q", in, got)
		}
	}
}

// TestBuiltinPinnedPerManager: servers of different versions sharing one
// template directory each get their own build of a builtin, whichever
// started last (each points the name's file at its build at start).
func TestBuiltinPinnedPerManager(t *testing.T) {
	requireRoot(t)
	orig, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs /bin/busybox (busybox-static)")
	}
	// Another version: another busybox binary, another digest.
	other := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(other, append(orig, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	open := func(bb string) *Manager {
		m, err := NewManager(dir, Options{UIDBase: testBase, NoSync: true, Logf: t.Logf, BusyboxPath: bb})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	ctx := context.Background()
	a, b := open(""), open(other)
	ta, err := a.EnsureBuiltin(ctx, BuiltinMinimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := b.EnsureBuiltin(ctx, BuiltinMinimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ta.Digest == tb.Digest {
		t.Fatalf("both versions built %s", ta.Digest)
	}
	fresh := open("") // ensured nothing: reads the name's file, the last start
	for _, c := range []struct {
		m    *Manager
		want string
	}{{a, ta.Digest}, {b, tb.Digest}, {fresh, tb.Digest}} {
		got, err := c.m.Get(BuiltinMinimal)
		if err != nil || got.Digest != c.want || got.RootfsDir != filepath.Join(dir, "rootfs", strings.TrimPrefix(c.want, "sha256:")) {
			t.Errorf("Get = %s (%s), %v; want %s", got.Digest, got.RootfsDir, err, c.want)
		}
	}
	if l, err := a.List(); err != nil || len(l) != 1 || l[0].Digest != ta.Digest {
		t.Errorf("a's list %+v, %v", l, err)
	}
	// A GC by a alone keeps the tree a pinned (the name's file is b's).
	b.Close()
	fresh.Close()
	if removed, err := a.GC(ctx, nil); err != nil || len(removed) != 0 {
		t.Errorf("GC removed %v, %v; want nothing (b's tree is named, a's pinned)", removed, err)
	}
	if _, err := os.Stat(ta.RootfsDir); err != nil {
		t.Errorf("GC removed the pinned tree: %v", err)
	}
	// An alias of a pinned builtin is a's tree; removing the name drops the pin.
	if al, err := a.Alias(BuiltinMinimal, "mine"); err != nil || al.Digest != ta.Digest {
		t.Errorf("alias %s, %v", al.Digest, err)
	}
	if err := a.Remove(BuiltinMinimal); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Get(BuiltinMinimal); !errors.Is(err, ErrNotFound) {
		t.Errorf("after Remove: %s, %v", got.Digest, err)
	}
}
