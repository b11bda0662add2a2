package qemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// A checkpoint keeps the writable disk as its data extents only: the disk
// is a sparse file of UpperSize (2 GiB by default) holding a few MiB, and
// the snapshot store reads and hashes every byte it is given.
//
// upper.map is an extentMap; upper.data the extents' bytes, concatenated
// in map order.
type extentMap struct {
	Size    int64      `json:"size"`
	Extents [][2]int64 `json:"extents"` // offset, length
}

// maxExtents bounds a map read back from a checkpoint directory.
const maxExtents = 1 << 20

// saveSparse writes the data extents of the file at from (found with
// SEEK_DATA/SEEK_HOLE) to dataPath and their map to mapPath.
func saveSparse(from, dataPath, mapPath string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	out, err := os.OpenFile(dataPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	defer out.Close()
	m := extentMap{Size: fi.Size(), Extents: [][2]int64{}}
	fd := int(in.Fd())
	for off := int64(0); off < m.Size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("qemu: seek data in %s: %w", from, err)
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("qemu: seek hole in %s: %w", from, err)
		}
		if _, err := io.Copy(out, io.NewSectionReader(in, start, end-start)); err != nil {
			return fmt.Errorf("qemu: copy %s: %w", from, err)
		}
		m.Extents = append(m.Extents, [2]int64{start, end - start})
		off = end
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	if err := os.WriteFile(mapPath, b, 0o600); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	return nil
}

// loadSparse rebuilds at to (a new file) the sparse file saveSparse saved.
// The map comes from a checkpoint directory: extents must be in order,
// inside the size, and add up to the data file.
func loadSparse(dataPath, mapPath, to string) error {
	b, err := os.ReadFile(mapPath)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	var m extentMap
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("qemu: %s: %w", mapPath, err)
	}
	data, err := os.Open(dataPath)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	defer data.Close()
	fi, err := data.Stat()
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	if m.Size < 0 || len(m.Extents) > maxExtents {
		return fmt.Errorf("qemu: %s: bad map", mapPath)
	}
	var total, prevEnd int64
	for _, e := range m.Extents {
		if e[0] < prevEnd || e[1] <= 0 || e[0]+e[1] > m.Size || e[0]+e[1] < e[0] {
			return fmt.Errorf("qemu: %s: bad extent %v", mapPath, e)
		}
		prevEnd = e[0] + e[1]
		total += e[1]
	}
	if total != fi.Size() {
		return fmt.Errorf("qemu: %s: extents hold %d bytes, %s has %d", mapPath, total, dataPath, fi.Size())
	}
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	defer out.Close()
	if err := out.Truncate(m.Size); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	for _, e := range m.Extents {
		if _, err := out.Seek(e[0], io.SeekStart); err != nil {
			return fmt.Errorf("qemu: %w", err)
		}
		if _, err := io.CopyN(out, data, e[1]); err != nil {
			return fmt.Errorf("qemu: restore %s: %w", to, err)
		}
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	return nil
}
