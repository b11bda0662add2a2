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

// owner is who files created on behalf of a request belong to: the "user"
// query parameter, else the configured default user. ok is false when files
// stay owned by the agent (no user, or the agent is not root).
func (s *Server) owner(r *http.Request) (uid, gid int, ok bool, err error) {
	name := r.URL.Query().Get("user")
	if name == "" {
		name = s.config().User
	}
	if name == "" || os.Geteuid() != 0 {
		return 0, 0, false, nil
	}
	acct, err := lookupUser(s.opts.etcDir, name)
	if err != nil {
		return 0, 0, false, newAPIError(http.StatusBadRequest, CodeUnknownUser, "%v", err)
	}
	return int(acct.UID), int(acct.GID), acct.UID != 0 || acct.GID != 0, nil
}

func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeErr(w, pathError(err))
		return
	}
	// O_NONBLOCK: opening a FIFO must not hang; it is refused below anyway.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
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
	p, err := queryPath(r)
	if err != nil {
		writeErr(w, pathError(err))
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
	uid, gid, chown, err := s.owner(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := s.writeFile(p, mode, http.MaxBytesReader(w, r.Body, s.opts.MaxUploadBytes), uid, gid, chown); err != nil {
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
// replaced rather than followed.
func (s *Server) writeFile(p string, mode os.FileMode, body io.Reader, uid, gid int, chown bool) (err error) {
	dir := filepath.Dir(p)
	created, err := mkdirAll(dir)
	if err != nil {
		return err
	}
	if chown {
		chownAll(created, uid, gid)
	}
	if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
		return newAPIError(http.StatusBadRequest, CodeIsADirectory, "path is a directory")
	}
	tmp, err := os.CreateTemp(dir, ".space-upload-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, body); err != nil {
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if chown {
		if err := tmp.Chown(uid, gid); err != nil {
			return err
		}
		// chown clears setuid/setgid; put the requested mode back.
		if err := tmp.Chmod(mode); err != nil {
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// mkdirAll is mkdir -p that reports the directories it created, so they
// can be given to the requesting user.
func mkdirAll(dir string) ([]string, error) {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return nil, &fs.PathError{Op: "mkdir", Path: d, Err: syscall.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, d)
		if d == "/" {
			break
		}
	}
	var created []string
	for i := len(missing) - 1; i >= 0; i-- {
		err := os.Mkdir(missing[i], 0o755)
		if err == nil {
			created = append(created, missing[i])
		} else if !errors.Is(err, fs.ErrExist) {
			return created, err
		}
	}
	return created, nil
}

func chownAll(paths []string, uid, gid int) {
	for _, p := range paths {
		os.Lchown(p, uid, gid) // best effort: the directory exists either way
	}
}

func (s *Server) handleListDir(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeErr(w, pathError(err))
		return
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		writeErr(w, err)
		return
	}
	defer f.Close()
	list := FileList{Entries: []FileInfo{}}
	limit := s.opts.maxListEntries
	for len(list.Entries) < limit {
		ents, err := f.ReadDir(min(1024, limit-len(list.Entries)))
		for _, e := range ents {
			fi, err := e.Info() // lstat
			if err != nil {
				continue // removed meanwhile
			}
			list.Entries = append(list.Entries, fileInfo(filepath.Join(p, e.Name()), fi))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			writeErr(w, err)
			return
		}
	}
	if len(list.Entries) >= limit {
		// Peek: a directory of exactly the cap is not truncated.
		if more, _ := f.ReadDir(1); len(more) > 0 {
			list.Truncated = true
		}
	}
	sort.Slice(list.Entries, func(i, j int) bool { return list.Entries[i].Name < list.Entries[j].Name })
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleStat(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeErr(w, pathError(err))
		return
	}
	fi, err := os.Lstat(p)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
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
	uid, gid, chown, err := s.owner(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		writeError(w, http.StatusConflict, CodeAlreadyExists, "path exists and is not a directory")
		return
	}
	created, err := mkdirAll(p)
	if chown {
		chownAll(created, uid, gid)
	}
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
	if err := os.Rename(from, to); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleRemove(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeErr(w, pathError(err))
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
	if _, err := os.Lstat(p); err != nil {
		writeErr(w, err)
		return
	}
	if recursive {
		err = os.RemoveAll(p) // never follows symlinks
	} else {
		err = os.Remove(p)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
