package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Import commits a tree another node built under the builder's digest and
// build time; a tree already here is not written again, and a failed fill
// leaves neither tree nor name.
func TestImport(t *testing.T) {
	m := newTestManager(t, Options{NoSync: true})
	ctx := context.Background()
	digest := "sha256:" + strings.Repeat("ab", 32)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	fills := 0
	fill := func(ctx context.Context, dir string) error {
		fills++
		return os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("built-by-run\n"), 0o644)
	}
	req := ImportRequest{Name: "~p1~hello", Digest: digest, Source: "buildfile", CreatedAt: at, Defaults: Defaults{Env: map[string]string{"K": "v"}}}
	tp, err := m.Import(ctx, req, fill)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Get("~p1~hello")
	if err != nil || got.Digest != digest || !got.CreatedAt.Equal(at) || got.Source != "buildfile" || got.Defaults.Env["K"] != "v" || got.Files == 0 {
		t.Fatalf("imported: %+v %v", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(tp.RootfsDir, "hello.txt")); err != nil || string(b) != "built-by-run\n" {
		t.Fatalf("tree: %q %v", b, err)
	}
	req.Name = "~p2~hello"
	if _, err := m.Import(ctx, req, fill); err != nil || fills != 1 {
		t.Fatalf("second import of the tree: %v, %d fills", err, fills)
	}
	boom := errors.New("boom")
	bad := ImportRequest{Name: "bad", Digest: "sha256:" + strings.Repeat("cd", 32), Source: "busybox", CreatedAt: at}
	if _, err := m.Import(ctx, bad, func(context.Context, string) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("failed fill: %v", err)
	}
	if _, err := m.Get("bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a failed import left a name: %v", err)
	}
	if _, err := os.Lstat(m.rootfsPath(strings.Repeat("cd", 32))); !os.IsNotExist(err) {
		t.Fatalf("a failed import left a tree: %v", err)
	}
	if _, err := m.Import(ctx, ImportRequest{Name: "x", Digest: "sha256:nothex"}, fill); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad digest: %v", err)
	}
}
