package template

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Build-file layers are whole trees under rootfs/, like every template, so
// a sandbox mounts any of them as its one overlay lower dir. A step's tree
// starts as a hardlink clone of its parent's (sharing every unchanged file's
// data on disk) and then gets the step's changes. Files of a committed tree
// may therefore be shared with other trees: nothing here ever opens an
// existing file for writing or changes its metadata; a changed file is
// unlinked and written anew.

// cloneTree recreates the committed tree src in the empty directory dst:
// directories and symlinks anew (same owner and mode), regular files as
// hard links. src is one of our own committed trees, so a path walk that
// never follows a symlink is safe.
func cloneTree(ctx context.Context, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("template: clone %s: %w", p, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("template: clone %s: %w", p, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("template: clone %s: no stat", p)
		}
		switch {
		case d.IsDir():
			if rel != "." {
				if err := os.Mkdir(target, 0o700); err != nil {
					return fmt.Errorf("template: clone: %w", err)
				}
			}
			if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
				return fmt.Errorf("template: clone: %w", err)
			}
			if err := syscall.Chmod(target, st.Mode&0o7777); err != nil {
				return fmt.Errorf("template: clone: chmod %s: %w", target, err)
			}
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("template: clone: %w", err)
			}
			if err := os.Symlink(link, target); err != nil {
				return fmt.Errorf("template: clone: %w", err)
			}
			if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
				return fmt.Errorf("template: clone: %w", err)
			}
		case d.Type().IsRegular():
			if err := os.Link(p, target); err != nil {
				return fmt.Errorf("template: clone: %w", err)
			}
		}
		return nil
	})
}

// upperStats counts what applyUpper changed.
type upperStats struct {
	entries, removed, skipped int
	bytes                     int64
}

// applyUpper applies a stopped build sandbox's overlay upper dir onto dst
// (a clone of the sandbox's lower tree): overlay whiteouts (char 0:0)
// remove, opaque directories replace, everything else is added or
// replaces. The upper dir was written by untrusted code: it is read only
// through an os.Root, never by following a link, owners must lie in the
// sandbox's uid range (layerBase.., its own block), and the totals are
// bounded like any template input. Owners are shifted onto the tree's
// range (treeBase..), the ids templates are stored with.
func applyUpper(ctx context.Context, upper string, dst *os.Root, lim extractLimits, layerBase, treeBase, uidCount uint32) (upperStats, error) {
	var s upperStats
	src, err := os.OpenRoot(upper)
	if err != nil {
		return s, fmt.Errorf("template: open build layer: %w", err)
	}
	defer src.Close()
	links := map[uint64]string{} // inode → first path, for hard links inside the layer
	var walk func(dir string) error
	walk = func(dir string) error {
		d, err := src.Open(dir)
		if err != nil {
			return fmt.Errorf("template: read build layer %s: %w", dir, err)
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return fmt.Errorf("template: read build layer %s: %w", dir, err)
		}
		slices.Sort(names)
		for _, n := range names {
			if err := ctx.Err(); err != nil {
				return err
			}
			s.entries++
			if s.entries > lim.maxEntries {
				return fmt.Errorf("%w: build step wrote more than %d entries", ErrLimit, lim.maxEntries)
			}
			name := path.Join(dir, n)
			fi, err := src.Lstat(name)
			if err != nil {
				return fmt.Errorf("template: build layer %s: %w", name, err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0 {
				// Overlay whiteout: the lower entry was removed.
				if err := dst.RemoveAll(name); err != nil {
					return fmt.Errorf("template: apply whiteout %s: %w", name, err)
				}
				s.removed++
				continue
			}
			if st.Uid < layerBase || st.Uid-layerBase >= uidCount || st.Gid < layerBase || st.Gid-layerBase >= uidCount {
				return fmt.Errorf("%w: %s is owned by host %d:%d, outside the sandbox range", ErrUnsafeInput, name, st.Uid, st.Gid)
			}
			shifted := *st
			shifted.Uid, shifted.Gid = st.Uid-layerBase+treeBase, st.Gid-layerBase+treeBase
			st = &shifted
			switch {
			case fi.IsDir():
				if err := applyDir(src, dst, name, st); err != nil {
					return err
				}
				if err := walk(name); err != nil {
					return err
				}
			case fi.Mode().IsRegular():
				if first, ok := links[st.Ino]; ok && st.Nlink > 1 {
					if err := dst.RemoveAll(name); err != nil {
						return fmt.Errorf("template: apply %s: %w", name, err)
					}
					if err := dst.Link(first, name); err != nil {
						return fmt.Errorf("template: apply %s: %w", name, err)
					}
					continue
				}
				n, err := applyFile(ctx, src, dst, name, st, lim.maxBytes-s.bytes)
				s.bytes += n
				if err != nil {
					return err
				}
				if st.Nlink > 1 {
					links[st.Ino] = name
				}
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := src.Readlink(name)
				if err != nil {
					return fmt.Errorf("template: build layer %s: %w", name, err)
				}
				if err := dst.RemoveAll(name); err != nil {
					return fmt.Errorf("template: apply %s: %w", name, err)
				}
				if err := dst.Symlink(target, name); err != nil {
					return fmt.Errorf("template: apply %s: %w", name, err)
				}
				if err := dst.Lchown(name, int(st.Uid), int(st.Gid)); err != nil {
					return fmt.Errorf("template: apply %s: %w", name, err)
				}
			default:
				s.skipped++ // fifos, sockets, device nodes: never part of a template
			}
		}
		return nil
	}
	return s, walk(".")
}

// overlay xattrs, in the user namespace's (userxattr) and the host's form.
var (
	opaqueXattrs   = []string{"user.overlay.opaque", "trusted.overlay.opaque"}
	redirectXattrs = []string{"user.overlay.redirect", "trusted.overlay.redirect", "user.overlay.metacopy", "trusted.overlay.metacopy"}
)

func hasXattr(fd int, names []string) (bool, error) {
	buf := make([]byte, 8)
	for _, n := range names {
		_, err := unix.Fgetxattr(fd, n, buf)
		if err == nil || errors.Is(err, unix.ERANGE) {
			return true, nil
		}
		if !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.EPERM) {
			return false, err
		}
	}
	return false, nil
}

func applyDir(src, dst *os.Root, name string, st *syscall.Stat_t) error {
	d, err := src.Open(name)
	if err != nil {
		return fmt.Errorf("template: build layer %s: %w", name, err)
	}
	opaque, err := hasXattr(int(d.Fd()), opaqueXattrs)
	var redirect bool
	if err == nil {
		redirect, err = hasXattr(int(d.Fd()), redirectXattrs)
	}
	d.Close()
	if err != nil {
		return fmt.Errorf("template: build layer %s: xattrs: %w", name, err)
	}
	if redirect {
		return fmt.Errorf("%w: build layer %s uses overlay redirects/metacopy", ErrUnsupported, name)
	}
	if name != "." {
		cur, err := dst.Lstat(name)
		switch {
		case err == nil && (!cur.IsDir() || opaque):
			if err := dst.RemoveAll(name); err != nil {
				return fmt.Errorf("template: apply %s: %w", name, err)
			}
			fallthrough
		case errors.Is(err, os.ErrNotExist):
			if err := dst.Mkdir(name, 0o700); err != nil {
				return fmt.Errorf("template: apply %s: %w", name, err)
			}
		case err != nil:
			return fmt.Errorf("template: apply %s: %w", name, err)
		}
	}
	// Directories are never shared between trees, so changing one is safe.
	if err := dst.Lchown(name, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("template: apply %s: %w", name, err)
	}
	if err := dst.Chmod(name, unixMode(st.Mode)); err != nil {
		return fmt.Errorf("template: apply %s: %w", name, err)
	}
	return nil
}

func applyFile(ctx context.Context, src, dst *os.Root, name string, st *syscall.Stat_t, budget int64) (int64, error) {
	if st.Size > budget {
		return 0, fmt.Errorf("%w: build step wrote more than the byte limit", ErrLimit)
	}
	in, err := src.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, fmt.Errorf("template: build layer %s: %w", name, err)
	}
	defer in.Close()
	if err := sameFile(in, st); err != nil {
		return 0, fmt.Errorf("%w: build layer %s: %w", ErrUnsafeInput, name, err)
	}
	if meta, err := hasXattr(int(in.Fd()), redirectXattrs); err != nil || meta {
		return 0, fmt.Errorf("%w: build layer %s uses overlay metacopy", ErrUnsupported, name)
	}
	if err := dst.RemoveAll(name); err != nil {
		return 0, fmt.Errorf("template: apply %s: %w", name, err)
	}
	out, err := dst.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, fmt.Errorf("template: apply %s: %w", name, err)
	}
	n, err := io.Copy(out, io.LimitReader(&ctxReader{ctx: ctx, r: in}, budget+1))
	if err == nil && n > budget {
		err = fmt.Errorf("%w: build step wrote more than the byte limit", ErrLimit)
	}
	if err == nil {
		err = out.Chown(int(st.Uid), int(st.Gid))
	}
	if err == nil {
		err = unix.Fchmod(int(out.Fd()), st.Mode&0o7777)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, fmt.Errorf("template: apply %s: %w", name, err)
	}
	return n, nil
}

func unixMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&syscall.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

// hashSources hashes COPY sources in the build context: names, types,
// permission bits, link targets and contents, in a fixed order. It is the
// part of a COPY step's cache key that the build file does not show.
func hashSources(ctx context.Context, src *os.Root, srcs []string, lim extractLimits) (string, error) {
	h := sha256.New()
	entries := 0
	var total int64
	var walk func(name string) error
	walk = func(name string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		entries++
		if entries > lim.maxEntries {
			return fmt.Errorf("%w: COPY sources have more than %d entries", ErrLimit, lim.maxEntries)
		}
		fi, err := src.Lstat(name)
		if err != nil {
			return fmt.Errorf("%w: COPY source %s: %w", ErrInvalid, name, err)
		}
		switch {
		case fi.IsDir():
			fmt.Fprintf(h, "d %q %o\n", name, fi.Mode().Perm())
			d, err := src.Open(name)
			if err != nil {
				return fmt.Errorf("template: COPY source %s: %w", name, err)
			}
			names, err := d.Readdirnames(-1)
			d.Close()
			if err != nil {
				return fmt.Errorf("template: COPY source %s: %w", name, err)
			}
			slices.Sort(names)
			for _, n := range names {
				if err := walk(path.Join(name, n)); err != nil {
					return err
				}
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := src.Readlink(name)
			if err != nil {
				return fmt.Errorf("template: COPY source %s: %w", name, err)
			}
			fmt.Fprintf(h, "l %q %q\n", name, t)
		case fi.Mode().IsRegular():
			total += fi.Size()
			if total > lim.maxBytes {
				return fmt.Errorf("%w: COPY sources larger than %d bytes", ErrLimit, lim.maxBytes)
			}
			f, err := src.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
			if err != nil {
				return fmt.Errorf("template: COPY source %s: %w", name, err)
			}
			fh := sha256.New()
			n, err := io.Copy(fh, io.LimitReader(&ctxReader{ctx: ctx, r: f}, fi.Size()+1))
			f.Close()
			if err != nil {
				return fmt.Errorf("template: COPY source %s: %w", name, err)
			}
			fmt.Fprintf(h, "f %q %o %d %x\n", name, fi.Mode().Perm(), n, fh.Sum(nil))
		default:
			fmt.Fprintf(h, "s %q\n", name) // skipped when copying, too
		}
		return nil
	}
	for _, s := range srcs {
		fmt.Fprintf(h, "src %q\n", s)
		if err := walk(s); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%x", h.Sum(nil)), nil
}

// copyInto performs COPY srcs dest into dst (a tree of host ids) with
// Dockerfile semantics: a directory source copies its contents; several
// sources or a dest ending in / name a directory; a relative dest is taken
// from cwd. New files and directories are owned by the sandbox's root
// (host id owner) and keep their permission bits.
func copyInto(ctx context.Context, src, dst *os.Root, srcs []string, dest, cwd string, owner int, lim extractLimits) (int64, error) {
	destIsDir := strings.HasSuffix(dest, "/") || strings.HasSuffix(dest, "/.") || dest == "." || len(srcs) > 1
	if !path.IsAbs(dest) {
		if cwd == "" {
			cwd = "/"
		}
		dest = path.Join(cwd, dest)
	}
	target := strings.TrimPrefix(path.Clean(dest), "/")
	if target == "" {
		target = "."
	}
	var written int64
	entries := 0
	mkdirs := func(name string) error {
		if name == "." {
			return nil
		}
		cur := ""
		for _, part := range strings.Split(name, "/") {
			cur = path.Join(cur, part)
			fi, err := dst.Stat(cur) // a symlink inside the tree is followed (inside only)
			if err == nil {
				if !fi.IsDir() {
					return fmt.Errorf("%w: COPY: %s is not a directory", ErrInvalid, cur)
				}
				continue
			}
			if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("template: COPY: %w", err)
			}
			if err := dst.Mkdir(cur, 0o755); err != nil {
				return fmt.Errorf("template: COPY: %w", err)
			}
			if err := dst.Lchown(cur, owner, owner); err != nil {
				return fmt.Errorf("template: COPY: %w", err)
			}
		}
		return nil
	}
	var cp func(from, to string) error
	cp = func(from, to string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		entries++
		if entries > lim.maxEntries {
			return fmt.Errorf("%w: COPY of more than %d entries", ErrLimit, lim.maxEntries)
		}
		fi, err := src.Lstat(from)
		if err != nil {
			return fmt.Errorf("%w: COPY source %s: %w", ErrInvalid, from, err)
		}
		cur, curErr := dst.Lstat(to)
		switch {
		case fi.IsDir():
			if curErr == nil && !cur.IsDir() {
				if err := dst.RemoveAll(to); err != nil {
					return fmt.Errorf("template: COPY: %w", err)
				}
				curErr = os.ErrNotExist
			}
			if curErr != nil {
				if err := dst.Mkdir(to, 0o700); err != nil {
					return fmt.Errorf("template: COPY: %w", err)
				}
				if err := dst.Lchown(to, owner, owner); err != nil {
					return fmt.Errorf("template: COPY: %w", err)
				}
				if err := dst.Chmod(to, fi.Mode().Perm()); err != nil {
					return fmt.Errorf("template: COPY: %w", err)
				}
			}
			d, err := src.Open(from)
			if err != nil {
				return fmt.Errorf("template: COPY source %s: %w", from, err)
			}
			names, err := d.Readdirnames(-1)
			d.Close()
			if err != nil {
				return fmt.Errorf("template: COPY source %s: %w", from, err)
			}
			slices.Sort(names)
			for _, n := range names {
				if err := cp(path.Join(from, n), path.Join(to, n)); err != nil {
					return err
				}
			}
			return nil
		case fi.Mode()&fs.ModeSymlink != 0, fi.Mode().IsRegular():
			if curErr == nil && cur.IsDir() {
				return fmt.Errorf("%w: COPY: cannot replace directory /%s with a file", ErrInvalid, to)
			}
			// Unlink first: the old file may be shared with other trees.
			if err := dst.RemoveAll(to); err != nil {
				return fmt.Errorf("template: COPY: %w", err)
			}
			if fi.Mode()&fs.ModeSymlink != 0 {
				t, err := src.Readlink(from)
				if err != nil {
					return fmt.Errorf("template: COPY source %s: %w", from, err)
				}
				if err := dst.Symlink(t, to); err != nil {
					return fmt.Errorf("template: COPY: %w", err)
				}
				return dst.Lchown(to, owner, owner)
			}
			if written+fi.Size() > lim.maxBytes {
				return fmt.Errorf("%w: COPY of more than %d bytes", ErrLimit, lim.maxBytes)
			}
			in, err := src.OpenFile(from, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
			if err != nil {
				return fmt.Errorf("template: COPY source %s: %w", from, err)
			}
			defer in.Close()
			out, err := dst.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
			if err != nil {
				return fmt.Errorf("template: COPY: %w", err)
			}
			n, err := io.Copy(out, io.LimitReader(&ctxReader{ctx: ctx, r: in}, lim.maxBytes-written+1))
			written += n
			if err == nil {
				err = out.Chown(owner, owner)
			}
			if err == nil {
				err = out.Chmod(fi.Mode().Perm())
			}
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("template: COPY %s: %w", from, err)
			}
			return nil
		}
		return nil // fifos, sockets, devices in the context are skipped
	}
	for _, s := range srcs {
		fi, err := src.Lstat(s)
		if err != nil {
			return written, fmt.Errorf("%w: COPY source %s: not in the build context", ErrInvalid, s)
		}
		to := target
		if fi.IsDir() {
			if err := mkdirs(target); err != nil {
				return written, err
			}
		} else {
			isDir := destIsDir
			if st, err := dst.Stat(target); err == nil && st.IsDir() {
				isDir = true
			}
			if isDir {
				if err := mkdirs(target); err != nil {
					return written, err
				}
				to = path.Join(target, path.Base(s))
			} else if err := mkdirs(path.Dir(target)); err != nil {
				return written, err
			}
		}
		if fi.IsDir() {
			// Copy the directory's contents, not the directory itself.
			d, err := src.Open(s)
			if err != nil {
				return written, fmt.Errorf("template: COPY source %s: %w", s, err)
			}
			names, err := d.Readdirnames(-1)
			d.Close()
			if err != nil {
				return written, fmt.Errorf("template: COPY source %s: %w", s, err)
			}
			slices.Sort(names)
			for _, n := range names {
				if err := cp(path.Join(s, n), path.Join(to, n)); err != nil {
					return written, err
				}
			}
			continue
		}
		if err := cp(s, to); err != nil {
			return written, err
		}
	}
	return written, nil
}
