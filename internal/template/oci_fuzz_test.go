package template

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzApplyLayers applies a fixed lower layer and then arbitrary bytes as an
// upper layer (whiteouts, opaque markers and all) and checks that nothing
// outside the destination is written, removed or linked, and that no
// whiteout marker is ever materialised.
func FuzzApplyLayers(f *testing.F) {
	f.Add(mkTar(f, []tarEntry{{hdr: tar.Header{Name: "etc/.wh.conf"}}, {hdr: tar.Header{Name: "app/.wh..wh..opq"}}}, false))
	f.Add(mkTar(f, []tarEntry{{hdr: tar.Header{Name: "esc/.wh.secret"}}}, false))
	f.Add(mkTar(f, []tarEntry{{hdr: tar.Header{Name: "up/.wh..wh..opq"}}, {hdr: tar.Header{Name: "up/outside/x"}, body: "x"}}, false))
	f.Add(mkTar(f, []tarEntry{{hdr: tar.Header{Name: "app"}, body: "dir becomes file"}, {hdr: tar.Header{Name: ".wh.."}}}, false))
	f.Add(mkTar(f, []tarEntry{{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "esc/secret"}}}, false))
	f.Add([]byte{})
	lower := mkTar(f, []tarEntry{
		{hdr: tar.Header{Name: "etc/conf"}, body: "c"},
		{hdr: tar.Header{Name: "app/sub/f"}, body: "f"},
		{hdr: tar.Header{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: "../outside"}},
		{hdr: tar.Header{Name: "abs", Typeflag: tar.TypeSymlink, Linkname: "/"}},
		{hdr: tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: ".."}},
	}, false)
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dst := filepath.Join(base, "root")
		outside := filepath.Join(base, "outside")
		for _, d := range []string{dst, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		secret := filepath.Join(outside, "secret")
		if err := os.WriteFile(secret, []byte("secret"), 0o644); err != nil {
			t.Fatal(err)
		}
		root, err := os.OpenRoot(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		lim := extractLimits{maxBytes: 1 << 20, maxEntries: 1000, uidCount: 65536, chown: os.Geteuid() == 0}
		a := newLayerApplier(root, lim)
		if err := a.apply(context.Background(), bytes.NewReader(lower), nil); err != nil {
			t.Fatal(err)
		}
		if err := a.apply(context.Background(), bytes.NewReader(data), nil); err == nil {
			a.finish()
		}
		ents, _ := os.ReadDir(base)
		oents, _ := os.ReadDir(outside)
		if b, err := os.ReadFile(secret); len(ents) != 2 || len(oents) != 1 || err != nil || string(b) != "secret" {
			t.Fatalf("outside changed: %v %v %q %v", ents, oents, b, err)
		}
		filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if strings.HasPrefix(d.Name(), whiteoutPrefix) {
				t.Fatalf("whiteout materialised: %s", p)
			}
			if d.Type().IsRegular() && inode(t, p) == inode(t, secret) {
				t.Fatalf("hardlink to a file outside: %s", p)
			}
			return nil
		})
	})
}
