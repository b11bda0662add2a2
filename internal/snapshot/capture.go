package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/space-sandbox/space/internal/driver"
	"golang.org/x/sys/unix"
)

// Result describes one capture.
type Result struct {
	Manifest      string `json:"manifest"`       // digest of the stored manifest
	Entries       int    `json:"entries"`        // files in the layer's full state
	Changed       int    `json:"changed"`        // entries recorded in this snapshot
	Removed       int    `json:"removed"`        // paths removed since the parent
	Skipped       int    `json:"skipped"`        // sockets and device nodes, not restorable
	LogicalBytes  int64  `json:"logical_bytes"`  // size of all regular files in the layer
	BytesRead     int64  `json:"bytes_read"`     // file bytes read and hashed
	NewChunks     int    `json:"new_chunks"`     // chunks this snapshot added to the store
	ChunkBytes    int64  `json:"chunk_bytes"`    // their size
	ManifestBytes int64  `json:"manifest_bytes"` // the manifest's stored size
	BytesStored   int64  `json:"bytes_stored"`   // chunk_bytes + image_chunk_bytes + manifest_bytes
	// The process image, when the capture has one (CaptureProcess).
	ImageFiles      int   `json:"image_files,omitempty"`
	ImageBytes      int64 `json:"image_bytes,omitempty"`       // its size
	ImageNewChunks  int   `json:"image_new_chunks,omitempty"`  // chunks it added to the store
	ImageChunkBytes int64 `json:"image_chunk_bytes,omitempty"` // their size
}

// resolveBeneath keeps openat2 inside the starting directory and refuses
// every symlink (and procfs magic link) on the way.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

func openBeneath(dirfd int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Resolve: resolveBeneath})
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		return fd, err
	}
}

// capturer walks one layer.
type capturer struct {
	s      *Store
	layer  driver.Layer
	parent State
	full   State
	links  map[uint64]string // inode → first path, for hard links
	res    Result
	buf    []byte
	ctx    context.Context
}

// Capture records the layer's current state as a manifest of its changes
// since parent (nil or empty: everything) and stores new chunks. The caller
// must keep every process that could write the layer frozen meanwhile. The
// walk is fd-relative: it never follows a symlink, opens only directories
// and regular files (non-blocking, checked by inode), and only lstat's the
// rest; ids outside the layer's range are recorded as nobody.
func (s *Store) Capture(ctx context.Context, layer driver.Layer, parent State) (Result, error) {
	return s.capture(ctx, layer, parent, nil)
}

// CaptureProcess is Capture that also stores a driver's checkpoint
// directory (the processes and memory of the moment the layer shows) in
// the same manifest, chunked like the layer. A layer with no Dir is empty
// (the checkpoint holds the disk, as a VM's does).
func (s *Store) CaptureProcess(ctx context.Context, layer driver.Layer, parent State, img ImageSource) (Result, error) {
	return s.capture(ctx, layer, parent, &img)
}

func (s *Store) capture(ctx context.Context, layer driver.Layer, parent State, img *ImageSource) (Result, error) {
	c := &capturer{s: s, layer: layer, parent: parent, full: State{}, links: map[uint64]string{},
		buf: make([]byte, ChunkSize), ctx: ctx}
	if layer.Dir == "" && img == nil {
		return c.res, errors.New("snapshot: no layer and no process image to capture")
	}
	err := c.walkLayer()
	if img != nil && img.LayerDone != nil {
		img.LayerDone()
	}
	if err != nil {
		return c.res, err
	}
	m := &Manifest{Version: manifestVersion}
	for _, p := range c.full.Paths() {
		e := c.full[p]
		if pe := parent[p]; pe == nil || !e.sameContent(pe) || pe.Ino != e.Ino || pe.CtimeNS != e.CtimeNS {
			m.Entries = append(m.Entries, *e)
		}
	}
	for p := range parent {
		if c.full[p] == nil {
			// A removed subtree is recorded by its top only.
			if d := path.Dir(p); d == "." || c.full[d] != nil || parent[d] == nil {
				m.Removed = append(m.Removed, p)
			}
		}
	}
	sort.Strings(m.Removed)
	if img != nil {
		if m.Process, err = c.storeImage(*img); err != nil {
			return c.res, err
		}
		c.res.ImageFiles, c.res.ImageBytes = len(m.Process.Files), m.Process.Bytes()
	}
	m.Version = manifestVersionOf(m.Process)
	if err := m.validate(); err != nil {
		return c.res, fmt.Errorf("snapshot: layer not recordable: %w", err)
	}
	d, size, err := s.putManifest(ctx, m)
	if err != nil {
		return c.res, err
	}
	if err := s.sync(); err != nil {
		return c.res, err
	}
	c.res.Manifest, c.res.ManifestBytes = d, size
	c.res.Entries, c.res.Changed, c.res.Removed = len(c.full), len(m.Entries), len(m.Removed)
	c.res.LogicalBytes = c.full.LogicalBytes()
	c.res.BytesStored = c.res.ChunkBytes + c.res.ImageChunkBytes + size
	return c.res, nil
}

// walkLayer reads the layer into c.full. A layer without a directory is
// empty: a driver whose checkpoint holds the sandbox's disk (a VM) has no
// host-side layer.
func (c *capturer) walkLayer() error {
	if c.layer.Dir == "" {
		return nil
	}
	root, err := unix.Open(c.layer.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("snapshot: open layer: %w", err)
	}
	defer unix.Close(root)
	return c.walk(root, "", 0)
}

func (c *capturer) id(host uint32) uint32 {
	if host >= c.layer.UIDBase && host-c.layer.UIDBase < c.layer.UIDCount {
		return host - c.layer.UIDBase
	}
	return 65534
}

func (c *capturer) walk(dirfd int, rel string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("snapshot: %.100q: tree deeper than %d", rel, maxDepth)
	}
	if err := c.ctx.Err(); err != nil {
		return err
	}
	names, err := readNames(dirfd)
	if err != nil {
		return fmt.Errorf("snapshot: read dir %.100q: %w", rel, err)
	}
	sort.Strings(names)
	for _, name := range names {
		p := name
		if rel != "" {
			p = rel + "/" + name
		}
		if !validPath(p) {
			return fmt.Errorf("snapshot: unrecordable path %.100q", p)
		}
		if len(c.full) >= MaxEntries {
			return fmt.Errorf("snapshot: more than %d files", MaxEntries)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("snapshot: lstat %.100q: %w", p, err)
		}
		e := &Entry{Path: p, Mode: st.Mode & 0o7777, UID: c.id(st.Uid), GID: c.id(st.Gid),
			MtimeNS: st.Mtim.Nano(), Ino: st.Ino, CtimeNS: st.Ctim.Nano()}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Type = TypeDir
			fd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				return fmt.Errorf("snapshot: open dir %.100q: %w", p, err)
			}
			err = c.sameInode(fd, &st, p)
			if err == nil {
				e.Xattrs, err = readXattrs(fd)
			}
			if err == nil {
				c.full[p] = e
				err = c.walk(fd, p, depth+1)
			}
			unix.Close(fd)
			if err != nil {
				return err
			}
			continue
		case unix.S_IFREG:
			if st.Nlink > 1 {
				if first, ok := c.links[st.Ino]; ok {
					c.full[p] = &Entry{Path: p, Type: TypeHardlink, Target: first, Ino: st.Ino, CtimeNS: st.Ctim.Nano()}
					continue
				}
				c.links[st.Ino] = p
			}
			if err := c.file(dirfd, name, e, &st); err != nil {
				return err
			}
		case unix.S_IFLNK:
			e.Type = TypeSymlink
			buf := make([]byte, maxPathLen+1)
			n, err := unix.Readlinkat(dirfd, name, buf)
			if err != nil {
				return fmt.Errorf("snapshot: readlink %.100q: %w", p, err)
			}
			if n > maxPathLen {
				return fmt.Errorf("snapshot: %.100q: symlink target too long", p)
			}
			e.Target = string(buf[:n])
			e.Mode = 0
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				c.res.Skipped++ // a sandbox cannot make real devices; nothing to restore
				continue
			}
			e.Type, e.Mode = TypeWhiteout, 0
		case unix.S_IFIFO:
			e.Type = TypeFIFO
		default:
			c.res.Skipped++ // sockets (runtime state) and block devices
			continue
		}
		c.full[p] = e
	}
	return nil
}

func (c *capturer) sameInode(fd int, want *unix.Stat_t, p string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("snapshot: fstat %.100q: %w", p, err)
	}
	if st.Ino != want.Ino || st.Dev != want.Dev || st.Mode&unix.S_IFMT != want.Mode&unix.S_IFMT {
		return fmt.Errorf("snapshot: %.100q changed during the capture (is the sandbox frozen?)", p)
	}
	return nil
}

// file records a regular file, reusing the parent's chunks when the inode
// is unchanged and reading (and storing) its content otherwise.
func (c *capturer) file(dirfd int, name string, e *Entry, st *unix.Stat_t) error {
	e.Type, e.Size = TypeFile, st.Size
	if pe := c.parent[e.Path]; pe != nil && pe.Type == TypeFile && pe.Ino == st.Ino &&
		pe.CtimeNS == e.CtimeNS && pe.Size == st.Size && pe.MtimeNS == e.MtimeNS {
		e.Chunks, e.Xattrs = pe.Chunks, pe.Xattrs
		return nil
	}
	fd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return fmt.Errorf("snapshot: open %.100q: %w", e.Path, err)
	}
	f := os.NewFile(uintptr(fd), e.Path)
	defer f.Close()
	if err := c.sameInode(fd, st, e.Path); err != nil {
		return err
	}
	if e.Xattrs, err = readXattrs(fd); err != nil {
		return fmt.Errorf("snapshot: %.100q: %w", e.Path, err)
	}
	var size int64
	for {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		n, err := io.ReadFull(f, c.buf)
		if n > 0 {
			d, isNew, perr := c.s.putChunk(c.ctx, c.buf[:n])
			if perr != nil {
				return perr
			}
			e.Chunks = append(e.Chunks, d)
			size += int64(n)
			c.res.BytesRead += int64(n)
			if isNew {
				c.res.NewChunks++
				c.res.ChunkBytes += int64(n)
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("snapshot: read %.100q: %w", e.Path, err)
		}
	}
	e.Size = size
	return nil
}

// readNames lists a directory through its fd.
func readNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

// readXattrs returns the recorded extended attributes of an open file.
func readXattrs(fd int) (map[string][]byte, error) {
	buf := make([]byte, 4096)
	var n int
	var err error
	for {
		n, err = unix.Flistxattr(fd, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < 1<<20 {
			buf = make([]byte, 4*len(buf))
			continue
		}
		break
	}
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	var out map[string][]byte
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" || !keepXattr(name) {
			continue
		}
		if len(out) >= maxXattrs {
			return nil, fmt.Errorf("more than %d extended attributes", maxXattrs)
		}
		val := make([]byte, maxXattrValue)
		vn, err := unix.Fgetxattr(fd, name, val)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("getxattr %.64q: %w", name, err)
		}
		if out == nil {
			out = map[string][]byte{}
		}
		out[name] = val[:vn]
	}
	return out, nil
}
