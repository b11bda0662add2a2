package snapshot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// ImageSource is a driver's checkpoint directory to store with a capture.
type ImageSource struct {
	Dir    string // written by the driver on the host
	Driver string // the driver's name, recorded for the restore
	// LayerDone, if set, is called once the layer has been read, before
	// the image is: the sandbox need not stay frozen while it is stored.
	LayerDone func()
	// Parent, if set, is the image of the parent snapshot: its chunks
	// are reused without being compressed again when unchanged.
	Parent *ProcessImage
}

// TempDir makes an empty private directory under the store's tmp dir, for
// a checkpoint image on its way in or out. The caller removes it; GC
// removes any a crash left (it runs while no capture or restore does).
func (s *Store) TempDir() (string, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	d := filepath.Join(s.dir, "tmp", "img-"+hex.EncodeToString(rnd[:]))
	if err := os.Mkdir(d, 0o700); err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	return d, nil
}

// storeImage cuts every regular file under src.Dir into stored chunks
// (format 2: page-aligned, compressed, pages.go). The walk is fd-relative
// and follows no link; anything but directories and regular files is
// refused (a checkpoint has nothing else).
func (c *capturer) storeImage(src ImageSource) (*ProcessImage, error) {
	pi := &ProcessImage{Driver: src.Driver, Format: imageFormatPaged}
	w, err := newImageWriter(c.s, src.Parent)
	if err != nil {
		return nil, err
	}
	defer w.close()
	if cap(c.buf) < splitBufSize {
		c.buf = make([]byte, splitBufSize)
	}
	root, err := unix.Open(src.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("snapshot: open process image: %w", err)
	}
	defer unix.Close(root)
	var walk func(dirfd int, rel string, depth int) error
	walk = func(dirfd int, rel string, depth int) error {
		names, err := readNames(dirfd)
		if err != nil {
			return fmt.Errorf("snapshot: process image: %w", err)
		}
		sort.Strings(names)
		for _, name := range names {
			p := path.Join(rel, name)
			if !validPath(p) || depth >= maxImageDepth || len(pi.Files) >= maxImageFiles {
				return fmt.Errorf("snapshot: process image: unrecordable %.100q", p)
			}
			var st unix.Stat_t
			if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("snapshot: process image: %w", err)
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				fd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
				if err != nil {
					return fmt.Errorf("snapshot: process image: %w", err)
				}
				err = walk(fd, p, depth+1)
				unix.Close(fd)
				if err != nil {
					return err
				}
			case unix.S_IFREG:
				f, err := c.imageFile(w, dirfd, name, p)
				if err != nil {
					return err
				}
				pi.Files = append(pi.Files, f)
			default:
				return fmt.Errorf("snapshot: process image: %.100q is not a file or directory", p)
			}
		}
		return nil
	}
	if err := walk(root, "", 0); err != nil {
		return nil, err
	}
	if err := pi.validate(); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return pi, nil
}

func (c *capturer) imageFile(w *imageWriter, dirfd int, name, p string) (ImageFile, error) {
	f := ImageFile{Path: p}
	fd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return f, fmt.Errorf("snapshot: process image: open %.100q: %w", p, err)
	}
	file := os.NewFile(uintptr(fd), p)
	defer file.Close()
	err = splitPages(file, c.buf[:splitBufSize], func(raw []byte) error {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if f.Size += int64(len(raw)); f.Size > MaxImageBytes {
			return fmt.Errorf("snapshot: process image: %.100q larger than %d bytes", p, int64(MaxImageBytes))
		}
		part, added, err := w.put(c.ctx, p, f.Size-int64(len(raw)), raw)
		if err != nil {
			return err
		}
		f.Parts = append(f.Parts, part)
		if added > 0 {
			c.res.ImageNewChunks++
			c.res.ImageChunkBytes += added
		}
		return nil
	})
	if err != nil {
		return f, fmt.Errorf("snapshot: process image: %.100q: %w", p, err)
	}
	return f, nil
}

// MaterializeImage writes a process image into the empty directory dir
// (from TempDir), checking every chunk against its digest, for a driver's
// restore. The whole image is written before it returns: runsc and CRIU
// read their images from files (runsc's own -background loading works on
// the file written here).
func (s *Store) MaterializeImage(ctx context.Context, pi *ProcessImage, dir string) (int64, error) {
	if err := pi.validate(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("snapshot: open image dir: %w", err)
	}
	defer unix.Close(root)
	buf := make([]byte, 0, ChunkSize)
	var total int64
	for _, f := range pi.Files {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		// Parent dirs, one level at a time, beneath the root.
		if d := path.Dir(f.Path); d != "." {
			parts := []string{}
			for q := d; q != "."; q = path.Dir(q) {
				parts = append([]string{q}, parts...)
			}
			for _, q := range parts {
				if err := unix.Mkdirat(root, q, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
					return total, fmt.Errorf("snapshot: image dir %.100q: %w", q, err)
				}
			}
		}
		pfd, err := openBeneath(root, path.Dir(f.Path), unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return total, fmt.Errorf("snapshot: image file %.100q: %w", f.Path, err)
		}
		n, err := s.writeImageFile(ctx, pfd, path.Base(f.Path), f, pi.Format == imageFormatPaged, buf)
		unix.Close(pfd)
		total += n
		if err != nil {
			return total, fmt.Errorf("snapshot: image file %.100q: %w", f.Path, err)
		}
	}
	return total, nil
}

func (s *Store) writeImageFile(ctx context.Context, pfd int, name string, f ImageFile, paged bool, buf []byte) (int64, error) {
	// 0644 as CRIU writes its images: a restore reads them as the
	// sandbox's root, and the namespace driver links such files into the
	// sandbox's dir instead of copying them. The dir (TempDir: 0700, or
	// the caller's) keeps everyone else out.
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return 0, err
	}
	out := os.NewFile(uintptr(fd), name)
	defer out.Close()
	if paged {
		return s.writePagedFile(ctx, out, f)
	}
	var n int64
	for _, c := range f.Chunks {
		data, err := s.readChunk(c, buf)
		if err != nil {
			return n, err
		}
		w, err := out.Write(data)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	if n != f.Size {
		return n, fmt.Errorf("%w: %d bytes of content for a %d-byte file", ErrCorrupt, n, f.Size)
	}
	return n, nil
}
