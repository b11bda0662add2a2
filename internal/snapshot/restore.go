package snapshot

import (
	"context"
	"errors"
	"fmt"
	"path"

	"github.com/space-sandbox/space/internal/driver"
	"golang.org/x/sys/unix"
)

// RestoreResult describes one materialisation.
type RestoreResult struct {
	Entries int   `json:"entries"`
	Bytes   int64 `json:"bytes"`
}

// Materialize writes st into the empty directory layer.Dir, which no
// sandbox process can reach yet: ownership (mapped to the layer's id base),
// modes, times, xattrs, whiteouts and opaque directories as recorded. Every
// path is resolved beneath the layer without following symlinks, and every
// chunk is checked against its digest.
func (s *Store) Materialize(ctx context.Context, st State, layer driver.Layer) (RestoreResult, error) {
	var res RestoreResult
	if err := st.validate(); err != nil {
		return res, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	root, err := unix.Open(layer.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return res, fmt.Errorf("snapshot: open layer: %w", err)
	}
	defer unix.Close(root)
	m := &materializer{s: s, layer: layer, root: root, parentFd: -1, buf: make([]byte, 0, ChunkSize)}
	defer m.closeParent()
	paths := st.Paths()
	var links, dirs []*Entry
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		e := st[p]
		switch e.Type {
		case TypeHardlink:
			links = append(links, e)
			continue
		case TypeDir:
			dirs = append(dirs, e)
		}
		n, err := m.create(e)
		if err != nil {
			return res, fmt.Errorf("snapshot: restore %.100q: %w", p, err)
		}
		res.Entries++
		res.Bytes += n
	}
	for _, e := range links {
		pfd, name, err := m.parent(e.Path)
		if err != nil {
			return res, err
		}
		tfd, err := openBeneath(root, e.Target, unix.O_PATH)
		if err != nil {
			return res, fmt.Errorf("snapshot: restore link %.100q: %w", e.Path, err)
		}
		err = unix.Linkat(tfd, "", pfd, name, unix.AT_EMPTY_PATH)
		unix.Close(tfd)
		if err != nil {
			return res, fmt.Errorf("snapshot: restore link %.100q: %w", e.Path, err)
		}
		res.Entries++
	}
	// Directory times last: creating their children changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		e := dirs[i]
		pfd, name, err := m.parent(e.Path)
		if err != nil {
			return res, err
		}
		if err := unix.UtimesNanoAt(pfd, name, times(e.MtimeNS), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return res, fmt.Errorf("snapshot: restore %.100q: %w", e.Path, err)
		}
	}
	return res, nil
}

type materializer struct {
	s          *Store
	layer      driver.Layer
	root       int
	parentPath string
	parentFd   int
	buf        []byte
}

func (m *materializer) closeParent() {
	if m.parentFd >= 0 {
		unix.Close(m.parentFd)
		m.parentFd = -1
	}
}

// parent returns an fd of p's directory (cached: entries come in order) and
// p's last component.
func (m *materializer) parent(p string) (int, string, error) {
	dir, name := path.Dir(p), path.Base(p)
	if dir == "." {
		return m.root, name, nil
	}
	if m.parentFd >= 0 && m.parentPath == dir {
		return m.parentFd, name, nil
	}
	m.closeParent()
	fd, err := openBeneath(m.root, dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", fmt.Errorf("snapshot: restore %.100q: parent: %w", p, err)
	}
	m.parentFd, m.parentPath = fd, dir
	return fd, name, nil
}

func (m *materializer) hostID(id uint32) int {
	if id >= m.layer.UIDCount {
		id = 65534
	}
	return int(m.layer.UIDBase + id)
}

func times(ns int64) []unix.Timespec {
	ts := unix.NsecToTimespec(ns)
	return []unix.Timespec{ts, ts}
}

func (m *materializer) create(e *Entry) (int64, error) {
	pfd, name, err := m.parent(e.Path)
	if err != nil {
		return 0, err
	}
	uid, gid := m.hostID(e.UID), m.hostID(e.GID)
	switch e.Type {
	case TypeDir:
		if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
			return 0, err
		}
		fd, err := openBeneath(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return 0, err
		}
		defer unix.Close(fd)
		return 0, m.attrs(fd, e, uid, gid)
	case TypeFile:
		fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return 0, err
		}
		defer unix.Close(fd)
		var n int64
		for _, c := range e.Chunks {
			data, err := m.s.readChunk(c, m.buf)
			if err != nil {
				return n, err
			}
			for len(data) > 0 {
				w, err := unix.Write(fd, data)
				if err != nil {
					return n, err
				}
				data = data[w:]
				n += int64(w)
			}
		}
		if n != e.Size {
			return n, fmt.Errorf("%w: %d bytes of content for a %d-byte file", ErrCorrupt, n, e.Size)
		}
		if err := m.attrs(fd, e, uid, gid); err != nil {
			return n, err
		}
		return n, unix.UtimesNanoAt(pfd, name, times(e.MtimeNS), unix.AT_SYMLINK_NOFOLLOW)
	case TypeSymlink:
		if err := unix.Symlinkat(e.Target, pfd, name); err != nil {
			return 0, err
		}
	case TypeWhiteout:
		if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
			return 0, err
		}
	case TypeFIFO:
		if err := unix.Mknodat(pfd, name, unix.S_IFIFO|0o600, 0); err != nil {
			return 0, err
		}
		if err := unix.Fchownat(pfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return 0, err
		}
		if err := unix.Fchmodat(pfd, name, e.Mode, 0); err != nil {
			return 0, err
		}
		return 0, unix.UtimesNanoAt(pfd, name, times(e.MtimeNS), unix.AT_SYMLINK_NOFOLLOW)
	default:
		return 0, errors.New("unknown entry type")
	}
	if err := unix.Fchownat(pfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, err
	}
	return 0, unix.UtimesNanoAt(pfd, name, times(e.MtimeNS), unix.AT_SYMLINK_NOFOLLOW)
}

// attrs sets owner, mode (after chown, which clears setuid bits) and
// xattrs on an open file or directory.
func (m *materializer) attrs(fd int, e *Entry, uid, gid int) error {
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, e.Mode); err != nil {
		return err
	}
	for k, v := range e.Xattrs {
		if err := unix.Fsetxattr(fd, k, v, 0); err != nil {
			return fmt.Errorf("setxattr %.64q: %w", k, err)
		}
	}
	return nil
}
