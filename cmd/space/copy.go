package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/space-sandbox/space/pkg/client"
)

// sandboxCopy copies files or directories into or out of a sandbox, the
// way docker cp does: `cp SRC ID:DST` uploads, `cp ID:SRC DST` downloads;
// a destination that is an existing directory (or ends in /) receives the
// source under its own name, a directory source is copied recursively,
// and "-" is stdin or stdout for a single file.
func sandboxCopy(args []string) error {
	fs, cl := newClientFlags("sandbox cp")
	mode := fs.String("mode", "", "file mode of an uploaded file, octal (default: the local file's)")
	user := fs.String("user", "", "act as this user in the sandbox (name or uid): its permissions, and it owns what is created (default: the sandbox's default user)")
	progress := fs.Bool("progress", isTerminal(os.Stderr), "show progress on stderr (default: when it is a terminal)")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 2, "[--user U] LOCAL ID:PATH | ID:PATH LOCAL"); err != nil {
		return err
	}
	src, dst := pos[0], pos[1]
	srcID, srcPath, srcRemote := splitRemote(src)
	dstID, dstPath, dstRemote := splitRemote(dst)
	if srcRemote == dstRemote {
		return usagef("exactly one of the two paths must be ID:PATH (an absolute path in the sandbox)")
	}
	var perm os.FileMode
	if *mode != "" {
		m, err := strconv.ParseUint(*mode, 8, 32)
		if err != nil || m > 0o7777 {
			return usagef("bad --mode %q (want octal, e.g. 0755)", *mode)
		}
		perm = os.FileMode(m).Perm()
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	id := dstID
	if srcRemote {
		id = srcID
	}
	sc, err := c.Connect(ctx, id)
	if err != nil {
		return err
	}
	sc = sc.AsUser(*user)
	cp := &copier{sc: sc, progress: *progress, perm: perm}
	if dstRemote {
		err = cp.upload(ctx, src, dst, dstPath)
	} else {
		err = cp.download(ctx, src, srcPath, dst)
	}
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(map[string]any{"source": src, "destination": dst, "bytes": cp.bytes, "files": cp.files})
	}
	return nil
}

// copier holds one cp's connection and counters.
type copier struct {
	sc       *client.SandboxConn
	progress bool
	perm     os.FileMode // --mode; 0: the source file's
	bytes    int64
	files    int
}

// upload copies a local file or directory to the sandbox.
func (cp *copier) upload(ctx context.Context, src, dst, dstPath string) error {
	if src == "-" {
		return cp.uploadFile(ctx, os.Stdin, -1, 0, dst, dstPath)
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	// docker cp: into an existing directory, under the source's name.
	target := dstPath
	if dfi, err := cp.sc.Stat(ctx, dstPath); err == nil && dfi.Type == "dir" || strings.HasSuffix(dst, "/") {
		if !strings.HasSuffix(src, "/.") {
			target = path.Join(dstPath, filepath.Base(filepath.Clean(src)))
		}
	} else if err != nil && !client.IsNotFound(err) {
		return err
	}
	if !st.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		return cp.uploadFile(ctx, f, st.Size(), st.Mode().Perm(), dst, target)
	}
	root := filepath.Clean(src)
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		remote := path.Join(target, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			return cp.sc.Mkdir(ctx, remote)
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return cp.uploadFile(ctx, f, info.Size(), info.Mode().Perm(), "", remote)
		default:
			fmt.Fprintf(os.Stderr, "space: skipped %s: not a regular file or directory\n", p)
			return nil
		}
	})
}

func (cp *copier) uploadFile(ctx context.Context, r io.Reader, size int64, mode os.FileMode, label, remote string) error {
	if cp.perm != 0 {
		mode = cp.perm
	}
	if label == "" {
		label = remote
	}
	pr := newCopyProgress("upload "+label, size, cp.progress)
	err := cp.sc.Upload(ctx, remote, mode, pr.reader(r))
	cp.bytes += pr.done(err)
	if err != nil {
		return fmt.Errorf("upload %s: %w", remote, err)
	}
	cp.files++
	return nil
}

// download copies a sandbox file or directory to the local machine.
func (cp *copier) download(ctx context.Context, src, srcPath, dst string) error {
	fi, err := cp.sc.Stat(ctx, srcPath)
	if err != nil {
		return err
	}
	if dst == "-" {
		if fi.Type == "dir" {
			return usagef("%s is a directory: copy it to a local directory, not to stdout", src)
		}
		return cp.downloadFile(ctx, src, srcPath, fi.Size, os.Stdout)
	}
	target := dst
	if st, err := os.Stat(dst); err == nil && st.IsDir() || strings.HasSuffix(dst, "/") {
		if !strings.HasSuffix(srcPath, "/.") {
			target = filepath.Join(dst, path.Base(path.Clean(srcPath)))
		}
	}
	if fi.Type != "dir" {
		return cp.downloadTo(ctx, src, srcPath, fi, target)
	}
	return cp.downloadDir(ctx, path.Clean(srcPath), target)
}

func (cp *copier) downloadDir(ctx context.Context, remote, local string) error {
	if err := os.MkdirAll(local, 0o755); err != nil {
		return err
	}
	entries, err := cp.sc.ListDir(ctx, remote)
	if err != nil {
		return err
	}
	for _, e := range entries {
		r, l := path.Join(remote, e.Name), filepath.Join(local, e.Name)
		switch e.Type {
		case "dir":
			err = cp.downloadDir(ctx, r, l)
		case "file":
			err = cp.downloadTo(ctx, r, r, e, l)
		default:
			fmt.Fprintf(os.Stderr, "space: skipped %s: a %s, not a regular file or directory\n", r, e.Type)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// downloadTo writes a sandbox file to a local path through a temporary
// file, so that a failed copy leaves no partial file behind.
func (cp *copier) downloadTo(ctx context.Context, label, remote string, fi client.FileInfo, local string) error {
	tmp := local + ".space-part"
	mode := os.FileMode(fi.Mode).Perm()
	if mode == 0 {
		mode = 0o644
	}
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	defer f.Close()
	if err := cp.downloadFile(ctx, label, remote, fi.Size, f); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, local)
}

func (cp *copier) downloadFile(ctx context.Context, label, remote string, size int64, w io.Writer) error {
	rc, err := cp.sc.Download(ctx, remote)
	if err != nil {
		return err
	}
	defer rc.Close()
	pr := newCopyProgress("download "+label, size, cp.progress)
	_, err = io.Copy(w, pr.reader(rc))
	cp.bytes += pr.done(err)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return err
		}
		return fmt.Errorf("download %s: %w", remote, err)
	}
	cp.files++
	return nil
}
