package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

const syscallNoFollow = syscall.O_NOFOLLOW

type treeStat struct {
	files int
	size  int64 // allocated bytes, each inode once
}

// shiftTree maps every owner in the staging tree from in-sandbox ids to host
// ids (host = base + id), so the tree reads as owned by root etc. inside the
// sandbox's user namespace. chown clears setuid/setgid, so those bits are set
// again afterwards. Device nodes, fifos and sockets are removed: /dev is
// provided by the sandbox runtime and a template never carries devices.
func shiftTree(ctx context.Context, root string, base, count uint32, p Progress, logf func(string, ...any)) (treeStat, error) {
	var st treeStat
	seen := map[uint64]bool{}
	removed := 0
	p("shift", 0, 0, "shifting ownership")
	err := filepath.WalkDir(root, func(name string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var s syscall.Stat_t
		if err := syscall.Lstat(name, &s); err != nil {
			return &fs.PathError{Op: "lstat", Path: name, Err: err}
		}
		switch s.Mode & syscall.S_IFMT {
		case syscall.S_IFCHR, syscall.S_IFBLK, syscall.S_IFIFO, syscall.S_IFSOCK:
			removed++
			logf("template: removing special file %s (mode %o)", name, s.Mode)
			return os.Remove(name)
		}
		st.files++
		if st.files%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			p("shift", int64(st.files), 0, "")
		}
		if s.Nlink > 1 && s.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			if seen[s.Ino] {
				return nil // another name of an inode already shifted
			}
			seen[s.Ino] = true
		}
		st.size += s.Blocks * 512
		if s.Uid >= count || s.Gid >= count {
			return fmt.Errorf("%w: %s is owned by %d:%d, outside the mapped range 0..%d", ErrUnsafeInput, name, s.Uid, s.Gid, count-1)
		}
		if err := os.Lchown(name, int(base+s.Uid), int(base+s.Gid)); err != nil {
			return err
		}
		if s.Mode&syscall.S_IFMT != syscall.S_IFLNK && s.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
			if err := syscall.Chmod(name, s.Mode&0o7777); err != nil {
				return &fs.PathError{Op: "chmod", Path: name, Err: err}
			}
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrUnsafeInput) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return st, err
		}
		return st, fmt.Errorf("template: shift ownership: %w", err)
	}
	if removed > 0 {
		p("shift", int64(st.files), int64(st.files), fmt.Sprintf("removed %d special files", removed))
	}
	p("shift", int64(st.files), int64(st.files), "done")
	return st, nil
}

// treeStats counts entries and allocated bytes without changing anything.
func treeStats(root string) (treeStat, error) {
	var st treeStat
	seen := map[uint64]bool{}
	err := filepath.WalkDir(root, func(name string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var s syscall.Stat_t
		if err := syscall.Lstat(name, &s); err != nil {
			return err
		}
		st.files++
		if s.Nlink > 1 && s.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			if seen[s.Ino] {
				return nil
			}
			seen[s.Ino] = true
		}
		st.size += s.Blocks * 512
		return nil
	})
	return st, err
}

// removeTree deletes path recursively, but first detaches anything mounted
// below it and refuses to proceed if a mount remains: a leaked bind mount of
// /dev or /sys (mmdebstrap killed mid-build) must never be recursed into.
func removeTree(path string) error {
	mounts, err := mountsUnder(path)
	if err != nil {
		return err
	}
	for _, mp := range mounts {
		syscall.Unmount(mp, syscall.MNT_DETACH)
	}
	if len(mounts) > 0 {
		left, err := mountsUnder(path)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("template: refusing to remove %s: still mounted: %s", path, strings.Join(left, ", "))
		}
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("template: remove %s: %w", path, err)
	}
	return nil
}

// mountsUnder lists mount points at or below path, deepest first.
func mountsUnder(path string) ([]string, error) {
	path = filepath.Clean(path)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("template: read mountinfo: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == path || strings.HasPrefix(mp, path+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("template: read mountinfo: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unescapeMountinfo decodes the \ooo octal escapes the kernel uses for
// spaces, tabs, newlines and backslashes in mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
