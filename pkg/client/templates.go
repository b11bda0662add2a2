package client

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
)

// TemplateBuildStep is one step of a build-file build (see
// BuildTemplateFile).
type TemplateBuildStep struct {
	Step            int     `json:"step"` // 1-based; FROM is step 1
	Instruction     string  `json:"instruction"`
	Cached          bool    `json:"cached"`
	Seconds         float64 `json:"seconds"`
	Bytes           int64   `json:"bytes"`
	Layer           string  `json:"layer,omitempty"`
	Output          string  `json:"output,omitempty"` // tail of a RUN step's output
	OutputTruncated bool    `json:"output_truncated,omitempty"`
	// LogBytes is the size of the step's full log (TemplateBuildLog);
	// LogTruncated: output beyond its bound (4 MiB) was dropped.
	LogBytes     int64 `json:"log_bytes,omitempty"`
	LogTruncated bool  `json:"log_truncated,omitempty"`
}

// TemplateBuildResult is the result of a build-file operation.
type TemplateBuildResult struct {
	Template TemplateInfo        `json:"template"`
	Steps    []TemplateBuildStep `json:"steps"`
	Warm     *TemplateWarm       `json:"warm,omitempty"`
}

// TemplateWarm is a build's pre-warm (a build file with START): the
// snapshot taken once the ready check passed.
type TemplateWarm struct {
	Snapshot    string  `json:"snapshot"`
	Kind        string  `json:"kind"` // "process" or "filesystem"
	Processes   string  `json:"processes"`
	Seconds     float64 `json:"seconds"`
	ReadyChecks int     `json:"ready_checks"`
	Cached      bool    `json:"cached,omitempty"`
}

// TemplateStepLog is a build step that has a full log.
type TemplateStepLog struct {
	Step  int   `json:"step"`
	Bytes int64 `json:"bytes"`
}

// TemplateBuildLogSteps lists the steps of build operation opID that have
// a full log (RUN steps that ran).
func (c *Client) TemplateBuildLogSteps(ctx context.Context, opID string) ([]TemplateStepLog, error) {
	var res struct {
		Steps []TemplateStepLog `json:"steps"`
	}
	u, err := route(c.base, "/v1/templates/builds/%s/logs", opID)
	if err != nil {
		return nil, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &res})
	return res.Steps, err
}

// TemplateBuildLog streams step's full log (the first 4 MiB of its output)
// of build operation opID; the caller closes it.
func (c *Client) TemplateBuildLog(ctx context.Context, opID string, step int) (io.ReadCloser, error) {
	u, err := route(c.base, "/v1/templates/builds/%s/logs", opID)
	if err != nil {
		return nil, err
	}
	resp, err := c.r.do(ctx, request{method: http.MethodGet, url: fmt.Sprintf("%s?step=%d", u, step), stream: true})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// GCTemplates removes template layers no name refers to and no live
// sandbox uses; it returns their digests.
func (c *Client) GCTemplates(ctx context.Context) ([]string, error) {
	var res struct {
		Removed []string `json:"removed"`
	}
	_, err := c.r.do(ctx, request{method: http.MethodPost, url: c.base + "/v1/templates/gc", out: &res})
	return res.Removed, err
}

// BuildTemplateFile starts a build from a build file (FROM, RUN, COPY, ENV,
// WORKDIR, USER, START, READY). contextTar, when not nil, is a tar of the
// build context that COPY reads (see WriteContextTar); it is streamed, not
// buffered. name may carry a tag ("py:3.12").
func (c *Client) BuildTemplateFile(ctx context.Context, name string, buildfile []byte, contextTar io.Reader, idemKey string) (Operation, error) {
	return c.buildTemplateFile(ctx, name, buildfile, contextTar, idemKey, false)
}

// PublishTemplateFile is BuildTemplateFile for a public template, one every
// project may use (admin keys only; a project key gets 403).
func (c *Client) PublishTemplateFile(ctx context.Context, name string, buildfile []byte, contextTar io.Reader, idemKey string) (Operation, error) {
	return c.buildTemplateFile(ctx, name, buildfile, contextTar, idemKey, true)
}

func (c *Client) buildTemplateFile(ctx context.Context, name string, buildfile []byte, contextTar io.Reader, idemKey string, public bool) (Operation, error) {
	var res struct {
		Operation Operation `json:"operation"`
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		err := func() error {
			part, err := mw.CreateFormFile("buildfile", "Buildfile")
			if err != nil {
				return err
			}
			if _, err := part.Write(buildfile); err != nil {
				return err
			}
			if contextTar != nil {
				part, err := mw.CreateFormFile("context", "context.tar")
				if err != nil {
					return err
				}
				if _, err := io.Copy(part, contextTar); err != nil {
					return err
				}
			}
			return mw.Close()
		}()
		pw.CloseWithError(err)
	}()
	h := idemHeader(idemKey)
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", mw.FormDataContentType())
	u := c.base + "/v1/templates/build?name=" + url.QueryEscape(name)
	if public {
		u += "&public=true"
	}
	_, err := c.r.do(ctx, request{method: http.MethodPost, url: u,
		header: h, body: pr, out: &res, noTimeout: true})
	pr.CloseWithError(io.ErrClosedPipe) // unblocks the writer if the server answered early
	return res.Operation, err
}

// DeleteTemplate removes a template name; the server answers 409 (an
// *APIError with code "conflict") while sandboxes use it.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	u, err := route(c.base, "/v1/templates/%s", name)
	if err != nil {
		return err
	}
	_, err = c.r.do(ctx, request{method: http.MethodDelete, url: u})
	return err
}

// AliasTemplate points alias (a name or name:tag) at the template name.
func (c *Client) AliasTemplate(ctx context.Context, name, alias string) (TemplateInfo, error) {
	var t TemplateInfo
	u, err := route(c.base, "/v1/templates/%s/alias", name)
	if err != nil {
		return t, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, json: map[string]string{"alias": alias}, out: &t})
	return t, err
}

// WriteContextTar writes the directory dir as a build-context tar to w:
// directories, regular files and symlinks with their permission bits,
// owned by root; other file types are skipped.
func WriteContextTar(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Format: tar.FormatPAX}
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case fi.Mode()&fs.ModeSymlink != 0:
			if hdr.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
			hdr.Typeflag = tar.TypeSymlink
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		default:
			return nil
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.Copy(tw, io.LimitReader(f, fi.Size()))
		if err != nil {
			return err
		}
		if n != fi.Size() {
			return fmt.Errorf("%s shrank while being read", p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("build context %s: %w", dir, err)
	}
	return tw.Close()
}
