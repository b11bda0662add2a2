// Command ociimage writes an OCI image layout as a tar archive, the form
// `ctr images import` reads, without Docker or a registry: an optional
// base layer (a root filesystem tarball, e.g. from mmdebstrap) and one
// layer of files from this host (the space binaries). Every timestamp is
// the -epoch, so the same inputs give the same image digest.
//
//	go run ./deploy/ociimage -o space.tar -name docker.io/library/space:local \
//	  -base rootfs.tar -file /usr/local/bin/space=bin/space \
//	  -entrypoint '["/usr/bin/tini","--","/usr/local/bin/space"]' -cmd '["server"]'
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

const layerType = "application/vnd.oci.image.layer.v1.tar"

type fileList []string

func (f *fileList) String() string     { return strings.Join(*f, ",") }
func (f *fileList) Set(v string) error { *f = append(*f, v); return nil }

type options struct {
	out, name, base string
	entrypoint, cmd string
	workdir         string
	files, env      fileList
	epoch           time.Time
}

func main() {
	var o options
	var epoch int64
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		epoch, _ = strconv.ParseInt(s, 10, 64)
	}
	flag.StringVar(&o.out, "o", "", "output tar (OCI image layout)")
	flag.StringVar(&o.name, "name", "", "image name, e.g. docker.io/library/space:local")
	flag.StringVar(&o.base, "base", "", "uncompressed root filesystem tar for the first layer (optional)")
	flag.Var(&o.files, "file", "DEST=SRC: a host file at DEST in the top layer (repeatable)")
	flag.Var(&o.env, "env", "KEY=VALUE in the image config (repeatable; PATH has a default)")
	flag.StringVar(&o.entrypoint, "entrypoint", "", "entrypoint as a JSON array")
	flag.StringVar(&o.cmd, "cmd", "", "cmd as a JSON array")
	flag.StringVar(&o.workdir, "workdir", "/", "working directory")
	flag.Int64Var(&epoch, "epoch", epoch, "timestamp of every file and of the image (default $SOURCE_DATE_EPOCH, else 0)")
	flag.Parse()
	o.epoch = time.Unix(epoch, 0).UTC()
	if err := run(o); err != nil {
		slog.Error("ociimage", "err", err)
		os.Exit(1)
	}
}

type blob struct {
	digest string
	size   int64
	data   []byte // nil: the content is the file at path
	path   string
}

func digestOf(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return "", 0, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}

func memBlob(b []byte) blob {
	d, n, _ := digestOf(bytes.NewReader(b))
	return blob{digest: d, size: n, data: b}
}

func run(o options) error {
	if o.out == "" || o.name == "" {
		return errors.New("-o and -name are required")
	}
	var entrypoint, cmd []string
	for _, a := range []struct {
		s   string
		dst *[]string
	}{{o.entrypoint, &entrypoint}, {o.cmd, &cmd}} {
		if a.s != "" {
			if err := json.Unmarshal([]byte(a.s), a.dst); err != nil {
				return fmt.Errorf("entrypoint/cmd %q: %w", a.s, err)
			}
		}
	}
	var layers []blob
	if o.base != "" {
		f, err := os.Open(o.base)
		if err != nil {
			return fmt.Errorf("base: %w", err)
		}
		d, n, err := digestOf(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("base: %w", err)
		}
		layers = append(layers, blob{digest: d, size: n, path: o.base})
	}
	if len(o.files) > 0 {
		b, err := filesLayer(o.files, o.epoch)
		if err != nil {
			return err
		}
		layers = append(layers, memBlob(b))
	}
	if len(layers) == 0 {
		return errors.New("no layers: give -base or -file")
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	env = append(env, o.env...)
	diffIDs := make([]string, len(layers))
	layerDescs := make([]map[string]any, len(layers))
	for i, l := range layers {
		// Uncompressed layers: the diff ID is the digest.
		diffIDs[i] = l.digest
		layerDescs[i] = map[string]any{"mediaType": layerType, "digest": l.digest, "size": l.size}
	}
	config, err := json.Marshal(map[string]any{
		"created":      o.epoch.Format(time.RFC3339),
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Env": env, "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": o.workdir,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	if err != nil {
		return err
	}
	cfg := memBlob(config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg.digest, "size": cfg.size},
		"layers":        layerDescs,
	})
	if err != nil {
		return err
	}
	man := memBlob(manifest)
	tag := o.name[strings.LastIndex(o.name, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []map[string]any{{
			"mediaType": "application/vnd.oci.image.manifest.v1+json",
			"digest":    man.digest, "size": man.size,
			"platform": map[string]string{"architecture": "amd64", "os": "linux"},
			// containerd names the imported image after the first.
			"annotations": map[string]string{
				"io.containerd.image.name":          o.name,
				"org.opencontainers.image.ref.name": tag,
			},
		}},
	})
	if err != nil {
		return err
	}
	return writeLayout(o.out, o.epoch, append(layers, cfg, man), index)
}

// filesLayer is a tar of the -file entries and their parent directories.
func filesLayer(files []string, mtime time.Time) ([]byte, error) {
	type entry struct{ dst, src string }
	var entries []entry
	dirs := map[string]bool{}
	for _, f := range files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(dst) || src == "" {
			return nil, fmt.Errorf("-file %q: want /DEST=SRC", f)
		}
		dst = strings.TrimPrefix(path.Clean(dst), "/")
		entries = append(entries, entry{dst, src})
		for d := path.Dir(dst); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].dst < entries[j].dst })
	var dirList []string
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirList {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		b, err := os.ReadFile(e.src)
		if err != nil {
			return nil, fmt.Errorf("-file %s: %w", e.src, err)
		}
		st, err := os.Stat(e.src)
		if err != nil {
			return nil, err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: e.dst, Mode: int64(st.Mode().Perm()), Size: int64(len(b)), ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeLayout(out string, mtime time.Time, blobs []blob, index []byte) (err error) {
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	tw := tar.NewWriter(f)
	add := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	layout := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	if err := add("oci-layout", int64(len(layout)), bytes.NewReader(layout)); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, b := range blobs {
		if seen[b.digest] {
			continue
		}
		seen[b.digest] = true
		name := "blobs/sha256/" + strings.TrimPrefix(b.digest, "sha256:")
		if b.data != nil {
			err = add(name, b.size, bytes.NewReader(b.data))
		} else {
			var src *os.File
			if src, err = os.Open(b.path); err == nil {
				err = add(name, b.size, src)
				src.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if err := add("index.json", int64(len(index)), bytes.NewReader(index)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
