package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseBuildfile(t *testing.T) {
	bf, err := ParseBuildfile([]byte(`# comment
FROM docker.io/library/alpine:3.20

ENV A=1 B="two words" \
    C=3
env D four five
WORKDIR /srv
RUN apk add \
    # a comment inside a continuation
    curl
RUN ["/bin/sh", "-c", "echo hi"]
COPY a b/ ./dst/
COPY ["with space", "/x y"]
USER app
START ["python3", "-m", "http.server"]
READY wget -q -O- http://localhost:8000/
`))
	if err != nil {
		t.Fatal(err)
	}
	if bf.From != "docker.io/library/alpine:3.20" || len(bf.Steps) != 10 {
		t.Fatalf("parsed %+v", bf)
	}
	want := []Instruction{
		{Kind: InstrEnv, Env: [][2]string{{"A", "1"}, {"B", "two words"}, {"C", "3"}}},
		{Kind: InstrEnv, Env: [][2]string{{"D", "four five"}}},
		{Kind: InstrWorkdir, Dir: "/srv"},
		{Kind: InstrRun, Shell: "apk add  curl"},
		{Kind: InstrRun, Argv: []string{"/bin/sh", "-c", "echo hi"}},
		{Kind: InstrCopy, Srcs: []string{"a", "b"}, Dest: "./dst/"},
		{Kind: InstrCopy, Srcs: []string{"with space"}, Dest: "/x y"},
		{Kind: InstrUser, User: "app"},
		{Kind: InstrStart, Argv: []string{"python3", "-m", "http.server"}},
		{Kind: InstrReady, Shell: "wget -q -O- http://localhost:8000/"},
	}
	for i, w := range want {
		got := bf.Steps[i]
		got.Line, got.Text = 0, ""
		if !reflect.DeepEqual(got, w) {
			t.Errorf("step %d: got %+v want %+v", i, got, w)
		}
	}
	if bf.Steps[3].Line != 8 {
		t.Errorf("RUN line %d, want 8", bf.Steps[3].Line)
	}

	for _, bad := range []string{
		"", "# only a comment\n", "RUN true\n", "FROM a\nFROM b\n", "FROM a AS b\n",
		"FROM a\nADD x /x\n", "FROM a\nARG X\n", "FROM a\nFOO bar\n", "FROM a\nRUN\n",
		"FROM a\nCOPY ../x /x\n", "FROM a\nCOPY a/../../x /x\n", "FROM a\nCOPY onlyone\n", "FROM a\nCOPY *.go /x\n",
		"FROM a\nCOPY --chown=1 a /x\n", "FROM a\nRUN --mount=type=cache true\n", "FROM a\nRUN [\"unterminated\n",
		"FROM a\nRUN []\n", "FROM a\nENV =x\n", "FROM a\nENV A=\"open\n", "FROM a\nUSER a:b\n",
		"FROM a\nENV A=\"x\"y\n", "FROM a\x00\n", "FROM a\n" + strings.Repeat("RUN true\n", maxInstructions+1),
		"FROM a\n\xff\n", strings.Repeat("#", MaxBuildfileBytes+1),
	} {
		if _, err := ParseBuildfile([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%.60q: err %v, want ErrInvalid", bad, err)
		}
	}
}

func TestApplyConfig(t *testing.T) {
	cfg := Defaults{Env: map[string]string{"PATH": "/bin"}, Cwd: "/home/user", User: "user"}
	steps := []Instruction{
		{Kind: InstrEnv, Env: [][2]string{{"APP", "/srv/app"}, {"PATH", "$APP/bin:${PATH}"}, {"LIT", `\$APP`}}},
		{Kind: InstrWorkdir, Dir: "$APP"},
		{Kind: InstrWorkdir, Dir: "sub/../lib"},
		{Kind: InstrUser, User: "${APP_USER}x"},
		{Kind: InstrStart, Shell: "serve"},
	}
	for _, in := range steps {
		cfg = applyConfig(cfg, in)
	}
	want := Defaults{Env: map[string]string{"PATH": "/srv/app/bin:/bin", "APP": "/srv/app", "LIT": "$APP"},
		Cwd: "/srv/app/lib", User: "x", Cmd: []string{"/bin/sh", "-c", "serve"}}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config %+v, want %+v", cfg, want)
	}
}

func FuzzParseBuildfile(f *testing.F) {
	f.Add([]byte("FROM a\nCOPY x/ y\nRUN echo \\\n hi\nENV A=\"b c\" D=e\n"))
	f.Add([]byte("FROM a\nCOPY [\"a\",\"../b\",\"c\"]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		bf, err := ParseBuildfile(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for _, in := range bf.Steps {
			for _, s := range in.Srcs {
				if strings.HasPrefix(s, "/") || s == ".." || strings.HasPrefix(s, "../") || strings.Contains(s, "/../") {
					t.Fatalf("source %q escapes the context", s)
				}
			}
		}
	})
}

// buildBase makes a small named base template from a directory.
func buildBase(t *testing.T, m *Manager, name string) Template {
	t.Helper()
	src := t.TempDir()
	for _, d := range []string{"bin", "etc", "data", "data/sub"} {
		os.MkdirAll(filepath.Join(src, d), 0o755)
	}
	os.WriteFile(filepath.Join(src, "bin/tool"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "etc/motd"), []byte("base\n"), 0o644)
	os.WriteFile(filepath.Join(src, "data/sub/old"), []byte("old\n"), 0o644)
	os.Symlink("/outside", filepath.Join(src, "escape")) // an absolute link, as images have
	tp, err := m.Build(context.Background(), BuildRequest{Name: name, Source: SourceDir, Path: src,
		Defaults: Defaults{Env: map[string]string{"PATH": "/bin"}, Cwd: "/", User: "root"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

func ino(t *testing.T, p string) uint64 { t.Helper(); return lstat(t, p).Ino }

// TestBuildFromFileCopyCache builds COPY/config-only build files (RUN needs
// a sandbox; test/templates covers it against a real server).
func TestBuildFromFileCopyCache(t *testing.T) {
	m := newTestManager(t, Options{})
	ctx := context.Background()
	base := buildBase(t, m, "base0")
	cdir := t.TempDir()
	os.MkdirAll(filepath.Join(cdir, "app/lib"), 0o755)
	os.WriteFile(filepath.Join(cdir, "app/main.txt"), []byte("v1\n"), 0o640)
	os.WriteFile(filepath.Join(cdir, "app/lib/x"), []byte("x\n"), 0o644)
	os.WriteFile(filepath.Join(cdir, "conf"), []byte("conf\n"), 0o644)
	file := []byte("FROM base0\nENV HOME=/srv\nWORKDIR /srv/app\nCOPY app/ .\nCOPY conf /etc/conf\nUSER 1000\n")
	var events []StepEvent
	res, err := m.BuildFromFile(ctx, BuildfileRequest{Name: "app:1", File: file, Context: cdir}, func(ev StepEvent) { events = append(events, ev) })
	if err != nil {
		t.Fatal(err)
	}
	tp := res.Template
	if tp.Source != SourceBuildfile || tp.Defaults.Cwd != "/srv/app" || tp.Defaults.User != "1000" || tp.Defaults.Env["HOME"] != "/srv" || tp.Defaults.Env["PATH"] != "/bin" {
		t.Errorf("template %+v", tp)
	}
	root := tp.RootfsDir
	for p, want := range map[string]string{"srv/app/main.txt": "v1\n", "srv/app/lib/x": "x\n", "etc/conf": "conf\n", "etc/motd": "base\n"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
	assertOwner(t, filepath.Join(root, "srv/app/main.txt"), testBase, testBase)
	assertOwner(t, filepath.Join(root, "srv"), testBase, testBase)
	if st := lstat(t, filepath.Join(root, "srv/app/main.txt")); st.Mode&0o777 != 0o640 {
		t.Errorf("mode %o", st.Mode&0o777)
	}
	// Unchanged files share the base's data (hard links), not copies.
	if ino(t, filepath.Join(root, "etc/motd")) != ino(t, filepath.Join(base.RootfsDir, "etc/motd")) {
		t.Error("base file not shared with the layer")
	}
	if l, _ := os.Readlink(filepath.Join(root, "escape")); l != "/outside" {
		t.Errorf("symlink %q", l)
	}
	// Events: in order, each layer step running then done.
	var seq []string
	for _, ev := range events {
		seq = append(seq, ev.State)
		if ev.Steps != 6 {
			t.Errorf("steps %d", ev.Steps)
		}
	}
	if got := strings.Join(seq, ","); got != "running,cached,cached,cached,running,done,running,done,cached" {
		t.Errorf("event states %s", got)
	}

	// Rebuild: a full cache hit, same digest.
	res2, err := m.BuildFromFile(ctx, BuildfileRequest{Name: "app:1", File: file, Context: cdir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res2.Steps {
		if !s.Cached {
			t.Errorf("rebuild step %d %s not cached", s.Step, s.Instruction)
		}
	}
	if res2.Template.Digest != tp.Digest || !res2.Template.CreatedAt.Equal(tp.CreatedAt) {
		t.Errorf("rebuild %s %v, first %s %v", res2.Template.Digest, res2.Template.CreatedAt, tp.Digest, tp.CreatedAt)
	}

	// Change the second COPY's source: the first COPY stays cached.
	os.WriteFile(filepath.Join(cdir, "conf"), []byte("conf2\n"), 0o644)
	res3, err := m.BuildFromFile(ctx, BuildfileRequest{Name: "app:2", File: file, Context: cdir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res3.Steps[3].Cached || res3.Steps[4].Cached || res3.Template.Digest == tp.Digest {
		t.Errorf("after change: %+v", res3.Steps)
	}
	// The first template is immutable and the unchanged layer is shared.
	if b, _ := os.ReadFile(filepath.Join(tp.RootfsDir, "etc/conf")); string(b) != "conf\n" {
		t.Errorf("app:1 changed: %q", b)
	}
	if ino(t, filepath.Join(res3.Template.RootfsDir, "srv/app/main.txt")) != ino(t, filepath.Join(root, "srv/app/main.txt")) {
		t.Error("unchanged COPY data not shared between the versions")
	}

	// Alias, then GC: the cache layers no name uses go; named trees stay.
	if _, err := m.Alias("app:1", "app:stable"); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("app:1"); err != nil {
		t.Fatal(err)
	}
	removed, err := m.GC(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 { // the first COPY's layer (app:2 has its own second layer)
		t.Errorf("GC removed %v", removed)
	}
	for _, n := range []string{"app:stable", "app:2", "base0"} {
		if _, err := m.Get(n); err != nil {
			t.Errorf("%s after GC: %v", n, err)
		}
	}
	// The newest existing layer makes everything below it a cache hit,
	// though GC removed the unnamed first COPY layer.
	res4, err := m.BuildFromFile(ctx, BuildfileRequest{Name: "app:2", File: file, Context: cdir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res4.Steps {
		if !s.Cached {
			t.Errorf("after GC: step %d %s not cached", s.Step, s.Instruction)
		}
	}
	if res4.Template.Digest != res3.Template.Digest {
		t.Errorf("after GC: digest %s, want %s", res4.Template.Digest, res3.Template.Digest)
	}

	// Errors: a missing source, a dest through an escaping link, no
	// context; nothing named, nothing left in tmp/.
	// A context symlink leading out: copied as a link, never followed.
	os.Symlink("/etc", filepath.Join(cdir, "etc-link"))
	for _, bad := range []struct{ file, ctx string }{
		{"FROM base0\nCOPY etc-link/passwd /x\n", cdir},
		{"FROM base0\nCOPY nope /x\n", cdir},
		{"FROM base0\nCOPY conf /escape/pwned\n", cdir},
		{"FROM base0\nCOPY conf /x\n", ""},
		{"FROM base0\nRUN true\n", cdir}, // no runner
		{"FROM NoSuchTemplateOrImage\n", cdir},
	} {
		if _, err := m.BuildFromFile(ctx, BuildfileRequest{Name: "bad", File: []byte(bad.file), Context: bad.ctx}, nil); err == nil {
			t.Errorf("%q built", bad.file)
		}
		if _, err := m.Get("bad"); !errors.Is(err, ErrNotFound) {
			t.Errorf("%q left a template", bad.file)
		}
	}
	if left, _ := os.ReadDir(m.tmpDir()); len(left) > 0 {
		t.Errorf("tmp/ not empty: %v", left)
	}
	if _, err := os.Lstat("/outside/pwned"); err == nil {
		t.Error("COPY wrote through an escaping symlink")
	}
}

// TestApplyUpper applies a hand-made overlay upper dir (what a RUN step's
// sandbox leaves) with whiteouts, an opaque dir, hard links and hostile
// entries onto a clone of a tree.
func TestApplyUpper(t *testing.T) {
	m := newTestManager(t, Options{})
	base := buildBase(t, m, "base1")
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("keep\n"), 0o644)

	dstDir := filepath.Join(t.TempDir(), "rootfs")
	os.Mkdir(dstDir, 0o755)
	if err := cloneTree(context.Background(), base.RootfsDir, dstDir); err != nil {
		t.Fatal(err)
	}
	// The tree also has a link pointing outside, which the upper replaces
	// with a directory (as a sandbox would).
	os.Symlink(outside, filepath.Join(dstDir, "out"))
	os.Lchown(filepath.Join(dstDir, "out"), testBase, testBase)

	// The build sandbox ran under its own uid block: the layer's owners
	// land shifted onto the template's range.
	const layerBase = 1 << 24
	up := t.TempDir()
	own := func(p string) { os.Lchown(filepath.Join(up, p), layerBase+5, layerBase+5) }
	os.Chown(up, layerBase, layerBase)
	os.MkdirAll(filepath.Join(up, "data/sub"), 0o755)
	own("data")
	own("data/sub")
	if err := unix.Setxattr(filepath.Join(up, "data/sub"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("cannot set overlay xattrs here: %v", err)
	}
	os.WriteFile(filepath.Join(up, "data/sub/new"), []byte("new\n"), 0o600)
	own("data/sub/new")
	os.Link(filepath.Join(up, "data/sub/new"), filepath.Join(up, "data/sub/new-link"))
	os.Mkdir(filepath.Join(up, "etc"), 0o755)
	own("etc")
	if err := unix.Mknod(filepath.Join(up, "etc/motd"), unix.S_IFCHR, 0); err != nil { // whiteout
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(up, "out"), 0o755) // replaces the escaping link
	own("out")
	os.WriteFile(filepath.Join(up, "out/victim"), []byte("pwned\n"), 0o644)
	own("out/victim")
	os.Symlink("/etc/shadow", filepath.Join(up, "shadow-link"))
	own("shadow-link")
	unix.Mkfifo(filepath.Join(up, "fifo"), 0o644)
	own("fifo")

	dst, err := os.OpenRoot(dstDir)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	st, err := applyUpper(context.Background(), up, dst, m.limits(), layerBase, testBase, 65536)
	if err != nil {
		t.Fatal(err)
	}
	if st.removed != 1 || st.skipped != 1 {
		t.Errorf("stats %+v", st)
	}
	if _, err := os.Lstat(filepath.Join(dstDir, "etc/motd")); !os.IsNotExist(err) {
		t.Error("whiteout did not remove etc/motd")
	}
	if _, err := os.Lstat(filepath.Join(dstDir, "data/sub/old")); !os.IsNotExist(err) {
		t.Error("opaque dir kept a lower file")
	}
	if ino(t, filepath.Join(dstDir, "data/sub/new")) != ino(t, filepath.Join(dstDir, "data/sub/new-link")) {
		t.Error("hard link not kept")
	}
	assertOwner(t, filepath.Join(dstDir, "data/sub/new"), testBase+5, testBase+5)
	if b, _ := os.ReadFile(victim); string(b) != "keep\n" {
		t.Errorf("wrote outside the tree: %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(dstDir, "out")); err != nil || !fi.IsDir() {
		t.Errorf("out: %v %v", fi, err)
	}
	if l, _ := os.Readlink(filepath.Join(dstDir, "shadow-link")); l != "/etc/shadow" {
		t.Errorf("symlink %q", l)
	}
	// The base tree is untouched (its files are shared with the clone).
	if b, err := os.ReadFile(filepath.Join(base.RootfsDir, "etc/motd")); err != nil || string(b) != "base\n" {
		t.Errorf("base changed: %q %v", b, err)
	}

	// Owners outside the sandbox's range are refused.
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "f"), []byte("x"), 0o644) // owned by host root
	dst2 := filepath.Join(t.TempDir(), "r")
	os.Mkdir(dst2, 0o755)
	r2, _ := os.OpenRoot(dst2)
	defer r2.Close()
	if _, err := applyUpper(context.Background(), bad, r2, m.limits(), testBase, testBase, 65536); !errors.Is(err, ErrUnsafeInput) {
		t.Errorf("host-root file: %v", err)
	}
	// A redirect xattr (renamed lower dir) is refused, not misapplied.
	red := t.TempDir()
	os.Mkdir(filepath.Join(red, "d"), 0o755)
	os.Lchown(filepath.Join(red, "d"), testBase, testBase)
	unix.Setxattr(filepath.Join(red, "d"), "trusted.overlay.redirect", []byte("/x"), 0)
	if _, err := applyUpper(context.Background(), red, r2, m.limits(), testBase, testBase, 65536); !errors.Is(err, ErrUnsupported) {
		t.Errorf("redirect: %v", err)
	}
}

// TestBuildFromFileRegistryBase uses a registry image (three layers with
// whiteouts and opaque dirs) as FROM: the layer is the image's exact tree
// and the image config's env, workdir and user are the starting defaults.
func TestBuildFromFileRegistryBase(t *testing.T) {
	m := newImageManager(t, Options{})
	ctx := context.Background()
	reg := testRegistry(t, "")
	ref := push(t, reg, "test/layered:bf", layeredImage(t))
	cdir := t.TempDir()
	os.WriteFile(filepath.Join(cdir, "extra"), []byte("extra\n"), 0o644)
	res, err := m.BuildFromFile(ctx, BuildfileRequest{Name: "from-reg", Context: cdir,
		File: []byte("FROM " + ref + "\nCOPY extra added/\nENV FOO=over\n")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps[0].Cached {
		t.Error("first pull reported cached")
	}
	tp := res.Template
	want := append([]string{"app/added d", "app/added/extra f extra\n"}, layeredTree...)
	slices.Sort(want)
	if got := listTree(t, tp.RootfsDir); !slices.Equal(got, want) {
		t.Errorf("tree:\n got %q\nwant %q", got, want)
	}
	d := tp.Defaults
	if d.Cwd != "/app" || d.User != "1000" || d.Env["PATH"] != "/usr/bin:/bin" || d.Env["LANG"] != "C.UTF-8" || d.Env["FOO"] != "over" ||
		!slices.Equal(d.Cmd, []string{"/bin/sh", "-c", "echo hi"}) {
		t.Errorf("defaults %+v", d)
	}
	res2, err := m.BuildFromFile(ctx, BuildfileRequest{Name: "from-reg", Context: cdir,
		File: []byte("FROM " + ref + "\nCOPY extra added/\nENV FOO=over\n")}, nil)
	if err != nil || !res2.Steps[0].Cached || !res2.Steps[1].Cached || res2.Template.Digest != tp.Digest {
		t.Errorf("rebuild: %v %+v", err, res2.Steps)
	}
}
