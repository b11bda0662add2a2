package vmimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// CacheKey names a cached image after what it was built from: each path's
// size and modification time (or the string itself when it is no file).
func CacheKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(h, "%s|%d|%d\n", p, fi.Size(), fi.ModTime().UnixNano())
		} else {
			fmt.Fprintf(h, "%s\n", p)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// RootDisks builds each template's read-only ext4 disk once into Dir and
// shares it among all VMs of that template; concurrent callers for one
// template wait for the first build.
type RootDisks struct {
	Dir string

	mu  sync.Mutex
	per map[string]*sync.Mutex
}

// Get returns the disk image for a template rootfs directory.
func (r *RootDisks) Get(ctx context.Context, rootfs string) (string, error) {
	key := CacheKey(rootfs)
	r.mu.Lock()
	if r.per == nil {
		r.per = map[string]*sync.Mutex{}
	}
	mu := r.per[key]
	if mu == nil {
		mu = &sync.Mutex{}
		r.per[key] = mu
	}
	r.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	p := filepath.Join(r.Dir, "root-"+key+".ext4")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if err := RootDisk(ctx, rootfs, p); err != nil {
		return "", err
	}
	return p, nil
}
