package api

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
)

// BuildfileRequest is a build-file build: the build file's text and the
// directory the uploaded build context was extracted to ("" for none).
type BuildfileRequest struct {
	Name       string
	File       []byte
	ContextDir string
	ProjectID  string // the requester's project: a pre-warm's sandbox and snapshot live there
	OpID       string // the build operation, which names its step logs
}

// StepLog is one build step that has a full log.
type StepLog struct {
	Step  int   `json:"step"`
	Bytes int64 `json:"bytes"`
}

// TemplateGCResult is what a template GC removed.
type TemplateGCResult struct {
	Removed []string `json:"removed"` // layer digests
}

var opIDRE = regexp.MustCompile(`^op-[0-9a-f]{16}$`)

// ValidOpID reports whether id has the shape of an operation id.
func ValidOpID(id string) bool { return opIDRE.MatchString(id) }

// TemplateAdmin is implemented by template back ends that build from build
// files, delete and alias templates (the server's). Without it those routes
// answer 501.
type TemplateAdmin interface {
	ValidateBuildfile(b []byte) error
	ExtractContext(ctx context.Context, r io.Reader, dir string) error
	BuildFromFile(ctx context.Context, req BuildfileRequest, progress core.Progress) (any, error)
	DeleteTemplate(ctx context.Context, name string) error
	AliasTemplate(ctx context.Context, name, alias string) (core.TemplateInfo, error)
	// BuildLog opens step's full log of build operation opID, or with
	// step 0 lists the steps that have one.
	BuildLog(ctx context.Context, opID string, step int) (*os.File, []StepLog, error)
	GCTemplates(ctx context.Context) (TemplateGCResult, error)
}

// taggedNameRE is a template name with an optional tag ("py:3.12").
var taggedNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}(:[a-z0-9][a-z0-9._-]{0,63})?$`)

const (
	maxBuildfile      = 256 << 10
	maxBuildContext   = 8 << 30
	buildNameRuleText = "name must match ^[a-z0-9][a-z0-9._-]{0,63} with an optional :tag of the same form"
)

func (s *Server) templateAdmin() (TemplateAdmin, error) {
	a, ok := s.o.Templates.(TemplateAdmin)
	if !ok {
		return nil, httpx.Errorf(http.StatusNotImplemented, "unimplemented", "this server cannot build, delete or alias templates")
	}
	return a, nil
}

// buildTemplateFile starts a build from a build file: multipart/form-data
// with a "buildfile" part (the text, ≤ 256 KiB) and an optional "context"
// part (a tar of the build context, ≤ 8 GiB), ?name=NAME[:TAG]. The context
// is extracted (hardened, bounded) while the request is read and removed
// when the build ends.
func (s *Server) buildTemplateFile(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	a, err := s.templateAdmin()
	if err != nil {
		return err
	}
	name, ref, err := queryBuildName(r, p, taggedNameRE, buildNameRuleText)
	if err != nil {
		return err
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBuildContext+maxBuildfile+1<<20)
	mr, err := r.MultipartReader()
	if err != nil {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "body must be multipart/form-data with a buildfile part and an optional context part (a tar)")
	}
	dir, err := os.MkdirTemp("", "space-build-context-")
	if err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	var file []byte
	haveContext := false
	contextSum := sha256.New() // the context's, for the idempotency fingerprint
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return bodyError(err, "reading the multipart body")
		}
		switch part.FormName() {
		case "buildfile":
			if file != nil {
				return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "more than one buildfile part")
			}
			b, err := io.ReadAll(io.LimitReader(part, maxBuildfile+1))
			if err != nil {
				return bodyError(err, "reading the build file")
			}
			if len(b) > maxBuildfile {
				return httpx.Errorf(http.StatusRequestEntityTooLarge, "body_too_large", "build file larger than %d bytes", maxBuildfile)
			}
			// Checked at once: a bad build file should not wait for (or
			// unpack) a large context sent after it.
			if err := a.ValidateBuildfile(b); err != nil {
				return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "%s", trimErr(err))
			}
			file = b
		case "context":
			if haveContext {
				return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "more than one context part")
			}
			haveContext = true
			if err := a.ExtractContext(r.Context(), io.TeeReader(part, contextSum), dir); err != nil {
				var mbe *http.MaxBytesError
				if errors.As(err, &mbe) {
					return httpx.Errorf(http.StatusRequestEntityTooLarge, "body_too_large", "build context larger than %d bytes", int64(maxBuildContext))
				}
				return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "build context: %s", trimErr(err))
			}
		default:
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "unknown part %.64q (want buildfile, context)", part.FormName())
		}
		part.Close()
	}
	if file == nil {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "missing the buildfile part")
	}
	op := s.o.Engine.NewOperation(p.ProjectID, "template.build", name)
	op.Fingerprint = core.Fingerprint(r.Method, r.URL.Path, r.URL.Query(), file, haveContext, contextSum.Sum(nil))
	req := BuildfileRequest{Name: ref, File: file, ProjectID: p.ProjectID, OpID: op.ID}
	if haveContext {
		req.ContextDir = dir
	}
	got, err := s.o.Engine.Submit(r.Context(), op, r.Header.Get("Idempotency-Key"), func(ctx context.Context, progress core.Progress) (any, error) {
		defer os.RemoveAll(dir)
		res, err := a.BuildFromFile(ctx, req, progress)
		if err == nil {
			s.audit(audit.WithRequestID(ctx, audit.RequestID(r.Context())), p, "template.build", "template", ref, "succeeded")
		}
		return res, err
	})
	if err != nil {
		return err
	}
	keep = got.ID == op.ID // the operation owns the directory now; a replay does not
	w.Header().Set("Location", "/v1/operations/"+got.ID)
	httpx.WriteJSON(w, http.StatusAccepted, map[string]any{"operation": got})
	return nil
}

func bodyError(err error, what string) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return httpx.Errorf(http.StatusRequestEntityTooLarge, "body_too_large", "request body too large")
	}
	return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "%s: %s", what, trimErr(err))
}

// trimErr bounds an error message echoed to a client.
func trimErr(err error) string {
	msg := strings.TrimPrefix(err.Error(), "invalid argument: ")
	if len(msg) > 512 {
		msg = msg[:512] + "…"
	}
	return msg
}

// deleteTemplate removes a template name of the caller's project (public
// ones: admin keys only); 409 while a sandbox uses it.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	a, err := s.templateAdmin()
	if err != nil {
		return err
	}
	ref, _, err := s.lookupTemplate(r.Context(), p, r.PathValue("name"))
	if err != nil {
		return err
	}
	if err := s.writable(r.Context(), p, ref, "template.delete"); err != nil {
		return err
	}
	if err := a.DeleteTemplate(r.Context(), ref); err != nil {
		return err
	}
	s.audit(r.Context(), p, "template.delete", "template", ref, "succeeded")
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// writable refuses a project key's change to a public template.
func (s *Server) writable(ctx context.Context, p auth.Principal, ref, action string) error {
	if owner, _ := core.SplitTemplateRef(ref); owner == "" && !p.Admin {
		s.audit(ctx, p, action, "template", ref, "denied")
		return httpx.Errorf(http.StatusForbidden, "forbidden", "template %q is public: read-only to project keys", ref)
	}
	return nil
}

// aliasTemplate points another name (or name:tag) at the same immutable
// template: {"alias":"py:stable"}.
// The alias is made in the caller's project, or with "public": true
// (admin keys only) in the public scope; the template it points at may be
// the project's own or a public one.
func (s *Server) aliasTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	a, err := s.templateAdmin()
	if err != nil {
		return err
	}
	var req struct {
		Alias  string `json:"alias"`
		Public bool   `json:"public,omitempty"`
	}
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	ref, _, err := s.lookupTemplate(r.Context(), p, r.PathValue("name"))
	if err != nil {
		return err
	}
	if !taggedNameRE.MatchString(req.Alias) {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "alias: %s", buildNameRuleText)
	}
	target, err := buildScope(p, req.Alias, req.Public)
	if err != nil {
		s.audit(r.Context(), p, "template.alias", "template", req.Alias, "denied")
		return err
	}
	t, err := a.AliasTemplate(r.Context(), ref, target)
	if err != nil {
		return err
	}
	s.audit(r.Context(), p, "template.alias", "template", target, "succeeded")
	httpx.WriteJSON(w, http.StatusOK, t)
	return nil
}

// buildLogs serves a build's full step logs: ?step=N gives step N's log as
// text (the first 4 MiB of its output); without step, the steps that have
// one. Only the project that started the build sees them.
func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	a, err := s.templateAdmin()
	if err != nil {
		return err
	}
	id := r.PathValue("op")
	if !ValidOpID(id) {
		return httpx.Errorf(http.StatusNotFound, "not_found", "no operation %.64q", id)
	}
	op, err := s.o.Store.GetOperation(r.Context(), p.ProjectID, id)
	if err != nil {
		return err
	}
	if op.Kind != "template.build" {
		return httpx.Errorf(http.StatusNotFound, "not_found", "operation %s is a %s, not a build-file build", id, op.Kind)
	}
	step := 0
	if v := r.URL.Query().Get("step"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "step must be a step number (1-1000)")
		}
		step = n
	}
	f, list, err := a.BuildLog(r.Context(), id, step)
	if err != nil {
		return err
	}
	if f == nil {
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"operation": id, "steps": list})
		return nil
	}
	defer f.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if fi, err := f.Stat(); err == nil {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	}
	w.WriteHeader(http.StatusOK)
	io.Copy(w, f)
	return nil
}

// gcTemplates removes template layers no name refers to and no live
// sandbox uses (the build cache); later builds make them again.
// Admin keys only: the layers are shared by every project.
func (s *Server) gcTemplates(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	if !p.Admin {
		s.audit(r.Context(), p, "template.gc", "templates", "", "denied")
		return httpx.Errorf(http.StatusForbidden, "forbidden", "template GC needs an admin key")
	}
	a, err := s.templateAdmin()
	if err != nil {
		return err
	}
	s.audit(r.Context(), p, "template.gc", "templates", "", "succeeded")
	res, err := a.GCTemplates(r.Context())
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, res)
	return nil
}
