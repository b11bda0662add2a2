package vmimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// BootSpec says how to build a VM driver's boot files.
type BootSpec struct {
	Dir       string   // cache directory
	Kernel    string   // Debian vmlinuz to extract the uncompressed kernel from
	Busybox   string   // busybox-static for the initramfs
	ModDir    string   // kernel modules the initramfs loads
	AgentPath string   // the agent binary, put on its own disk
	AgentArgs []string // how /init starts the agent (transport flags)
	Flavor    string   // distinguishes initramfs variants in the cache ("", "vsock")
}

// Boot is the set of files every VM of a driver boots from.
type Boot struct{ Vmlinux, Initramfs, AgentDisk string }

// BuildBoot builds (once, cached on disk by what they are made from) the
// uncompressed kernel, the initramfs and the agent disk.
func BuildBoot(ctx context.Context, s BootSpec) (Boot, error) {
	name := "initramfs-"
	if s.Flavor != "" {
		name += s.Flavor + "-"
	}
	b := Boot{
		Vmlinux: filepath.Join(s.Dir, "vmlinux-"+CacheKey(s.Kernel)),
		// The init script and module list are part of the key: a changed
		// /init must not boot from an old cached initramfs.
		Initramfs: filepath.Join(s.Dir, name+CacheKey(s.Busybox, s.ModDir, initScript, strings.Join(Modules, ","), strings.Join(s.AgentArgs, " "))+".cpio"),
		AgentDisk: filepath.Join(s.Dir, "agent-"+CacheKey(s.AgentPath)+".ext4"),
	}
	if _, err := os.Stat(b.Vmlinux); err != nil {
		if err := ExtractVmlinux(ctx, s.Kernel, b.Vmlinux); err != nil {
			return b, err
		}
	}
	if _, err := os.Stat(b.Initramfs); err != nil {
		spec := InitramfsSpec{Busybox: s.Busybox, ModDir: s.ModDir, AgentArgs: s.AgentArgs}
		if err := Initramfs(spec, b.Initramfs); err != nil {
			return b, err
		}
	}
	if _, err := os.Stat(b.AgentDisk); err != nil {
		if err := AgentDisk(ctx, s.AgentPath, b.AgentDisk); err != nil {
			return b, err
		}
	}
	return b, nil
}
