package template

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFilesDigest(t *testing.T) {
	a := []File{{Path: "opt/a.py", Mode: 0o644, Data: []byte("x")}, {Path: "opt/b.js", Mode: 0o644, Data: []byte("y")}}
	d1, err := filesDigest(a)
	if err != nil || d1 == "" {
		t.Fatalf("digest: %q %v", d1, err)
	}
	// Order does not matter; content and mode do.
	if d, _ := filesDigest([]File{a[1], a[0]}); d != d1 {
		t.Errorf("order changed the digest")
	}
	if d, _ := filesDigest([]File{a[0], {Path: "opt/b.js", Mode: 0o644, Data: []byte("z")}}); d == d1 {
		t.Errorf("content change kept the digest")
	}
	if d, _ := filesDigest([]File{a[0], {Path: "opt/b.js", Mode: 0o755, Data: []byte("y")}}); d == d1 {
		t.Errorf("mode change kept the digest")
	}
	for _, bad := range [][]File{
		{{Path: "/etc/passwd"}}, {{Path: "../x"}}, {{Path: "a/../../x"}}, {{Path: "."}}, {{Path: ""}},
		{{Path: "a"}, {Path: "a"}}, {{Path: "a", Mode: 0o4755}}, {{Path: "a", Data: make([]byte, maxFileBytes+1)}},
	} {
		if _, err := filesDigest(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v: got %v, want ErrInvalid", bad[0].Path, err)
		}
	}
}

func TestWriteFilesStaysInTree(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	// A symlinked directory in the tree must not carry the write outside.
	if err := os.Symlink(outside, filepath.Join(root, "opt")); err != nil {
		t.Fatal(err)
	}
	err := writeFiles(root, []File{{Path: "opt/space/x.py", Mode: 0o644, Data: []byte("x")}})
	if err == nil {
		t.Fatalf("write through a symlink out of the tree succeeded")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("wrote outside the tree: %v", ents)
	}
	if err := writeFiles(root, []File{{Path: "usr/share/x/y.txt", Mode: 0o600, Data: []byte("hi")}}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "usr/share/x/y.txt"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("written file: %v %v", fi, err)
	}
}

func TestInterpreterRequest(t *testing.T) {
	req, err := builtinRequest(BuiltinCodeInterpreter)
	if err != nil {
		t.Fatal(err)
	}
	if req.Source != SourceDebian || len(req.Files) != 3 || len(req.Defaults.Cmd) == 0 || len(req.Defaults.Ready) == 0 {
		t.Fatalf("request: %+v", req)
	}
	if !strings.Contains(strings.Join(req.Defaults.Ready, " "), "49999/health") {
		t.Errorf("ready check %v does not ask the server's health", req.Defaults.Ready)
	}
	if _, err := filesDigest(req.Files); err != nil {
		t.Fatal(err)
	}
}
