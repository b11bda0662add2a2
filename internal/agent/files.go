package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
)

const (
	// DefaultMaxListEntries bounds a directory listing.
	DefaultMaxListEntries = 10000
	// maxUnsizedDownload bounds files that report size 0 (procfs, sysfs),
	// which are streamed without a Content-Length.
	maxUnsizedDownload = 64 << 20
)

// queryPath reads and cleans the "path" query parameter.
func queryPath(r *http.Request) (string, error) {
	return cleanPath(r.URL.Query().Get("path"))
}

func pathError(err error) error {
	return newAPIError(http.StatusBadRequest, CodeInvalidPath, "%v", err)
}

// Every file route acts as the request's user (fileUser: the "user" query
// parameter, else the sandbox's default user), with that user's
// permissions: what a command of that user could not read, write or reach,
// the route cannot either (403 permission_denied), and what it creates
// belongs to that user.

// request resolves a file request's path and user.
func (s *Server) request(r *http.Request) (string, fsUser, error) {
	p, err := queryPath(r)
	if err != nil {
		return "", fsUser{}, pathError(err)
	}
	u, err := s.fileUser(r)
	return p, u, err
}

func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request) {
	p, u, err := s.request(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	// O_NONBLOCK: opening a FIFO must not hang; it is refused below anyway.
	var f *os.File
	err = u.do(func() (err error) {
		f, err = os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		return err
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeErr(w, err)
		return
	}
	if fi.IsDir() {
		writeError(w, http.StatusBadRequest, CodeIsADirectory, "path is a directory")
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, http.StatusBadRequest, CodeNotAFile, "path is not a regular file")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	size := fi.Size()
	if size == 0 {
		io.Copy(w, io.LimitReader(f, maxUnsizedDownload))
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	// A file that shrinks meanwhile ends short of Content-Length, which
	// the client sees as an unexpected EOF rather than silent truncation.
	io.Copy(w, io.LimitReader(f, size))
}

func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	p, u, err := s.request(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if p == "/" {
		writeError(w, http.StatusBadRequest, CodeIsADirectory, "path is a directory")
		return
	}
	mode := os.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil || n > 0o7777 {
			writeError(w, http.StatusBadRequest, CodeBadRequest, "mode must be octal, at most 7777")
			return
		}
		mode = fileMode(uint32(n))
	}
	if r.ContentLength > s.opts.MaxUploadBytes {
		writeError(w, http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("upload larger than %d bytes", s.opts.MaxUploadBytes))
		return
	}
	if err := writeFile(u, p, mode, http.MaxBytesReader(w, r.Body, s.opts.MaxUploadBytes)); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fileMode converts unix permission bits, setuid/setgid/sticky included.
func fileMode(bits uint32) os.FileMode {
	m := os.FileMode(bits & 0o777)
	if bits&syscall.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if bits&syscall.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if bits&syscall.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}

// writeFile streams body into a temporary file next to p and renames it
// over p, so readers never see a half-written file and a symlink at p is
// replaced rather than followed. The directories, the file and the rename
// are made as u. A user who may write an existing file but not its
// directory (as "> file" in a command could) gets the file rewritten in
// place instead.
func writeFile(u fsUser, p string, mode os.FileMode, body io.Reader) (err error) {
	dir := filepath.Dir(p)
	var tmp *os.File
	inPlace := false
	err = u.do(func() error {
		if err := mkdirAll(dir); err != nil {
			return err
		}
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			return newAPIError(http.StatusBadRequest, CodeIsADirectory, "path is a directory")
		}
		t, err := os.CreateTemp(dir, ".space-upload-*")
		if err == nil {
			tmp = t
			return nil
		}
		if !errors.Is(err, fs.ErrPermission) {
			return err
		}
		f, ferr := openInPlace(p)
		if ferr != nil {
			return err // the directory's permission error says why
		}
		tmp, inPlace = f, true
		return nil
	})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			if !inPlace {
				u.do(func() error { return os.Remove(tmp.Name()) })
			}
		}
	}()
	if _, err := io.Copy(tmp, body); err != nil {
		return err
	}
	if inPlace {
		// Only the owner may change the mode; a writer who is not keeps it.
		if err := u.do(func() error { return tmp.Chmod(mode) }); err != nil && !errors.Is(err, fs.ErrPermission) {
			return err
		}
		return tmp.Close()
	}
	return u.do(func() error {
		if err := tmp.Chmod(mode); err != nil {
			return err
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		return os.Rename(tmp.Name(), p)
	})
}

// openInPlace opens an existing regular file (not a symlink) to rewrite it.
func openInPlace(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: p, Err: syscall.EINVAL}
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// mkdirAll is mkdir -p.
func mkdirAll(dir string) error {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return &fs.PathError{Op: "mkdir", Path: d, Err: syscall.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
		if d == "/" {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

func (s *Server) handleListDir(w http.ResponseWriter, r *http.Request) {
	p, u, err := s.request(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	list := FileList{Entries: []FileInfo{}}
	err = u.do(func() error {
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		limit := s.opts.maxListEntries
		for len(list.Entries) < limit {
			ents, err := f.ReadDir(min(1024, limit-len(list.Entries)))
			for _, e := range ents {
				fi, err := e.Info() // lstat
				if err != nil {
					continue // removed meanwhile, or not searchable by the user
				}
				list.Entries = append(list.Entries, fileInfo(filepath.Join(p, e.Name()), fi))
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
		if len(list.Entries) >= limit {
			// Peek: a directory of exactly the cap is not truncated.
			if more, _ := f.ReadDir(1); len(more) > 0 {
				list.Truncated = true
			}
		}
		return nil
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	sort.Slice(list.Entries, func(i, j int) bool { return list.Entries[i].Name < list.Entries[j].Name })
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleStat(w http.ResponseWriter, r *http.Request) {
	p, u, err := s.request(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	var info FileInfo
	err = u.do(func() error {
		fi, err := os.Lstat(p)
		if err == nil {
			info = fileInfo(p, fi)
		}
		return err
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// fileInfo describes fi (from lstat) found at p.
func fileInfo(p string, fi os.FileInfo) FileInfo {
	info := FileInfo{
		Name:    fi.Name(),
		Path:    p,
		Size:    fi.Size(),
		Mode:    uint32(fi.Mode().Perm()),
		ModTime: fi.ModTime().Unix(),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Mode = st.Mode & 0o7777
	}
	if p == "/" {
		info.Name = "/"
	}
	switch {
	case fi.Mode().IsRegular():
		info.Type = "file"
	case fi.IsDir():
		info.Type = "dir"
	case fi.Mode()&os.ModeSymlink != 0:
		info.Type = "symlink"
		if t, err := os.Readlink(p); err == nil {
			info.Target = t
		}
	default:
		info.Type = "other"
	}
	return info
}

func (s *Server) handleMkdir(w http.ResponseWriter, r *http.Request) {
	var req MkdirRequest
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, MaxJSONBody), &req); err != nil {
		writeErr(w, err)
		return
	}
	p, err := cleanPath(req.Path)
	if err != nil {
		writeErr(w, pathError(err))
		return
	}
	u, err := s.fileUser(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	err = u.do(func() error {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return newAPIError(http.StatusConflict, CodeAlreadyExists, "path exists and is not a directory")
		}
		return mkdirAll(p)
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleMove(w http.ResponseWriter, r *http.Request) {
	var req MoveRequest
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, MaxJSONBody), &req); err != nil {
		writeErr(w, err)
		return
	}
	from, err := cleanPath(req.From)
	if err != nil {
		writeErr(w, pathError(fmt.Errorf("from: %w", err)))
		return
	}
	to, err := cleanPath(req.To)
	if err != nil {
		writeErr(w, pathError(fmt.Errorf("to: %w", err)))
		return
	}
	if from == "/" || to == "/" {
		writeError(w, http.StatusBadRequest, CodeInvalidPath, "cannot move the root directory")
		return
	}
	u, err := s.fileUser(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := u.do(func() error { return os.Rename(from, to) }); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleRemove(w http.ResponseWriter, r *http.Request) {
	p, u, err := s.request(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	recursive := false
	if v := r.URL.Query().Get("recursive"); v != "" {
		if recursive, err = strconv.ParseBool(v); err != nil {
			writeError(w, http.StatusBadRequest, CodeBadRequest, "recursive must be true or false")
			return
		}
	}
	if p == "/" {
		writeError(w, http.StatusBadRequest, CodeInvalidPath, "cannot remove the root directory")
		return
	}
	err = u.do(func() error {
		if _, err := os.Lstat(p); err != nil {
			return err
		}
		if recursive {
			return os.RemoveAll(p) // never follows symlinks
		}
		return os.Remove(p)
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
