package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"slices"
	"syscall"
	"time"
)

// treeCopier walks a source directory through an os.Root (so a symlink or a
// concurrent rename can never lead it outside) and feeds a canonical record
// of every entry into a hash. With dst set it also recreates the tree there.
// Running it twice, hash-only and then copying, and comparing the hashes
// proves the copy is the content the digest names.
type treeCopier struct {
	src, dst *os.Root
	lim      extractLimits
	h        hash.Hash
	p        Progress
	stage    string
	logf     func(string, ...any)
	dev      uint64
	entries  int
	bytes    int64
	skipped  int
	links    map[[2]uint64]string // (dev, ino) → first name, for hardlinks
	buf      []byte
}

// copyTree hashes src (and copies it into dst when dst is non-nil) and
// returns the hex tree hash.
func (m *Manager) copyTree(ctx context.Context, src, dst *os.Root, p Progress) (string, error) {
	c := &treeCopier{src: src, dst: dst, lim: m.limits(), h: sha256.New(), p: p, logf: m.opts.Logf,
		links: map[[2]uint64]string{}, buf: make([]byte, 256<<10), stage: "hash"}
	if dst != nil {
		c.stage = "copy"
	}
	fi, err := src.Lstat(".")
	if err != nil {
		return "", fmt.Errorf("template: source dir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return "", fmt.Errorf("%w: source is not a directory", ErrInvalid)
	}
	c.dev = st.Dev
	p(c.stage, 0, 0, src.Name())
	if err := c.dir(ctx, ".", st); err != nil {
		return "", err
	}
	msg := fmt.Sprintf("%d entries, %d bytes", c.entries, c.bytes)
	if c.skipped > 0 {
		msg += fmt.Sprintf(", skipped %d device nodes/fifos/mount points", c.skipped)
		if dst != nil {
			c.logf("template: dir %s: skipped %d device nodes/fifos/mount points", src.Name(), c.skipped)
		}
	}
	p(c.stage, int64(c.entries), int64(c.entries), msg)
	return hex.EncodeToString(c.h.Sum(nil)), nil
}

func (c *treeCopier) record(kind byte, name string, st *syscall.Stat_t) {
	fmt.Fprintf(c.h, "%c %q %o %d %d %d\n", kind, name, st.Mode&0o7777, st.Uid, st.Gid, st.Mtim.Nano())
}

func (c *treeCopier) checkOwner(name string, st *syscall.Stat_t) error {
	if st.Uid >= c.lim.uidCount || st.Gid >= c.lim.uidCount {
		return fmt.Errorf("%w: %s is owned by %d:%d, outside 0..%d", ErrUnsafeInput, name, st.Uid, st.Gid, c.lim.uidCount-1)
	}
	return nil
}

func (c *treeCopier) dir(ctx context.Context, name string, st *syscall.Stat_t) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.checkOwner(name, st); err != nil {
		return err
	}
	c.record('d', name, st)
	if c.dst != nil && name != "." {
		if err := c.dst.Mkdir(name, 0o700); err != nil {
			return fmt.Errorf("template: copy %s: %w", name, err)
		}
	}
	d, err := c.src.Open(name)
	if err != nil {
		return fmt.Errorf("template: read source %s: %w", name, err)
	}
	defer d.Close()
	if err := sameFile(d, st); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrUnsafeInput, name, err)
	}
	var names []string
	for {
		chunk, err := d.Readdirnames(1024)
		names = append(names, chunk...)
		if c.entries+len(names) > c.lim.maxEntries {
			return fmt.Errorf("%w: more than %d entries", ErrLimit, c.lim.maxEntries)
		}
		if errors.Is(err, io.EOF) || (err == nil && len(chunk) == 0) {
			break
		}
		if err != nil {
			return fmt.Errorf("template: read source %s: %w", name, err)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		if err := c.entry(ctx, path.Join(name, n)); err != nil {
			return err
		}
	}
	if c.dst != nil {
		return c.setMeta(name, st, true)
	}
	return nil
}

func (c *treeCopier) entry(ctx context.Context, name string) error {
	c.entries++
	if c.entries > c.lim.maxEntries {
		return fmt.Errorf("%w: more than %d entries", ErrLimit, c.lim.maxEntries)
	}
	if c.entries%1024 == 0 {
		c.p(c.stage, int64(c.entries), 0, name)
	}
	fi, err := c.src.Lstat(name)
	if err != nil {
		return fmt.Errorf("template: read source %s: %w", name, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("template: read source %s: no stat", name)
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		if st.Dev != c.dev {
			c.skipped++ // another filesystem mounted inside the tree: like cp -x
			return nil
		}
		return c.dir(ctx, name, st)
	case syscall.S_IFREG:
		return c.file(ctx, name, st)
	case syscall.S_IFLNK:
		if err := c.checkOwner(name, st); err != nil {
			return err
		}
		target, err := c.src.Readlink(name)
		if err != nil {
			return fmt.Errorf("template: read source %s: %w", name, err)
		}
		if len(target) > maxNameLen {
			return fmt.Errorf("%w: symlink %s target too long", ErrUnsafeInput, name)
		}
		c.record('l', name, st)
		fmt.Fprintf(c.h, "%q\n", target)
		if c.dst == nil {
			return nil
		}
		if err := c.dst.Symlink(target, name); err != nil {
			return fmt.Errorf("template: copy %s: %w", name, err)
		}
		return c.setMeta(name, st, false)
	case syscall.S_IFCHR, syscall.S_IFBLK, syscall.S_IFIFO:
		c.skipped++
		return nil
	case syscall.S_IFSOCK:
		return fmt.Errorf("%w: %s is a socket", ErrUnsafeInput, name)
	}
	return fmt.Errorf("%w: %s has unknown type %o", ErrUnsafeInput, name, st.Mode)
}

func (c *treeCopier) file(ctx context.Context, name string, st *syscall.Stat_t) error {
	if err := c.checkOwner(name, st); err != nil {
		return err
	}
	if st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := c.links[key]; ok {
			fmt.Fprintf(c.h, "h %q %q\n", name, first)
			if c.dst == nil {
				return nil
			}
			if err := c.dst.Link(first, name); err != nil {
				return fmt.Errorf("template: copy %s: %w", name, err)
			}
			return nil
		}
		c.links[key] = name
	}
	if st.Size > c.lim.maxBytes-c.bytes {
		return fmt.Errorf("%w: more than %d bytes of file data", ErrLimit, c.lim.maxBytes)
	}
	c.bytes += st.Size
	c.record('f', name, st)
	fmt.Fprintf(c.h, "%d\n", st.Size)
	in, err := c.src.OpenFile(name, os.O_RDONLY|syscallNoFollow, 0)
	if err != nil {
		return fmt.Errorf("template: read source %s: %w", name, err)
	}
	defer in.Close()
	if err := sameFile(in, st); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrUnsafeInput, name, err)
	}
	var w io.Writer = c.h
	var out *os.File
	if c.dst != nil {
		out, err = c.dst.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscallNoFollow, 0o600)
		if err != nil {
			return fmt.Errorf("template: copy %s: %w", name, err)
		}
		defer out.Close()
		w = io.MultiWriter(c.h, out)
	}
	n, err := io.CopyBuffer(w, io.LimitReader(&ctxReader{ctx: ctx, r: in}, st.Size), c.buf)
	if err != nil {
		return fmt.Errorf("template: copy %s: %w", name, err)
	}
	if n != st.Size {
		return fmt.Errorf("%w: %s shrank while being read", ErrUnsafeInput, name)
	}
	if out == nil {
		return nil
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("template: copy %s: %w", name, err)
	}
	return c.setMeta(name, st, true)
}

// setMeta copies owner, mode and mtime (mode and time not for symlinks).
func (c *treeCopier) setMeta(name string, st *syscall.Stat_t, withMode bool) error {
	if c.lim.chown {
		if err := c.dst.Lchown(name, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("template: copy %s: %w", name, err)
		}
	}
	if !withMode {
		return nil
	}
	if err := c.dst.Chmod(name, tarMode(int64(st.Mode&0o7777))); err != nil {
		return fmt.Errorf("template: copy %s: %w", name, err)
	}
	mt := timespecTime(st.Mtim)
	if err := c.dst.Chtimes(name, mt, mt); err != nil {
		return fmt.Errorf("template: copy %s: %w", name, err)
	}
	return nil
}

// sameFile checks that an opened file is the inode that was lstat'ed, so a
// swap between lstat and open is caught.
func sameFile(f *os.File, want *syscall.Stat_t) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	got, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || got.Dev != want.Dev || got.Ino != want.Ino {
		return errors.New("changed while being read")
	}
	return nil
}

func timespecTime(ts syscall.Timespec) time.Time { return time.Unix(ts.Sec, ts.Nsec) }
