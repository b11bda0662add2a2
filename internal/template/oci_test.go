package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// testRegistry serves an OCI registry on loopback; auth, when set, is the
// "user:password" it demands.
func testRegistry(t *testing.T, auth string) string {
	t.Helper()
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if auth != "" {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u+":"+p != auth {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// mkImage builds an image from layer tarballs (uncompressed tar bytes,
// gzip-compressed by the library) and a config.
func mkImage(t *testing.T, layers [][]byte, cfg v1.Config) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for _, b := range layers {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func push(t *testing.T, reg, repo string, img v1.Image, opts ...remote.Option) string {
	t.Helper()
	ref := reg + "/" + repo
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatal(err)
	}
	return ref
}

func newImageManager(t *testing.T, opts Options) *Manager {
	t.Helper()
	opts.AllowPrivateRegistries = true // the test registry is on loopback
	if opts.DockerConfig == "" {
		opts.DockerConfig = filepath.Join(t.TempDir(), "no-config.json")
	}
	return newTestManager(t, opts)
}

func dir(name string, mode int64, uid int) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode, Uid: uid, Gid: uid}}
}

func file(name, body string) tarEntry { return tarEntry{hdr: tar.Header{Name: name}, body: body} }

func symlink(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target}}
}

// The layered image used by the positive tests.
func layeredImage(t *testing.T) v1.Image {
	l1 := mkTar(t, []tarEntry{
		dir("etc/", 0o755, 0),
		file("etc/conf", "v1"),
		file("etc/keep-not", "gone"),
		file("etc/stays", "lower"),
		dir("app/", 0o755, 0),
		file("app/old1", "x"),
		dir("app/sub/", 0o755, 0),
		file("app/sub/old2", "x"),
		file("opt-x", "file becomes dir"),
		dir("data/", 0o755, 0),
		file("data/inner", "dir becomes file"),
		dir("var/", 0o755, 0),
		dir("var/cache/", 0o755, 0),
		file("var/cache/big", "deleted with its dir"),
		dir("srv/", 0o755, 0),
		file("srv/lower", "hidden by a late opaque marker"),
		dir("usr/lib/", 0o755, 0),
		file("usr/lib/libfoo.so", "lib"),
		symlink("lib", "usr/lib"),
		dir("home/user/", 0o750, 1000),
		{hdr: tar.Header{Name: "home/user/.profile", Uid: 1000, Gid: 1000}, body: "export A=1\n"},
	}, false)
	l2 := mkTar(t, []tarEntry{
		file("etc/.wh.keep-not", ""),
		file("etc/conf", "v2"),
		dir("app/", 0o755, 0),
		file("app/.wh..wh..opq", ""),
		file("app/new", "upper"),
		dir("opt-x/", 0o755, 0),
		file("opt-x/y", "now a dir"),
		file("data", "now a file"),
		file(".wh.var", ""),
		file("lib/libbar.so", "through an inner symlink"),
	}, false)
	l3 := mkTar(t, []tarEntry{
		dir("srv/", 0o755, 0),
		file("srv/a", "same layer, before the marker"),
		file("srv/.wh..wh..opq", ""),
		file("etc/.wh.not-there", ""),
		file("app/.wh..wh.plnk", ""),
	}, false)
	return mkImage(t, [][]byte{l1, l2, l3}, v1.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "FOO=bar=baz", "LANG=C.UTF-8"},
		WorkingDir: "/app",
		User:       "1000:1000",
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{"echo hi"},
	})
}

var layeredTree = []string{
	"app d", "app/new f upper",
	"data f now a file",
	"etc d", "etc/conf f v2", "etc/stays f lower",
	"home d", "home/user d", "home/user/.profile f export A=1\n",
	"lib l usr/lib",
	"opt-x d", "opt-x/y f now a dir",
	"srv d", "srv/a f same layer, before the marker",
	"usr d", "usr/lib d", "usr/lib/libbar.so f through an inner symlink", "usr/lib/libfoo.so f lib",
}

// listTree describes every entry under root as "path type [content]".
func listTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			tg, _ := os.Readlink(p)
			out = append(out, rel+" l "+tg)
		case d.IsDir():
			out = append(out, rel+" d")
		default:
			b, _ := os.ReadFile(p)
			out = append(out, rel+" f "+string(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func checkLayered(t *testing.T, tpl Template) {
	t.Helper()
	if got := listTree(t, tpl.RootfsDir); !slices.Equal(got, layeredTree) {
		t.Errorf("tree:\n got %q\nwant %q", got, layeredTree)
	}
	d := tpl.Defaults
	if d.Cwd != "/app" || d.User != "1000" || !slices.Equal(d.Cmd, []string{"/bin/sh", "-c", "echo hi"}) {
		t.Errorf("defaults %+v", d)
	}
	if len(d.Env) != 3 || d.Env["PATH"] != "/usr/bin:/bin" || d.Env["FOO"] != "bar=baz" || d.Env["LANG"] != "C.UTF-8" {
		t.Errorf("env %v", d.Env)
	}
	assertOwner(t, filepath.Join(tpl.RootfsDir, "app/new"), testBase, testBase)
	assertOwner(t, filepath.Join(tpl.RootfsDir, "home/user"), testBase+1000, testBase+1000)
	assertOwner(t, filepath.Join(tpl.RootfsDir, "home/user/.profile"), testBase+1000, testBase+1000)
	if st := lstat(t, filepath.Join(tpl.RootfsDir, "home/user")); st.Mode&0o7777 != 0o750 {
		t.Errorf("home/user mode %o", st.Mode&0o7777)
	}
}

func TestImageFromRegistry(t *testing.T) {
	m := newImageManager(t, Options{})
	ctx := context.Background()
	reg := testRegistry(t, "")
	img := layeredImage(t)
	ref := push(t, reg, "test/layered:v1", img)

	var stages []string
	var pullDone, pullTotal int64
	prog := func(stage string, done, total int64, msg string) {
		if len(stages) == 0 || stages[len(stages)-1] != stage {
			stages = append(stages, stage)
		}
		if stage == "pull" {
			if done < pullDone {
				t.Errorf("pull progress went back: %d after %d", done, pullDone)
			}
			pullDone, pullTotal = done, total
		}
	}
	start := time.Now()
	tpl, err := m.Build(ctx, BuildRequest{Name: "layered", Source: SourceImage, Image: ref}, prog)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pulled %s in %s: %s, %d files; stages %v", ref, time.Since(start).Round(time.Millisecond), tpl.Digest, tpl.Files, stages)
	checkLayered(t, tpl)
	if tpl.Source != SourceImage {
		t.Errorf("source %q", tpl.Source)
	}
	if pullTotal == 0 || pullDone != pullTotal {
		t.Errorf("pull progress %d/%d", pullDone, pullTotal)
	}
	for _, s := range []string{"resolve", "pull", "shift", "commit"} {
		if !slices.Contains(stages, s) {
			t.Errorf("no %q progress in %v", s, stages)
		}
	}
	assertEmptyDir(t, m.tmpDir())

	// Unchanged: a cache hit, without fetching layers.
	stages = nil
	tpl2, err := m.Build(ctx, BuildRequest{Name: "layered", Source: SourceImage, Image: ref}, prog)
	if err != nil || tpl2.Digest != tpl.Digest {
		t.Fatalf("rebuild: %v %s", err, tpl2.Digest)
	}
	if !slices.Contains(stages, "cached") || slices.Contains(stages, "pull") {
		t.Errorf("rebuild stages %v", stages)
	}

	// By digest, with explicit defaults laid over the image's.
	dg, _ := img.Digest()
	tpl3, err := m.Build(ctx, BuildRequest{Name: "bydigest", Source: SourceImage, Image: reg + "/test/layered@" + dg.String(),
		Defaults: Defaults{Env: map[string]string{"FOO": "mine"}, User: "root"}}, nil)
	if err != nil || tpl3.Digest != tpl.Digest {
		t.Fatalf("by digest: %v %s", err, tpl3.Digest)
	}
	if tpl3.Defaults.Env["FOO"] != "mine" || tpl3.Defaults.Env["LANG"] != "C.UTF-8" || tpl3.Defaults.User != "root" || tpl3.Defaults.Cwd != "/app" {
		t.Errorf("merged defaults %+v", tpl3.Defaults)
	}

	// A changed image is a new digest.
	img2, err := mutate.Config(img, v1.Config{Env: []string{"X=1"}})
	if err != nil {
		t.Fatal(err)
	}
	ref2 := push(t, reg, "test/layered:v2", img2)
	tpl4, err := m.Build(ctx, BuildRequest{Name: "layered2", Source: SourceImage, Image: ref2}, nil)
	if err != nil || tpl4.Digest == tpl.Digest || tpl4.Defaults.Env["X"] != "1" || tpl4.Defaults.Cwd != "" {
		t.Errorf("changed image: %v %s %+v", err, tpl4.Digest, tpl4.Defaults)
	}

	if _, err := m.Build(ctx, BuildRequest{Name: "missing", Source: SourceImage, Image: reg + "/test/nothing:here"}, nil); err == nil {
		t.Error("missing image built")
	}
}

func TestImageArchives(t *testing.T) {
	m := newImageManager(t, Options{})
	ctx := context.Background()
	img := layeredImage(t)
	reg := testRegistry(t, "")
	pulled, err := m.Build(ctx, BuildRequest{Name: "pulled", Source: SourceImage, Image: push(t, reg, "a/b:c", img)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("example.com/layered:v1")
	var docker bytes.Buffer
	if err := tarball.Write(tag, img, &docker); err != nil {
		t.Fatal(err)
	}
	var dockerGz bytes.Buffer
	zw := gzip.NewWriter(&dockerGz)
	zw.Write(docker.Bytes())
	zw.Close()
	lp, err := layout.Write(t.TempDir(), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ociTar := tarDir(t, string(lp))

	for _, c := range []struct {
		name string
		data []byte
	}{{"docker-archive", docker.Bytes()}, {"docker-archive.gz", dockerGz.Bytes()}, {"oci-layout", ociTar}} {
		t.Run(c.name, func(t *testing.T) {
			var pl progressLog
			tpl, err := m.Build(ctx, BuildRequest{Name: "arch", Source: SourceArchive, Path: writeTemp(t, c.data)}, pl.fn)
			if err != nil {
				t.Fatal(err)
			}
			checkLayered(t, tpl)
			// Same config: the same tree as the pulled image, built once.
			if tpl.Digest != pulled.Digest || pl.count("cached") != 1 {
				t.Errorf("digest %s vs pulled %s; stages %v", tpl.Digest, pulled.Digest, pl.stages)
			}
		})
	}

	t.Run("built-from-archive", func(t *testing.T) {
		m2 := newImageManager(t, Options{})
		tpl, err := m2.Build(ctx, BuildRequest{Name: "oci", Source: SourceArchive, Path: writeTemp(t, ociTar)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkLayered(t, tpl)
		tpl2, err := m2.Build(ctx, BuildRequest{Name: "docker", Source: SourceArchive, Path: writeTemp(t, docker.Bytes())}, nil)
		if err != nil || tpl2.Digest != tpl.Digest {
			t.Errorf("docker-archive after OCI layout: %v %s %s", err, tpl2.Digest, tpl.Digest)
		}
		assertEmptyDir(t, m2.tmpDir())
	})

	t.Run("not-an-archive", func(t *testing.T) {
		_, err := m.Build(ctx, BuildRequest{Name: "x", Source: SourceArchive, Path: writeTemp(t, mkTar(t, goodTarEntries(), false))}, nil)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("rootfs tarball as image archive: %v", err)
		}
	})
}

// tarDir packs a directory (an OCI layout) into tar bytes.
func tarDir(t *testing.T, root string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			tw.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tw.Close()
	return buf.Bytes()
}

func TestImageRegistryAuth(t *testing.T) {
	ctx := context.Background()
	reg := testRegistry(t, "alice:s3cret")
	ref := push(t, reg, "private/img:1", mkImage(t, [][]byte{mkTar(t, []tarEntry{file("hello", "world")}, false)}, v1.Config{}),
		remote.WithAuth(authn.FromConfig(authn.AuthConfig{Username: "alice", Password: "s3cret"})))

	anon := newImageManager(t, Options{})
	if _, err := anon.Build(ctx, BuildRequest{Name: "p", Source: SourceImage, Image: ref}, nil); err == nil {
		t.Fatal("private image pulled without credentials")
	}
	for _, form := range []string{
		fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg, base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))),
		fmt.Sprintf(`{"auths":{"http://%s/v2/":{"username":"alice","password":"s3cret"}}}`, reg),
	} {
		cfg := filepath.Join(t.TempDir(), "config.json")
		os.WriteFile(cfg, []byte(form), 0o600)
		m := newImageManager(t, Options{DockerConfig: cfg})
		tpl, err := m.Build(ctx, BuildRequest{Name: "p", Source: SourceImage, Image: ref}, nil)
		if err != nil {
			t.Fatalf("with %s: %v", form, err)
		}
		if b, _ := os.ReadFile(filepath.Join(tpl.RootfsDir, "hello")); string(b) != "world" {
			t.Errorf("content %q", b)
		}
	}
	cfg := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg, base64.StdEncoding.EncodeToString([]byte("alice:wrong")))), 0o600)
	m := newImageManager(t, Options{DockerConfig: cfg})
	if _, err := m.Build(ctx, BuildRequest{Name: "p", Source: SourceImage, Image: ref}, nil); err == nil {
		t.Error("pulled with a wrong password")
	}
}

func TestImagePrivateRegistryRefused(t *testing.T) {
	m := newTestManager(t, Options{DockerConfig: filepath.Join(t.TempDir(), "none.json")})
	reg := testRegistry(t, "")
	ref := push(t, reg, "x/y:z", mkImage(t, [][]byte{mkTar(t, []tarEntry{file("a", "b")}, false)}, v1.Config{}))
	_, err := m.Build(context.Background(), BuildRequest{Name: "p", Source: SourceImage, Image: ref}, nil)
	if !errors.Is(err, ErrPrivateRegistry) {
		t.Errorf("loopback registry: %v, want ErrPrivateRegistry", err)
	}
	for _, bad := range []string{"", "UPPER/case", "a b", strings.Repeat("a", 600)} {
		if _, err := m.Build(context.Background(), BuildRequest{Name: "p", Source: SourceImage, Image: bad}, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("reference %q: %v", bad, err)
		}
	}
}

// TestHostileImages pushes one malicious image per case; each must fail or
// be neutralised with nothing written (or removed) outside the staging tree.
func TestHostileImages(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	huge := func() []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Size: 1 << 40, Mode: 0o644})
		tw.Flush()
		return append(buf.Bytes(), make([]byte, 4096)...)
	}
	one := func(e ...tarEntry) [][]byte { return [][]byte{mkTar(t, e, false)} }
	cases := []struct {
		name    string
		layers  [][]byte
		opts    Options
		wantErr error                // nil: the build may succeed (neutralised) or fail
		check   func(root string)    // when the build succeeded
		cfg     func(*v1.ConfigFile) // tamper with the config
	}{
		{name: "absolute-path", layers: one(file(outside+"/pwned", "x")), check: func(root string) {
			if b, _ := os.ReadFile(filepath.Join(root, outside, "pwned")); string(b) != "x" {
				t.Errorf("absolute name not made relative")
			}
		}},
		{name: "dotdot", layers: one(file("../../../../"+outside+"/pwned", "x")), wantErr: ErrUnsafeInput},
		{name: "dotdot-inner", layers: one(file("a/../../pwned", "x")), wantErr: ErrUnsafeInput},
		{name: "symlink-abs-then-write", layers: one(symlink("esc", outside), file("esc/pwned", "x"))},
		{name: "symlink-rel-then-write", layers: one(symlink("esc", "../../../../../../"+outside), file("esc/pwned", "x"))},
		{name: "symlink-lower-layer-write-upper", layers: [][]byte{
			mkTar(t, []tarEntry{symlink("esc", outside)}, false),
			mkTar(t, []tarEntry{file("esc/pwned", "x")}, false)}},
		{name: "symlink-then-hardlink-through", layers: one(symlink("esc", outside), tarEntry{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "esc/victim"}}), wantErr: ErrUnsafeInput},
		{name: "device-nodes", layers: one(
			tarEntry{hdr: tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o666}},
			tarEntry{hdr: tar.Header{Name: "dev/mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666}},
			tarEntry{hdr: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo}},
			file("ok", "fine")), check: func(root string) {
			if got := listTree(t, root); !slices.Equal(got, []string{"ok f fine"}) {
				t.Errorf("device nodes not skipped: %q", got)
			}
		}},
		{name: "huge-file-header", layers: [][]byte{huge()}, wantErr: ErrLimit},
		{name: "files-over-limit", layers: [][]byte{
			mkTar(t, []tarEntry{file("a", strings.Repeat("x", 600))}, false),
			mkTar(t, []tarEntry{file("b", strings.Repeat("y", 600))}, false)}, opts: Options{MaxBytes: 1000}, wantErr: ErrLimit},
		{name: "entries-over-limit", layers: [][]byte{
			mkTar(t, []tarEntry{file("a", "1"), file("b", "2")}, false),
			mkTar(t, []tarEntry{file("c", "3"), file("d", "4")}, false)}, opts: Options{MaxEntries: 3}, wantErr: ErrLimit},
		{name: "hardlink-outside-abs", layers: one(tarEntry{hdr: tar.Header{Name: "pw", Typeflag: tar.TypeLink, Linkname: victim}}), wantErr: ErrUnsafeInput},
		{name: "hardlink-outside-rel", layers: one(tarEntry{hdr: tar.Header{Name: "pw", Typeflag: tar.TypeLink, Linkname: "../../../../../" + victim}}), wantErr: ErrUnsafeInput},
		{name: "whiteout-dotdot", layers: [][]byte{
			mkTar(t, []tarEntry{file("a/x", "1")}, false),
			mkTar(t, []tarEntry{file("a/.wh..", "")}, false)}, wantErr: ErrUnsafeInput},
		{name: "whiteout-through-symlink", layers: [][]byte{
			mkTar(t, []tarEntry{symlink("esc", outside)}, false),
			mkTar(t, []tarEntry{file("esc/.wh.victim", "")}, false)}},
		{name: "opaque-through-symlink", layers: [][]byte{
			mkTar(t, []tarEntry{symlink("esc", outside), symlink("rel", "../../../../../../"+outside)}, false),
			mkTar(t, []tarEntry{file("esc/.wh..wh..opq", ""), file("rel/.wh..wh..opq", "")}, false)}},
		{name: "uid-out-of-range", layers: one(tarEntry{hdr: tar.Header{Name: "a", Uid: 1 << 20}, body: "x"}), wantErr: ErrUnsafeInput},
		{name: "diff-id-mismatch", layers: one(file("a", "b")), wantErr: ErrUnsafeInput, cfg: func(c *v1.ConfigFile) {
			c.RootFS.DiffIDs[0], _ = v1.NewHash("sha256:" + strings.Repeat("ab", 32))
		}},
		{name: "diff-id-count", layers: one(file("a", "b")), wantErr: ErrUnsafeInput, cfg: func(c *v1.ConfigFile) {
			c.RootFS.DiffIDs = append(c.RootFS.DiffIDs, c.RootFS.DiffIDs[0])
		}},
		{name: "env-with-nul", layers: one(file("a", "b")), wantErr: ErrUnsafeInput, cfg: func(c *v1.ConfigFile) {
			c.Config.Env = []string{"A=b\x00c"}
		}},
		{name: "other-os", layers: one(file("a", "b")), wantErr: ErrUnsupported, cfg: func(c *v1.ConfigFile) { c.OS = "windows" }},
		{name: "huge-config", layers: one(file("a", "b")), wantErr: ErrLimit, cfg: func(c *v1.ConfigFile) {
			c.Config.Env = []string{"A=" + strings.Repeat("x", 5<<20)}
		}},
	}
	reg := testRegistry(t, "")
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
				t.Fatal(err)
			}
			m := newImageManager(t, c.opts)
			img := mkImage(t, c.layers, v1.Config{})
			if c.cfg != nil {
				cf, err := img.ConfigFile()
				if err != nil {
					t.Fatal(err)
				}
				cf = cf.DeepCopy()
				c.cfg(cf)
				if img, err = mutate.ConfigFile(img, cf); err != nil {
					t.Fatal(err)
				}
			}
			ref := push(t, reg, fmt.Sprintf("hostile/c%d:latest", i), img)
			tpl, err := m.Build(context.Background(), BuildRequest{Name: "h", Source: SourceImage, Image: ref}, nil)
			switch {
			case c.wantErr != nil && !errors.Is(err, c.wantErr):
				t.Errorf("error %v, want %v", err, c.wantErr)
			case err != nil:
				t.Logf("rejected: %v", err)
				assertEmptyDir(t, m.rootfsRoot())
				assertEmptyDir(t, m.namesDir())
			default:
				t.Logf("neutralised: %q", listTree(t, tpl.RootfsDir))
				if c.check != nil {
					c.check(tpl.RootfsDir)
				}
			}
			assertEmptyDir(t, m.tmpDir())
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 || ents[0].Name() != "victim" {
				t.Errorf("outside dir changed: %v", ents)
			}
			if b, _ := os.ReadFile(victim); string(b) != "host" {
				t.Errorf("victim changed: %q", b)
			}
			var st syscall.Stat_t
			if syscall.Stat(victim, &st) == nil && st.Nlink != 1 {
				t.Errorf("victim has %d links", st.Nlink)
			}
		})
	}
}

func TestImageZstdAndUncompressedLayers(t *testing.T) {
	m := newImageManager(t, Options{})
	reg := testRegistry(t, "")
	b0 := mkTar(t, []tarEntry{file("f0", "layer 0")}, false)
	zst, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b0)), nil },
		tarball.WithCompression(compression.ZStd))
	if err != nil {
		t.Fatal(err)
	}
	plain := static.NewLayer(mkTar(t, []tarEntry{file("f1", "layer 1")}, false), types.OCIUncompressedLayer)
	img, err := mutate.AppendLayers(empty.Image, zst, plain)
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := m.Build(context.Background(), BuildRequest{Name: "z", Source: SourceImage, Image: push(t, reg, "z/z:1", img)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := listTree(t, tpl.RootfsDir); !slices.Equal(got, []string{"f0 f layer 0", "f1 f layer 1"}) {
		t.Errorf("tree %q", got)
	}
}

func TestImageBuildCancelled(t *testing.T) {
	m := newImageManager(t, Options{})
	reg := testRegistry(t, "")
	ref := push(t, reg, "c/c:1", layeredImage(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := m.Build(ctx, BuildRequest{Name: "c", Source: SourceImage, Image: ref}, func(stage string, done, total int64, msg string) {
		if stage == "pull" {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled pull: %v", err)
	}
	assertEmptyDir(t, m.tmpDir())
	assertEmptyDir(t, m.rootfsRoot())
	assertEmptyDir(t, m.namesDir())
	// The same build then succeeds.
	tpl, err := m.Build(context.Background(), BuildRequest{Name: "c", Source: SourceImage, Image: ref}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkLayered(t, tpl)
}

// A registry that serves a blob other than the one its digest names fails
// the build, and nothing is committed.
func TestImageTamperedBlob(t *testing.T) {
	m := newImageManager(t, Options{})
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tamper := "" // the digest whose blob is corrupted
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tamper != "" && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+tamper) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			b := rec.Body.Bytes()
			if len(b) > 0 {
				b[len(b)-1] ^= 0xff
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(b)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	img := mkImage(t, [][]byte{mkTar(t, []tarEntry{file("a", "b")}, false)}, v1.Config{})
	ref := push(t, strings.TrimPrefix(srv.URL, "http://"), "t/t:1", img)
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []v1.Hash{mf.Config.Digest, mf.Layers[0].Digest} {
		tamper = d.String()
		_, err := m.Build(context.Background(), BuildRequest{Name: "t", Source: SourceImage, Image: ref}, nil)
		if err == nil {
			t.Fatalf("tampered blob %s accepted", d)
		}
		t.Logf("rejected: %v", err)
		assertEmptyDir(t, m.tmpDir())
		assertEmptyDir(t, m.rootfsRoot())
		assertEmptyDir(t, m.namesDir())
	}
}

// TestHostileArchives covers docker-archive and OCI-layout tarballs that lie.
func TestHostileArchives(t *testing.T) {
	img := mkImage(t, [][]byte{mkTar(t, []tarEntry{file("a", "b")}, false)}, v1.Config{})
	raw, _ := img.RawConfigFile()
	cfgDigest, _ := img.ConfigName()
	layers, _ := img.Layers()
	lrc, _ := layers[0].Compressed()
	layerBytes, _ := io.ReadAll(lrc)
	ld, _ := layers[0].Digest()
	mfRaw, _ := img.RawManifest()
	md, _ := img.Digest()
	desc := func(d v1.Hash, size int64) string {
		return fmt.Sprintf(`{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":%q,"size":%d}`, d, size)
	}
	index := func(entries ...string) string {
		return `{"schemaVersion":2,"manifests":[` + strings.Join(entries, ",") + `]}`
	}
	oci := func(idx string, blobs map[v1.Hash][]byte) []byte {
		ents := []tarEntry{file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`), file("index.json", idx)}
		for d, b := range blobs {
			ents = append(ents, file("blobs/sha256/"+d.Hex, string(b)))
		}
		return mkTar(t, ents, false)
	}
	good := map[v1.Hash][]byte{md: mfRaw, cfgDigest: raw, ld: layerBytes}
	corrupt := bytes.Clone(layerBytes)
	corrupt[len(corrupt)/2] ^= 0xff
	many := make([]string, 2000)
	for i := range many {
		many[i] = desc(md, int64(len(mfRaw)))
	}
	docker := func(manifest string) []byte {
		return mkTar(t, []tarEntry{file("manifest.json", manifest), file("config.json", string(raw)), file("layer.tar", string(layerBytes))}, false)
	}
	cases := []struct {
		name    string
		data    []byte
		wantErr error
	}{
		{"oci-good", oci(index(desc(md, int64(len(mfRaw)))), good), nil},
		{"oci-corrupt-layer", oci(index(desc(md, int64(len(mfRaw)))), map[v1.Hash][]byte{md: mfRaw, cfgDigest: raw, ld: corrupt}), ErrUnsafeInput},
		{"oci-wrong-manifest-size", oci(index(desc(md, int64(len(mfRaw))+1)), good), ErrUnsafeInput},
		{"oci-missing-blob", oci(index(desc(md, int64(len(mfRaw)))), map[v1.Hash][]byte{md: mfRaw}), ErrInvalid},
		{"oci-index-fanout", oci(index(many...), good), ErrLimit},
		{"oci-huge-index", oci(strings.Repeat(" ", 5<<20)+index(), good), ErrLimit},
		{"oci-no-image", oci(index(), good), ErrInvalid},
		{"docker-good", docker(`[{"Config":"config.json","Layers":["layer.tar"]}]`), nil},
		{"docker-two-images", docker(`[{"Config":"config.json","Layers":["layer.tar"]},{"Config":"config.json","Layers":["layer.tar"]}]`), ErrInvalid},
		{"docker-dotdot-layer", docker(`[{"Config":"config.json","Layers":["../../etc/passwd"]}]`), ErrUnsafeInput},
		{"docker-abs-config", docker(`[{"Config":"/etc/passwd","Layers":["layer.tar"]}]`), ErrInvalid},
		{"docker-layer-count", docker(`[{"Config":"config.json","Layers":["layer.tar","layer.tar"]}]`), ErrUnsafeInput},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newImageManager(t, Options{})
			tpl, err := m.Build(context.Background(), BuildRequest{Name: "a", Source: SourceArchive, Path: writeTemp(t, c.data)}, nil)
			if c.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if b, _ := os.ReadFile(filepath.Join(tpl.RootfsDir, "a")); string(b) != "b" {
					t.Errorf("content %q", b)
				}
				return
			}
			if !errors.Is(err, c.wantErr) {
				t.Errorf("error %v, want %v", err, c.wantErr)
			}
			t.Logf("rejected: %v", err)
			assertEmptyDir(t, m.tmpDir())
			assertEmptyDir(t, m.rootfsRoot())
		})
	}
}
