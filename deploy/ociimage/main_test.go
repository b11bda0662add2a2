package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readLayout returns the files of an image layout tar by name.
func readLayout(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = b
	}
}

// TestLayout writes an image twice from the same inputs and checks that the
// bytes are identical and that every reference in it resolves to a blob
// with that digest: what `ctr images import` verifies.
func TestLayout(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var base bytes.Buffer
	tw := tar.NewWriter(&base)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755})
	tw.Close()
	basePath := filepath.Join(dir, "base.tar")
	if err := os.WriteFile(basePath, base.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options{name: "docker.io/library/x:v1", base: basePath, files: fileList{"/usr/local/bin/tool=" + bin},
		entrypoint: `["/usr/local/bin/tool"]`, workdir: "/", epoch: time.Unix(1700000000, 0).UTC()}
	var outs [2]string
	for i := range outs {
		o.out = filepath.Join(dir, "img"+string(rune('a'+i))+".tar")
		if err := run(o); err != nil {
			t.Fatal(err)
		}
		outs[i] = o.out
	}
	a, _ := os.ReadFile(outs[0])
	b, _ := os.ReadFile(outs[1])
	if !bytes.Equal(a, b) {
		t.Fatal("two runs with the same inputs wrote different images")
	}

	files := readLayout(t, outs[0])
	for name, data := range files {
		if d, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			sum := sha256.Sum256(data)
			if hex.EncodeToString(sum[:]) != d {
				t.Errorf("blob %s has digest %x", name, sum)
			}
		}
	}
	blob := func(digest string) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
		if !ok {
			t.Fatalf("no blob %s", digest)
		}
		return b
	}
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, files["index.json"])
	}
	if got := index.Manifests[0].Annotations["io.containerd.image.name"]; got != o.name {
		t.Errorf("image name %q, want %q", got, o.name)
	}
	var man struct {
		Config struct{ Digest string }   `json:"config"`
		Layers []struct{ Digest string } `json:"layers"`
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &man); err != nil || len(man.Layers) != 2 {
		t.Fatalf("manifest: %v %+v", err, man)
	}
	var cfg struct {
		Config struct{ Entrypoint []string } `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blob(man.Config.Digest), &cfg); err != nil {
		t.Fatal(err)
	}
	for i, l := range man.Layers {
		if cfg.RootFS.DiffIDs[i] != l.Digest {
			t.Errorf("layer %d: diff_id %s, digest %s (uncompressed: must be equal)", i, cfg.RootFS.DiffIDs[i], l.Digest)
		}
	}
	if !bytes.Equal(blob(man.Layers[0].Digest), base.Bytes()) {
		t.Error("the base layer is not the base tar")
	}
	tr := tar.NewReader(bytes.NewReader(blob(man.Layers[1].Digest)))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
		if h.Name == "usr/local/bin/tool" && h.Mode != 0o755 {
			t.Errorf("tool mode %o, want 755", h.Mode)
		}
	}
	if strings.Join(names, " ") != "usr/ usr/local/ usr/local/bin/ usr/local/bin/tool" {
		t.Errorf("top layer %v", names)
	}
	if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/usr/local/bin/tool" {
		t.Errorf("entrypoint %v", cfg.Config.Entrypoint)
	}
	if err := run(options{out: filepath.Join(dir, "bad.tar"), name: "x:y", files: fileList{"relative=" + bin}}); err == nil {
		t.Error("a relative destination was accepted")
	}
}
