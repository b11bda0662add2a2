package e2b

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/core"
)

const maxUploadParts = 1000

// restStatus maps an error from the agent or core to an HTTP status and a
// message safe to show. The agent is untrusted: its 5xx text is hidden.
func restStatus(err error) (int, string) {
	var ae *client.Error
	switch {
	case errors.As(err, &ae):
		switch {
		case ae.Status == http.StatusInsufficientStorage:
			return ae.Status, "not enough space in the sandbox"
		case ae.Status >= 400 && ae.Status < 500:
			return ae.Status, ae.Message
		}
		return http.StatusInternalServerError, "the sandbox agent failed"
	case errors.Is(err, core.ErrInvalid):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, core.ErrNotFound):
		return http.StatusNotFound, err.Error()
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("upload larger than %d bytes", mbe.Limit)
	}
	return http.StatusInternalServerError, "internal error"
}

// fileUser is who a /files request acts as: its "username" query parameter
// (envd's; "user" is taken too), else the Basic auth user, else the
// sandbox's default user. The agent reads and writes with that user's
// permissions, and what it creates belongs to that user.
func fileUser(r *http.Request, c *call) string {
	if c.signed {
		return c.user
	}
	q := r.URL.Query()
	if u := q.Get("username"); u != "" {
		return u
	}
	if u := q.Get("user"); u != "" {
		return u
	}
	return c.user
}

func (e *Envd) download(w http.ResponseWriter, r *http.Request, c *call) {
	q := r.URL.Query()
	user := fileUser(r, c)
	p, err := resolvePath(q.Get("path"), user)
	if err != nil {
		envdError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	rc, size, err := c.sb.Agent.As(user).Download(r.Context(), p)
	if err != nil {
		st, msg := restStatus(err)
		envdError(w, r, st, msg)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	http.NewResponseController(w).SetWriteDeadline(time.Time{})
	w.WriteHeader(http.StatusOK)
	io.Copy(w, rc)
}

// uploadedEntry is one element of the upload answer.
type uploadedEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// capReader fails once more than n bytes were read, bounding what a gzip
// body may expand to.
type capReader struct {
	r io.Reader
	n int64
}

func (c *capReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n -= int64(k)
	if c.n < 0 {
		return k, &http.MaxBytesError{Limit: maxUploadBytes}
	}
	return k, err
}

func (e *Envd) upload(w http.ResponseWriter, r *http.Request, c *call) {
	q := r.URL.Query()
	user := fileUser(r, c)
	ag := c.sb.Agent.As(user)
	http.NewResponseController(w).SetReadDeadline(time.Time{})
	body := http.MaxBytesReader(w, r.Body, maxUploadBytes)
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []uploadedEntry
	put := func(target string, data io.Reader) error {
		p, err := resolvePath(target, user)
		if err != nil {
			return err
		}
		if err := ag.Upload(r.Context(), p, 0o644, data); err != nil {
			return err
		}
		out = append(out, uploadedEntry{Path: p, Name: path.Base(p), Type: "file"})
		return nil
	}
	var err error
	switch ct {
	case "multipart/form-data":
		err = e.uploadMultipart(r, body, q.Get("path"), put)
	case "application/octet-stream", "":
		if q.Get("path") == "" {
			err = fmt.Errorf("an octet-stream upload needs ?path=: %w", core.ErrInvalid)
			break
		}
		var data io.Reader = body
		switch r.Header.Get("Content-Encoding") {
		case "", "identity":
		case "gzip":
			zr, zerr := gzip.NewReader(body)
			if zerr != nil {
				err = fmt.Errorf("body is not gzip: %w", core.ErrInvalid)
				break
			}
			data = &capReader{r: zr, n: maxUploadBytes}
		default:
			err = fmt.Errorf("unsupported Content-Encoding: %w", core.ErrInvalid)
		}
		if err == nil {
			err = put(q.Get("path"), data)
		}
	default:
		err = fmt.Errorf("Content-Type must be multipart/form-data or application/octet-stream: %w", core.ErrInvalid)
	}
	if err != nil {
		st, msg := restStatus(err)
		envdError(w, r, st, msg)
		return
	}
	if len(out) == 0 {
		envdError(w, r, http.StatusBadRequest, "no file in the upload")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// uploadMultipart writes each "file" part. Its destination is the ?path=
// query when given (one file), else the part's filename, which the SDK sets
// to the full destination path (mime.Part.FileName would strip it).
func (e *Envd) uploadMultipart(r *http.Request, body io.Reader, qpath string, put func(string, io.Reader) error) error {
	r.Body = io.NopCloser(body)
	mr, err := r.MultipartReader()
	if err != nil {
		return fmt.Errorf("bad multipart body: %w", core.ErrInvalid)
	}
	for n := 0; ; n++ {
		part, err := mr.NextPart()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return err
			}
			return fmt.Errorf("bad multipart body: %w", core.ErrInvalid)
		}
		if n >= maxUploadParts {
			return fmt.Errorf("more than %d parts: %w", maxUploadParts, core.ErrInvalid)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		target := qpath
		if target == "" || n > 0 {
			_, params, perr := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if perr != nil || params["filename"] == "" {
				return fmt.Errorf("part %d has no filename: %w", n, core.ErrInvalid)
			}
			target = params["filename"]
		}
		err = put(target, part)
		part.Close()
		if err != nil {
			return err
		}
	}
}
