package snapshot

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
)

// Entry types.
const (
	TypeDir      = "dir"
	TypeFile     = "file"
	TypeSymlink  = "symlink"
	TypeHardlink = "hardlink" // another name of the file at Target
	TypeWhiteout = "whiteout" // overlay whiteout (char device 0/0): hides a lower file
	TypeFIFO     = "fifo"
)

// Bounds on what a manifest may hold; a layer beyond them is refused.
const (
	MaxEntries    = 2_000_000
	maxPathLen    = 4096
	maxNameLen    = 255
	maxXattrs     = 64
	maxXattrValue = 64 << 10
	maxDepth      = 512
)

// Manifest is one snapshot: entries added or changed since its parent
// (full records) and paths removed since it (with everything below them).
type Manifest struct {
	Version int      `json:"v"`
	Entries []Entry  `json:"entries"`
	Removed []string `json:"removed,omitempty"`
	// Process, if set, is the sandbox's processes and memory at the same
	// moment as the layer (a driver checkpoint). It is whole, not a diff:
	// only the newest manifest of a chain's is restored. Manifests without
	// it (filesystem-only, and all older ones) load as before.
	Process *ProcessImage `json:"process,omitempty"`
}

// ProcessImage is a driver's checkpoint directory, its files cut into
// chunks like the layer's (identical pages across snapshots and sandboxes
// are stored once).
type ProcessImage struct {
	Driver string `json:"driver"` // the driver that can restore it
	// Format is 0 for images whose files are fixed 1 MiB raw chunks
	// (Chunks; written before format 2, still restored) and 2 for
	// page-aligned compressed chunks (Parts; pages.go). A manifest with
	// a format-2 image is version 2, so that a node that predates it
	// refuses it instead of misreading it.
	Format int         `json:"f,omitempty"`
	Files  []ImageFile `json:"files"`
}

// ImageFile is one file of a checkpoint directory.
type ImageFile struct {
	Path   string      `json:"p"` // relative, slash-separated
	Size   int64       `json:"s"`
	Chunks []string    `json:"c,omitempty"` // format 0
	Parts  []ImagePart `json:"z,omitempty"` // format 2
}

// ImagePart is one chunk of a format-2 image file, in file order.
type ImagePart struct {
	Object string `json:"o"` // the stored (compressed) chunk's digest
	Sum    string `json:"h"` // SHA-256 of the uncompressed content
	Len    int    `json:"n"` // uncompressed length
	// Base, if set, is a chunk stored whole (no Base of its own) whose
	// content is the zstd dictionary Object was compressed with: a
	// chunk that changed a little since the parent image is stored as
	// the difference to the parent's version (pages.go).
	Base string `json:"b,omitempty"`
}

// chunkRefs calls fn with every stored chunk the image names.
func (pi *ProcessImage) chunkRefs(fn func(string)) {
	for _, f := range pi.Files {
		for _, c := range f.Chunks {
			fn(c)
		}
		for _, p := range f.Parts {
			fn(p.Object)
			if p.Base != "" {
				fn(p.Base)
			}
		}
	}
}

// Bounds on a process image.
const (
	maxImageFiles = 1024
	maxImageDepth = 8
	// MaxImageBytes bounds a process image (the sandbox's memory and
	// kernel state).
	MaxImageBytes = 256 << 30
)

var driverNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

func (pi *ProcessImage) validate() error {
	if !driverNameRE.MatchString(pi.Driver) {
		return fmt.Errorf("process image: bad driver name %.40q", pi.Driver)
	}
	if len(pi.Files) == 0 || len(pi.Files) > maxImageFiles {
		return fmt.Errorf("process image: %d files", len(pi.Files))
	}
	var total int64
	seen := make(map[string]bool, len(pi.Files))
	for _, f := range pi.Files {
		if !validPath(f.Path) || strings.Count(f.Path, "/") >= maxImageDepth || seen[f.Path] {
			return fmt.Errorf("process image: bad or repeated path %.100q", f.Path)
		}
		seen[f.Path] = true
		if f.Size < 0 || f.Size > MaxImageBytes {
			return fmt.Errorf("process image: %.100q: bad size %d", f.Path, f.Size)
		}
		if err := pi.validateChunks(f); err != nil {
			return err
		}
		if total += f.Size; total > MaxImageBytes {
			return errors.New("process image: too large")
		}
	}
	// A file's path must not also be a directory of another's.
	for p := range seen {
		for q := path.Dir(p); q != "."; q = path.Dir(q) {
			if seen[q] {
				return fmt.Errorf("process image: %.100q is a file and a directory", q)
			}
		}
	}
	return nil
}

// validateChunks checks a file's chunk list against its size.
func (pi *ProcessImage) validateChunks(f ImageFile) error {
	switch pi.Format {
	case 0:
		if len(f.Parts) > 0 || int64(len(f.Chunks)) != (f.Size+ChunkSize-1)/ChunkSize {
			return fmt.Errorf("process image: %.100q: %d chunks for %d bytes", f.Path, len(f.Chunks), f.Size)
		}
		for _, c := range f.Chunks {
			if !ValidDigest(c) {
				return fmt.Errorf("process image: %.100q: bad chunk digest", f.Path)
			}
		}
	case imageFormatPaged:
		if len(f.Chunks) > 0 || int64(len(f.Parts)) > (f.Size+pageSize-1)/pageSize {
			return fmt.Errorf("process image: %.100q: %d chunks for %d bytes", f.Path, len(f.Parts), f.Size)
		}
		var n int64
		for i, p := range f.Parts {
			last := i == len(f.Parts)-1
			if p.Len <= 0 || p.Len > MaxImageChunk || (!last && p.Len%pageSize != 0) {
				return fmt.Errorf("process image: %.100q: chunk %d: bad length %d", f.Path, i, p.Len)
			}
			if !ValidDigest(p.Object) || !ValidDigest(p.Sum) || (p.Base != "" && !ValidDigest(p.Base)) {
				return fmt.Errorf("process image: %.100q: bad chunk digest", f.Path)
			}
			n += int64(p.Len)
		}
		if n != f.Size {
			return fmt.Errorf("process image: %.100q: chunks hold %d bytes, want %d", f.Path, n, f.Size)
		}
	default:
		return fmt.Errorf("process image: unknown format %d", pi.Format)
	}
	return nil
}

// Bytes is the image's total size.
func (pi *ProcessImage) Bytes() int64 {
	var n int64
	for _, f := range pi.Files {
		n += f.Size
	}
	return n
}

// Manifest versions: 1 for every manifest without a format-2 process
// image (so that nodes which predate format 2 still read them), 2 with one.
const (
	manifestVersion      = 1
	manifestVersionPaged = 2
)

// Entry is one file of the writable layer. Ids are the sandbox's own (host
// id minus the layer's base), so a snapshot restores under any base.
type Entry struct {
	Path    string            `json:"p"`
	Type    string            `json:"t"`
	Mode    uint32            `json:"m,omitempty"` // permissions, setuid/setgid/sticky
	UID     uint32            `json:"u,omitempty"`
	GID     uint32            `json:"g,omitempty"`
	MtimeNS int64             `json:"mt,omitempty"`
	Size    int64             `json:"s,omitempty"`
	Chunks  []string          `json:"c,omitempty"`
	Target  string            `json:"l,omitempty"` // symlink target; hardlink's other path
	Xattrs  map[string][]byte `json:"x,omitempty"`
	// Host identity of the captured inode, for change detection only: an
	// inode with the same number, ctime and size has not changed.
	Ino     uint64 `json:"i,omitempty"`
	CtimeNS int64  `json:"ct,omitempty"`
}

// sameContent compares everything but the host identity.
func (e *Entry) sameContent(o *Entry) bool {
	if e.Path != o.Path || e.Type != o.Type || e.Mode != o.Mode || e.UID != o.UID || e.GID != o.GID ||
		e.MtimeNS != o.MtimeNS || e.Size != o.Size || e.Target != o.Target ||
		len(e.Chunks) != len(o.Chunks) || len(e.Xattrs) != len(o.Xattrs) {
		return false
	}
	for i := range e.Chunks {
		if e.Chunks[i] != o.Chunks[i] {
			return false
		}
	}
	for k, v := range e.Xattrs {
		if ov, ok := o.Xattrs[k]; !ok || string(ov) != string(v) {
			return false
		}
	}
	return true
}

// validPath accepts a clean, relative, slash-separated path without "."
// or ".." components or NUL bytes.
func validPath(p string) bool {
	if p == "" || len(p) > maxPathLen || p[0] == '/' || strings.IndexByte(p, 0) >= 0 || path.Clean(p) != p {
		return false
	}
	n := 0
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." || len(c) > maxNameLen {
			return false
		}
		n++
	}
	return n <= maxDepth
}

func (e *Entry) validate() error {
	if !validPath(e.Path) {
		return fmt.Errorf("bad path %.100q", e.Path)
	}
	if e.Mode&^0o7777 != 0 {
		return fmt.Errorf("%s: bad mode %o", e.Path, e.Mode)
	}
	if e.Size < 0 {
		return fmt.Errorf("%s: negative size", e.Path)
	}
	switch e.Type {
	case TypeFile:
		if int64(len(e.Chunks)) != (e.Size+ChunkSize-1)/ChunkSize {
			return fmt.Errorf("%s: %d chunks for %d bytes", e.Path, len(e.Chunks), e.Size)
		}
		for _, c := range e.Chunks {
			if !ValidDigest(c) {
				return fmt.Errorf("%s: bad chunk digest", e.Path)
			}
		}
	case TypeSymlink:
		if e.Target == "" || len(e.Target) > maxPathLen || strings.IndexByte(e.Target, 0) >= 0 {
			return fmt.Errorf("%s: bad symlink target", e.Path)
		}
	case TypeHardlink:
		if !validPath(e.Target) || e.Target == e.Path {
			return fmt.Errorf("%s: bad hard link target", e.Path)
		}
	case TypeDir, TypeWhiteout, TypeFIFO:
	default:
		return fmt.Errorf("%s: unknown type %.20q", e.Path, e.Type)
	}
	if e.Type != TypeFile && len(e.Chunks) > 0 {
		return fmt.Errorf("%s: chunks on a %s", e.Path, e.Type)
	}
	if len(e.Xattrs) > maxXattrs {
		return fmt.Errorf("%s: too many xattrs", e.Path)
	}
	for k, v := range e.Xattrs {
		if !keepXattr(k) || len(v) > maxXattrValue {
			return fmt.Errorf("%s: xattr %.64q not allowed", e.Path, k)
		}
	}
	return nil
}

func (m *Manifest) validate() error {
	paged := m.Process != nil && m.Process.Format == imageFormatPaged
	if want := manifestVersionOf(m.Process); m.Version != want {
		return fmt.Errorf("version %d, want %d (format-2 process image: %v)", m.Version, want, paged)
	}
	if len(m.Entries)+len(m.Removed) > MaxEntries {
		return errors.New("too many entries")
	}
	for i := range m.Entries {
		if err := m.Entries[i].validate(); err != nil {
			return err
		}
	}
	for _, r := range m.Removed {
		if !validPath(r) {
			return fmt.Errorf("bad removed path %.100q", r)
		}
	}
	if m.Process != nil {
		return m.Process.validate()
	}
	return nil
}

// manifestVersionOf is the version of a manifest with process image pi.
func manifestVersionOf(pi *ProcessImage) int {
	if pi != nil && pi.Format == imageFormatPaged {
		return manifestVersionPaged
	}
	return manifestVersion
}

// keepXattr says which extended attributes a snapshot records: the
// sandbox's own user.* ones and overlay's opaque/redirect markers, file
// capabilities and ACLs. Overlay's inode bookkeeping (origin, impure, ...)
// refers to the old upper inodes and is dropped.
func keepXattr(name string) bool {
	switch name {
	case "security.capability", "system.posix_acl_access", "system.posix_acl_default",
		"user.overlay.opaque", "user.overlay.redirect":
		return true
	}
	return strings.HasPrefix(name, "user.") && !strings.HasPrefix(name, "user.overlay.") && len(name) <= maxNameLen
}

// State is a writable layer's full contents by path.
type State map[string]*Entry

// apply updates st with one manifest: removals first (with their
// subtrees), then the new and changed entries.
func (st State) apply(m *Manifest) {
	if len(m.Removed) > 0 {
		gone := make(map[string]bool, len(m.Removed))
		for _, r := range m.Removed {
			gone[r] = true
		}
		for p := range st {
			for q := p; q != "."; q = path.Dir(q) {
				if gone[q] {
					delete(st, p)
					break
				}
			}
		}
	}
	for i := range m.Entries {
		e := m.Entries[i]
		st[e.Path] = &e
	}
}

// validate checks the tree is consistent: every parent is a directory of
// the state (or the layer's root) and hard links name regular files.
func (st State) validate() error {
	if len(st) > MaxEntries {
		return errors.New("too many entries")
	}
	for p, e := range st {
		if dir := path.Dir(p); dir != "." {
			if pe := st[dir]; pe == nil || pe.Type != TypeDir {
				return fmt.Errorf("%.100q: parent is not a directory of the layer", p)
			}
		}
		if e.Type == TypeHardlink {
			if t := st[e.Target]; t == nil || t.Type != TypeFile {
				return fmt.Errorf("%.100q: hard link to a missing file", p)
			}
		}
	}
	return nil
}

// Paths returns the state's paths in order, parents before children.
func (st State) Paths() []string {
	out := make([]string, 0, len(st))
	for p := range st {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// LogicalBytes is the total size of the state's regular files.
func (st State) LogicalBytes() int64 {
	var n int64
	for _, e := range st {
		if e.Type == TypeFile {
			n += e.Size
		}
	}
	return n
}
