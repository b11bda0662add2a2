package snapshot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Backend is a blob store holding snapshot objects by key: chunks
// ("chunks/<2 hex>/<64 hex>") and manifests ("manifests/<64 hex>"). A
// Store keeps its objects on a local directory; a shared Backend (a
// directory several nodes mount, or S3-compatible object storage) lets a
// snapshot captured on one node be restored on another (Store.SetShared).
//
// A shared backend is trusted less than local disk: the Store checks every
// object it reads from one against its digest, and bounds its size.
type Backend interface {
	// Put stores data under key. It is atomic: a reader sees the whole
	// object or none (a crash leaves no partial object under key).
	Put(ctx context.Context, key string, data []byte) error
	// Get returns the object, refusing one larger than max bytes. A
	// missing object is an error wrapping fs.ErrNotExist.
	Get(ctx context.Context, key string, max int64) ([]byte, error)
	// Stat describes an object (fs.ErrNotExist when missing).
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// List calls fn for every object whose key starts with prefix.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
	// Delete removes an object (no error when it is missing).
	Delete(ctx context.Context, key string) error
	// String names the store without credentials: nodes that print the
	// same name share their snapshots.
	String() string
}

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// keyRE accepts the keys a Store uses (and a few more of the same shape):
// lower-case slash-separated names of [a-z0-9._-], no "." or ".." parts.
var keyRE = regexp.MustCompile(`^[a-z0-9_-][a-z0-9._-]{0,127}(/[a-z0-9_-][a-z0-9._-]{0,127}){0,3}$`)

func checkKey(key string) error {
	if !keyRE.MatchString(key) || strings.Contains(key, "..") {
		return fmt.Errorf("snapshot store: bad object key %.100q", key)
	}
	return nil
}

func chunkKey(d string) string    { return "chunks/" + d[:2] + "/" + d }
func manifestKey(d string) string { return "manifests/" + d }

// OpenBackend opens a snapshot store named by spec:
//
//	dir:/path                          a directory (local, or shared by the
//	                                   nodes of one machine or over NFS)
//	s3://bucket[/prefix][?endpoint=host:port&region=r&insecure=true]
//	                                   S3-compatible object storage;
//	                                   credentials from AWS_ACCESS_KEY_ID,
//	                                   AWS_SECRET_ACCESS_KEY (and
//	                                   AWS_SESSION_TOKEN) in env
//
// It checks the store is reachable (the bucket exists, the directory is
// writable) before returning.
func OpenBackend(ctx context.Context, spec string, env func(string) string) (Backend, error) {
	if env == nil {
		env = os.Getenv
	}
	switch {
	case strings.HasPrefix(spec, "dir:"):
		return OpenDirBackend(strings.TrimPrefix(spec, "dir:"))
	case strings.HasPrefix(spec, "s3://"):
		u, err := url.Parse(spec)
		if err != nil {
			return nil, fmt.Errorf("snapshot store %q: %w", redact(spec), err)
		}
		return openS3(ctx, u, env)
	}
	return nil, fmt.Errorf("snapshot store %q: want dir:/path or s3://bucket/prefix?endpoint=host:port", redact(spec))
}

// redact drops anything that looks like a credential from a spec for
// error messages.
func redact(spec string) string {
	if u, err := url.Parse(spec); err == nil && u.User != nil {
		u.User = nil
		return u.String()
	}
	return spec
}

// DirBackend keeps objects as files under a directory. Writes go to a
// temp file in the same directory tree, are fsync'd and renamed into
// place, so several processes (nodes on one machine, or machines over
// NFS) may share it: none ever sees a partial object.
type DirBackend struct{ dir string }

// OpenDirBackend opens (creating if needed) a directory backend.
func OpenDirBackend(dir string) (*DirBackend, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("snapshot store dir:%.200q: want an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	for _, d := range []string{dir, filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
	}
	// Temp files a crash left behind; only old ones: another node may be
	// writing one now.
	if ents, err := os.ReadDir(filepath.Join(dir, "tmp")); err == nil {
		for _, e := range ents {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Hour {
				_ = os.Remove(filepath.Join(dir, "tmp", e.Name()))
			}
		}
	}
	return &DirBackend{dir: dir}, nil
}

func (b *DirBackend) String() string { return "dir:" + b.dir }

func (b *DirBackend) path(key string) string { return filepath.Join(b.dir, filepath.FromSlash(key)) }

// Put implements Backend.
func (b *DirBackend) Put(ctx context.Context, key string, data []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(b.dir, "tmp", hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync() // durable before it is visible
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	final := b.path(key)
	if err == nil {
		if err = os.Rename(tmp, final); errors.Is(err, fs.ErrNotExist) {
			if err = os.MkdirAll(filepath.Dir(final), 0o700); err == nil {
				err = os.Rename(tmp, final)
			}
		}
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("snapshot store: put %s: %w", key, err)
	}
	if d, err := os.Open(filepath.Dir(final)); err == nil {
		_ = d.Sync() // the rename itself
		d.Close()
	}
	return nil
}

// Get implements Backend.
func (b *DirBackend) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	f, err := os.Open(b.path(key))
	if err != nil {
		return nil, fmt.Errorf("snapshot store: get %s: %w", key, err)
	}
	defer f.Close()
	return readBounded(f, key, max)
}

func readBounded(r io.Reader, key string, max int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot store: get %s: %w", key, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%w: object %s larger than %d bytes", ErrCorrupt, key, max)
	}
	return data, nil
}

// Stat implements Backend.
func (b *DirBackend) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	if err := checkKey(key); err != nil {
		return ObjectInfo{}, err
	}
	fi, err := os.Stat(b.path(key))
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("snapshot store: stat %s: %w", key, err)
	}
	return ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// List implements Backend (in key order).
func (b *DirBackend) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	var out []ObjectInfo
	err := filepath.WalkDir(b.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(b.dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "tmp" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasPrefix(rel, prefix) || checkKey(rel) != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		out = append(out, ObjectInfo{Key: rel, Size: fi.Size(), ModTime: fi.ModTime()})
		return nil
	})
	if err != nil {
		return fmt.Errorf("snapshot store: list: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	for _, o := range out {
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

// Delete implements Backend.
func (b *DirBackend) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := os.Remove(b.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot store: delete %s: %w", key, err)
	}
	_ = os.Remove(filepath.Dir(b.path(key))) // only when empty
	return nil
}
