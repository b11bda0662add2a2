// Package api serves SPACE's control API: HTTP/JSON with server-sent events,
// authenticated by API keys and scoped to the key's project. Every lifecycle
// change answers 202 with an operation. Errors use the envelope
// {"error":{"code","message"}}; core errors are mapped to status codes here,
// at the edge, and nowhere else.
package api

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/version"
)

//go:embed openapi.json
var openapiDoc []byte

// OpenAPI returns the served OpenAPI 3 document.
func OpenAPI() []byte { return openapiDoc }

// Options configure the API.
type Options struct {
	Service    *core.Service
	Engine     *core.Engine
	Broker     *core.Broker
	Keys       *auth.Keys
	Sessions   *auth.Sessions
	Templates  core.Templates
	Store      core.Store
	DataURL    string        // public base URL of the data plane, returned with session tokens
	SessionTTL time.Duration // lifetime of issued session tokens
	Logf       func(string, ...any)
	Now        func() time.Time

	// DataURLFor, if set, names the data plane of one sandbox's node (remote
	// nodes); "" falls back to DataURL.
	DataURLFor func(core.Sandbox) string
	// SandboxDomain is the domain of forwarded ports' host form; "" derives
	// it from the sandbox's data URL (portfwd.DefaultDomain).
	SandboxDomain string

	// Credentials is the egress credential store (nil: no egress gateway).
	Credentials Credentials
	// Info, if set, describes the node for GET /v1/info.
	Info func() Info
	// Audit receives security decisions (nil: discarded).
	Audit *audit.Log
}

// Info describes the node behind the server (GET /v1/info).
type Info struct {
	// Version and Commit name the server's build (internal/version); the
	// handler fills them in.
	Version      string `json:"version"`
	Commit       string `json:"commit,omitempty"`
	Driver       string `json:"driver"`
	DriverReason string `json:"driver_reason,omitempty"`
	Egress       bool   `json:"egress"`
	Runsc        string `json:"runsc,omitempty"`
	// EgressRanges are the gateway's effective address sets (with egress).
	EgressRanges *core.EgressRanges `json:"egress_ranges,omitempty"`
	// NodeEgressRanges are those of each ready node with egress
	// (--remote-nodes).
	NodeEgressRanges map[string]*core.EgressRanges `json:"node_egress_ranges,omitempty"`
}

// Credentials stores a project's egress credentials. Secrets go in and
// never come out.
type Credentials interface {
	CreateCredential(ctx context.Context, projectID string, req core.CredentialRequest) (core.Credential, error)
	ListCredentials(ctx context.Context, projectID string) ([]core.Credential, error)
	GetCredential(ctx context.Context, projectID, id string) (core.Credential, error)
	DeleteCredential(ctx context.Context, projectID, id string) error
}

// Server is the control API handler.
type Server struct {
	o    Options
	mux  *http.ServeMux
	edge http.Handler // mux behind the request media-type check
}

type route struct {
	method, pattern string
	public          bool
	h               func(s *Server, w http.ResponseWriter, r *http.Request, p auth.Principal) error
}

// routes is the single table of the control API; the OpenAPI test checks the
// served document against it.
var routes = []route{
	{"GET", "/healthz", true, (*Server).health},
	{"GET", "/openapi.json", true, (*Server).openapi},
	{"GET", "/v1/info", false, (*Server).info},
	{"POST", "/v1/sandboxes", false, (*Server).createSandbox},
	{"GET", "/v1/sandboxes", false, (*Server).listSandboxes},
	{"GET", "/v1/sandboxes/{id}", false, (*Server).getSandbox},
	{"DELETE", "/v1/sandboxes/{id}", false, (*Server).deleteSandbox},
	{"POST", "/v1/sandboxes/{id}/timeout", false, (*Server).setTimeout},
	{"POST", "/v1/sandboxes/{id}/session", false, (*Server).newSession},
	{"POST", "/v1/sandboxes/{id}/ports/{port}/url", false, (*Server).portURL},
	{"PUT", "/v1/sandboxes/{id}/network", false, (*Server).setNetwork},
	{"GET", "/v1/sandboxes/{id}/network/log", false, (*Server).networkLog},
	{"GET", "/v1/sandboxes/{id}/metrics", false, (*Server).sandboxMetrics},
	{"POST", "/v1/sandboxes/{id}/pause", false, (*Server).pauseSandbox},
	{"POST", "/v1/sandboxes/{id}/hibernate", false, (*Server).hibernateSandbox},
	{"POST", "/v1/sandboxes/{id}/resume", false, (*Server).resumeSandbox},
	{"POST", "/v1/sandboxes/{id}/snapshots", false, (*Server).createSnapshot},
	{"GET", "/v1/snapshots", false, (*Server).listSnapshots},
	{"GET", "/v1/snapshots/{id}", false, (*Server).getSnapshot},
	{"DELETE", "/v1/snapshots/{id}", false, (*Server).deleteSnapshot},
	{"POST", "/v1/snapshots/{id}/fork", false, (*Server).forkSnapshot},
	{"POST", "/v1/credentials", false, (*Server).createCredential},
	{"GET", "/v1/credentials", false, (*Server).listCredentials},
	{"DELETE", "/v1/credentials/{id}", false, (*Server).deleteCredential},
	{"GET", "/v1/operations/{id}", false, (*Server).getOperation},
	{"GET", "/v1/operations/{id}/events", false, (*Server).operationEvents},
	{"GET", "/v1/events", false, (*Server).events},
	{"GET", "/v1/templates", false, (*Server).listTemplates},
	{"GET", "/v1/templates/{name}", false, (*Server).getTemplate},
	{"POST", "/v1/templates", false, (*Server).buildTemplate},
	{"POST", "/v1/templates/upload", false, (*Server).uploadTemplate},
	{"POST", "/v1/templates/build", false, (*Server).buildTemplateFile},
	{"DELETE", "/v1/templates/{name}", false, (*Server).deleteTemplate},
	{"POST", "/v1/templates/{name}/alias", false, (*Server).aliasTemplate},
	{"GET", "/v1/templates/builds/{op}/logs", false, (*Server).buildLogs},
	{"POST", "/v1/templates/gc", false, (*Server).gcTemplates},
	{"GET", "/v1/keys", false, (*Server).listKeys},
	{"POST", "/v1/keys", false, (*Server).createKey},
	{"DELETE", "/v1/keys/{id}", false, (*Server).revokeKey},
	{"GET", "/v1/nodes", false, (*Server).listNodes},
	{"POST", "/v1/nodes/{name}/drain", false, (*Server).drainNode},
	{"POST", "/v1/nodes/{name}/undrain", false, (*Server).undrainNode},
}

// Routes returns "METHOD pattern" for every route (for tests and docs).
func Routes() []string {
	out := make([]string, len(routes))
	for i, rt := range routes {
		out[i] = rt.method + " " + rt.pattern
	}
	return out
}

// New returns the control API.
func New(o Options) *Server {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	s := &Server{o: o, mux: http.NewServeMux()}
	for _, rt := range routes {
		rt := rt
		s.mux.HandleFunc(rt.method+" "+rt.pattern, func(w http.ResponseWriter, r *http.Request) {
			var p auth.Principal
			if !rt.public {
				var err error
				if p, err = s.authenticate(r); err != nil {
					httpx.WriteError(w, err)
					return
				}
			}
			if err := rt.h(s, w, r, p); err != nil {
				if !rt.public {
					s.auditRefusal(r, rt, p, err)
				}
				httpx.WriteError(w, err)
			}
		})
	}
	s.mux.HandleFunc("/", httpx.NotFound)
	// Request bodies must have the media types openapi.json gives each
	// route (415 otherwise); no Content-Type is read as JSON.
	edge, err := httpx.ContentTypes(openapiDoc, s.mux, s.mux)
	if err != nil {
		panic(err) // the embedded document; its tests parse it
	}
	s.edge = edge
	return s
}

// ServeHTTP implements http.Handler. Every request gets a request id (the
// client's X-Request-Id when it is a sane token), echoed in the response
// and carried into the audit log.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := audit.RequestIDFrom(r.Header.Get("X-Request-Id"))
	w.Header().Set("X-Request-Id", id)
	r = r.WithContext(audit.WithRequestID(r.Context(), id))
	httpx.Recover(s.edge, s.o.Logf).ServeHTTP(w, r)
}

// audit records a decision about one object.
func (s *Server) audit(ctx context.Context, p auth.Principal, action, kind, target, outcome string) {
	s.o.Audit.Record(ctx, audit.Event{Action: action, Outcome: outcome, ProjectID: p.ProjectID, KeyID: p.KeyID,
		Admin: p.Admin, Kind: kind, Target: target})
}

// auditRefusal records a 403, and a 404 for an object that exists in
// another project: a refused cross-project access.
func (s *Server) auditRefusal(r *http.Request, rt route, p auth.Principal, err error) {
	status, _, msg := httpx.StatusOf(err)
	action := rt.method + " " + rt.pattern
	ev := audit.Event{Action: action, Outcome: "denied", ProjectID: p.ProjectID, KeyID: p.KeyID, Admin: p.Admin}
	switch status {
	case http.StatusForbidden:
		ev.Reason = msg
	case http.StatusNotFound:
		ev.Kind, ev.Target, ev.Owner = s.ownerOf(r, p)
		if ev.Owner == "" || ev.Owner == p.ProjectID {
			return
		}
		ev.Reason = "object of another project"
	default:
		return
	}
	if ev.Target == "" {
		ev.Kind, ev.Target, _ = s.ownerOf(r, p)
	}
	s.o.Audit.Record(r.Context(), ev)
}

// ownerOf names the object a request's path addresses and the project
// that owns it ("" if there is none).
func (s *Server) ownerOf(r *http.Request, p auth.Principal) (kind, target, owner string) {
	ctx := r.Context()
	if s.o.Store == nil {
		return "", "", ""
	}
	if id := r.PathValue("id"); id != "" {
		switch {
		case strings.HasPrefix(r.URL.Path, "/v1/sandboxes/"):
			if sb, err := s.o.Store.GetSandbox(ctx, "", id); err == nil {
				return "sandbox", id, sb.ProjectID
			}
			return "sandbox", id, ""
		case strings.HasPrefix(r.URL.Path, "/v1/snapshots/"):
			if sn, err := s.o.Store.GetSnapshot(ctx, "", id); err == nil {
				return "snapshot", id, sn.ProjectID
			}
			return "snapshot", id, ""
		case strings.HasPrefix(r.URL.Path, "/v1/operations/"):
			if op, err := s.o.Store.GetOperation(ctx, "", id); err == nil {
				return "operation", id, op.ProjectID
			}
			return "operation", id, ""
		case strings.HasPrefix(r.URL.Path, "/v1/keys/"):
			if k, err := s.o.Store.GetAPIKey(ctx, id); err == nil {
				return "key", id, k.ProjectID
			}
			return "key", id, ""
		case strings.HasPrefix(r.URL.Path, "/v1/credentials/"):
			if co, ok := s.o.Credentials.(interface{ CredentialOwner(string) string }); ok {
				return "credential", id, co.CredentialOwner(id)
			}
			return "credential", id, ""
		}
	}
	if op := r.PathValue("op"); op != "" {
		if o, err := s.o.Store.GetOperation(ctx, "", op); err == nil {
			return "operation", op, o.ProjectID
		}
		return "operation", op, ""
	}
	if name := r.PathValue("name"); name != "" && s.o.Templates != nil {
		list, err := s.o.Templates.ListTemplates(ctx)
		if err == nil {
			for _, t := range list {
				if t.Name == name && t.Project != "" && t.Project != p.ProjectID {
					return "template", name, t.Project
				}
			}
		}
		return "template", name, ""
	}
	return "", "", ""
}

func (s *Server) authenticate(r *http.Request) (auth.Principal, error) {
	key := r.Header.Get("X-API-Key")
	if key == "" {
		if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
			key = strings.TrimPrefix(a, "Bearer ")
		}
	}
	if key == "" {
		return auth.Principal{}, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "missing API key (X-API-Key or Authorization: Bearer)")
	}
	p, err := s.o.Keys.Verify(r.Context(), key)
	if err != nil {
		if errors.Is(err, core.ErrUnauthorized) {
			return p, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "invalid API key")
		}
		return p, err
	}
	return p, nil
}

func (s *Server) health(w http.ResponseWriter, r *http.Request, _ auth.Principal) error {
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
	return nil
}

func (s *Server) info(w http.ResponseWriter, r *http.Request, _ auth.Principal) error {
	var in Info
	if s.o.Info != nil {
		in = s.o.Info()
	}
	v := version.Get()
	in.Version, in.Commit = v.Version, v.Commit
	httpx.WriteJSON(w, http.StatusOK, in)
	return nil
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request, _ auth.Principal) error {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openapiDoc)
	return nil
}

// session is the data-connection grant returned with a sandbox.
type session struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
	DataURL   string    `json:"data_url"`
	// Domain is the sandbox domain of forwarded ports: port P of the
	// sandbox is <scheme of data_url>://P-<id>.<domain>/.
	Domain string `json:"domain"`
}

// dataURLOf is the data plane that serves sb.
func (s *Server) dataURLOf(sb core.Sandbox) string {
	if s.o.DataURLFor != nil {
		if u := s.o.DataURLFor(sb); u != "" {
			return u
		}
	}
	return s.o.DataURL
}

func (s *Server) issue(sb core.Sandbox) session {
	tok, exp := s.o.Sessions.Issue(sb.ProjectID, sb.ID, s.o.SessionTTL)
	url := s.dataURLOf(sb)
	return session{Token: tok, ExpiresAt: exp, DataURL: url, Domain: s.portURLs(url).Domain}
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req core.CreateRequest
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := s.checkCredentials(r.Context(), p.ProjectID, req.Network); err != nil {
		return err
	}
	sb, op, err := s.o.Service.Create(r.Context(), p.ProjectID, req, r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	httpx.WriteJSON(w, http.StatusAccepted, map[string]any{"operation": op, "sandbox": sb, "session": s.issue(sb)})
	return nil
}

var metaQueryRE = regexp.MustCompile(`^metadata\.(.{1,64})$`)

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	all, err := allProjects(r, p)
	if err != nil {
		return err
	}
	f := core.SandboxFilter{ProjectID: p.ProjectID, Metadata: map[string]string{}}
	if all {
		f.ProjectID = ""
	}
	for _, st := range q["state"] {
		for _, one := range strings.Split(st, ",") {
			switch v := core.SandboxState(one); v {
			case core.SandboxCreating, core.SandboxRunning, core.SandboxDeleting, core.SandboxDeleted, core.SandboxFailed, core.SandboxLost, core.SandboxPaused, core.SandboxHibernated, core.SandboxRestarting:
				f.States = append(f.States, v)
			default:
				return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "unknown state %.32q", one)
			}
		}
	}
	for k, v := range q {
		if m := metaQueryRE.FindStringSubmatch(k); m != nil {
			if len(f.Metadata) >= core.MaxMetadata {
				return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "too many metadata filters")
			}
			f.Metadata[m[1]] = v[0]
		} else if k != "state" && k != "limit" && k != "page_token" && k != "all_projects" {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "unknown query parameter %.64q", k)
		}
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "limit must be 1..1000")
		}
		f.Limit = n
	} else {
		f.Limit = 100
	}
	if pt := q.Get("page_token"); pt != "" {
		if !core.ValidSandboxID(pt) {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "bad page_token")
		}
		f.After = pt
	}
	f.Limit++ // one extra tells whether a next page exists
	list, err := s.o.Service.List(r.Context(), f)
	if err != nil {
		return err
	}
	next := ""
	if len(list) == f.Limit {
		list = list[:f.Limit-1]
		next = list[len(list)-1].ID
	}
	if list == nil {
		list = []core.Sandbox{}
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"sandboxes": list, "next_page_token": next})
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := s.o.Service.Get(r.Context(), p.ProjectID, r.PathValue("id"))
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	op, err := s.o.Service.Delete(r.Context(), p.ProjectID, r.PathValue("id"))
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	httpx.WriteJSON(w, http.StatusAccepted, map[string]any{"operation": op})
	return nil
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req struct {
		TimeoutSeconds *int64 `json:"timeout_seconds"`
	}
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.TimeoutSeconds == nil {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "timeout_seconds is required")
	}
	sb, err := s.o.Service.SetTimeout(r.Context(), p.ProjectID, r.PathValue("id"), *req.TimeoutSeconds)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) newSession(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := s.o.Service.Get(r.Context(), p.ProjectID, r.PathValue("id"))
	if err != nil {
		return err
	}
	if sb.State.Terminal() || sb.State == core.SandboxDeleting {
		return httpx.Errorf(http.StatusConflict, "conflict", "sandbox is %s", sb.State)
	}
	httpx.WriteJSON(w, http.StatusOK, s.issue(sb))
	return nil
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req core.NetworkPolicy
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := s.checkCredentials(r.Context(), p.ProjectID, &req); err != nil {
		return err
	}
	sb, err := s.o.Service.SetNetwork(r.Context(), p.ProjectID, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) networkLog(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	var after uint64
	limit := 1000
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "after must be a number")
		}
		after = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "limit must be 1..1000")
		}
		limit = n
	}
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		if id, ok := httpx.LastEventID(r); !ok {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "Last-Event-ID must be a number")
		} else if id > after {
			after = id
		}
		return s.followNetworkLog(w, r, p, after)
	}
	log, err := s.o.Service.NetworkLog(r.Context(), p.ProjectID, r.PathValue("id"), after, limit)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, log)
	return nil
}

// networkLogPoll is how often a followed decision log is read; the log is
// an in-memory ring in the gateway, so a read is cheap.
const networkLogPoll = 250 * time.Millisecond

// followNetworkLog streams the decision log as SSE: one "decision" event
// per decision, its seq as the event id (Last-Event-ID resumes), and an
// "end" event when the sandbox is gone.
func (s *Server) followNetworkLog(w http.ResponseWriter, r *http.Request, p auth.Principal, after uint64) error {
	ctx, id := r.Context(), r.PathValue("id")
	// Errors (unknown sandbox, no network) are answered before the stream starts.
	log, err := s.o.Service.NetworkLog(ctx, p.ProjectID, id, after, 1000)
	if err != nil {
		return err
	}
	sse := httpx.StartSSE(w)
	idle := 0
	for {
		for _, d := range log.Decisions {
			data, _ := json.Marshal(d)
			if err := sse.Event(strconv.FormatUint(d.Seq, 10), "decision", data); err != nil {
				return nil
			}
			after = d.Seq
		}
		if len(log.Decisions) == 0 {
			if idle++; idle%60 == 0 { // ~15 s
				_ = sse.Comment("keep-alive")
			}
		} else {
			idle = 0
		}
		if err := sse.Flush(); err != nil {
			return nil
		}
		if len(log.Decisions) < 1000 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(networkLogPoll):
			}
		}
		if log, err = s.o.Service.NetworkLog(ctx, p.ProjectID, id, after, 1000); err != nil {
			if ctx.Err() == nil {
				_ = sse.Event("", "end", []byte(`{"reason":"the sandbox is gone or has no network"}`))
				_ = sse.Flush()
			}
			return nil
		}
	}
}

func parseWait(q url.Values) (time.Duration, error) {
	v := q.Get("wait")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.Atoi(v)
		if nerr != nil {
			return 0, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "wait must be a duration like 30s")
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 || d > 60*time.Second {
		return 0, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "wait must be between 0 and 60s")
	}
	return d, nil
}

func (s *Server) getOperation(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	wait, err := parseWait(r.URL.Query())
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if !validOpID(id) {
		return httpx.Errorf(http.StatusNotFound, "not_found", "operation not found")
	}
	op, err := s.o.Engine.Wait(r.Context(), p.ProjectID, id, wait)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, op)
	return nil
}

func validOpID(id string) bool {
	return strings.HasPrefix(id, "op-") && len(id) == 19
}

// followEvents streams a project's lifecycle events after a position,
// filtered by keep, until stop says so or the client leaves.
func (s *Server) followEvents(ctx context.Context, sse *httpx.SSE, projectID string, after int64, keep func(core.Event) bool, stop func(core.Event) bool) error {
	heartbeat := time.NewTicker(15 * time.Second)
	defer heartbeat.Stop()
	for {
		changed := s.o.Broker.Changed(projectID)
		evs, err := s.o.Broker.Since(ctx, projectID, after, 500)
		if err != nil {
			return err
		}
		for _, e := range evs {
			after = e.Seq
			if !keep(e) {
				continue
			}
			raw, _ := json.Marshal(e)
			if err := sse.Event(strconv.FormatInt(e.Seq, 10), e.Type, raw); err != nil {
				return err
			}
			if stop(e) {
				return sse.Flush()
			}
		}
		if err := sse.Flush(); err != nil {
			return err
		}
		if len(evs) == 500 {
			continue
		}
		select {
		case <-changed:
		case <-heartbeat.C:
			if err := sse.Comment("keep-alive"); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func (s *Server) operationEvents(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	id := r.PathValue("id")
	if !validOpID(id) {
		return httpx.Errorf(http.StatusNotFound, "not_found", "operation not found")
	}
	op, err := s.o.Store.GetOperation(r.Context(), p.ProjectID, id)
	if err != nil {
		return err
	}
	after, ok := httpx.LastEventID(r)
	if !ok {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "Last-Event-ID must be a number")
	}
	// Without a resume position, start from now: read the position first,
	// then the state, so no change can fall between the two.
	if after == 0 {
		latest, err := s.o.Broker.Latest(r.Context(), p.ProjectID)
		if err != nil {
			return err
		}
		if op, err = s.o.Store.GetOperation(r.Context(), p.ProjectID, id); err != nil {
			return err
		}
		after = uint64(latest)
	}
	sse := httpx.StartSSE(w)
	// The current state first, in the same envelope as later events, so a
	// follower never waits for a change that already happened.
	raw, _ := json.Marshal(op)
	first, _ := json.Marshal(core.Event{Seq: int64(after), ProjectID: op.ProjectID, Type: "operation.updated",
		SandboxID: sandboxOf(op), OperationID: op.ID, Data: raw, CreatedAt: op.UpdatedAt})
	sse.Event(strconv.FormatUint(after, 10), "operation.updated", first)
	if op.State.Done() {
		return sse.Flush()
	}
	return s.followEvents(r.Context(), sse, p.ProjectID, int64(after),
		func(e core.Event) bool { return e.OperationID == id },
		func(e core.Event) bool {
			var o core.Operation
			return json.Unmarshal(e.Data, &o) == nil && o.State.Done()
		})
}

func (s *Server) events(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	after, ok := httpx.LastEventID(r)
	if !ok {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "Last-Event-ID must be a number")
	}
	sse := httpx.StartSSE(w)
	return s.followEvents(r.Context(), sse, p.ProjectID, int64(after),
		func(core.Event) bool { return true }, func(core.Event) bool { return false })
}

// listTemplates lists the caller's project's templates and the public
// ones; ?all_projects=true (admin keys only) lists every project's.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	all, err := allProjects(r, p)
	if err != nil {
		return err
	}
	list, err := s.o.Templates.ListTemplates(r.Context())
	if err != nil {
		return err
	}
	out := []core.TemplateInfo{}
	for _, t := range list {
		if all || t.Public || t.Project == p.ProjectID {
			out = append(out, t)
		}
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"templates": out})
	return nil
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	_, t, err := s.lookupTemplate(r.Context(), p, r.PathValue("name"))
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, t)
	return nil
}

// allProjects reads ?all_projects=true, which only admin keys may use.
func allProjects(r *http.Request, p auth.Principal) (bool, error) {
	v := r.URL.Query().Get("all_projects")
	switch v {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		if !p.Admin {
			return false, httpx.Errorf(http.StatusForbidden, "forbidden", "all_projects needs an admin key")
		}
		return true, nil
	}
	return false, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "all_projects must be true or false")
}

// lookupTemplate resolves the template a project means by name: its own,
// else the public one. It returns the template's ref (see core.TemplateRef).
func (s *Server) lookupTemplate(ctx context.Context, p auth.Principal, name string) (string, core.TemplateInfo, error) {
	if !taggedNameRE.MatchString(name) {
		return "", core.TemplateInfo{}, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "template %s (got %.64q)", buildNameRuleText, name)
	}
	own := core.TemplateRef(p.ProjectID, name)
	t, err := s.o.Templates.GetTemplate(ctx, own)
	if err == nil {
		return own, t, nil
	}
	if !errors.Is(err, core.ErrNotFound) {
		return "", t, err
	}
	if t, err = s.o.Templates.GetTemplate(ctx, name); err != nil {
		return "", t, err
	}
	return name, t, nil
}

// buildScope is the ref a build of name writes: the caller's project, or
// with public (admin keys only) the public scope.
func buildScope(p auth.Principal, name string, public bool) (string, error) {
	if public {
		if !p.Admin {
			return "", httpx.Errorf(http.StatusForbidden, "forbidden", "publishing a public template needs an admin key")
		}
		return name, nil
	}
	return core.TemplateRef(p.ProjectID, name), nil
}

// queryBuildName reads ?name= (matching re) and ?public= of the multipart
// and upload builds, and returns the name and the ref the build writes.
func queryBuildName(r *http.Request, p auth.Principal, re *regexp.Regexp, rule string) (name, ref string, err error) {
	q := r.URL.Query()
	name = q.Get("name")
	if !re.MatchString(name) {
		return "", "", httpx.Errorf(http.StatusBadRequest, "invalid_argument", "%s", rule)
	}
	public := false
	switch q.Get("public") {
	case "", "false", "0":
	case "true", "1":
		public = true
	default:
		return "", "", httpx.Errorf(http.StatusBadRequest, "invalid_argument", "public must be true or false")
	}
	ref, err = buildScope(p, name, public)
	return name, ref, err
}

var (
	pkgNameRE      = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{0,99}$`)
	templateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
)

func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req core.TemplateBuildRequest
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	switch req.Source {
	case "busybox", "debian":
		if req.Image != "" {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", `image only applies to source "image"`)
		}
	case "image":
		if req.Image == "" || len(req.Image) > 512 || strings.ContainsAny(req.Image, " \t\r\n\x00") {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "image must be a registry reference such as docker.io/library/alpine:3.20")
		}
		if len(req.Packages) > 0 {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", `packages only apply to source "debian"`)
		}
	default:
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", `source must be "busybox", "debian" or "image" (upload a docker-archive or OCI-layout tarball to POST /v1/templates/upload; build from a directory with the CLI on the server)`)
	}
	if len(req.Packages) > 200 {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "at most 200 packages")
	}
	for _, pk := range req.Packages {
		if !pkgNameRE.MatchString(pk) {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "bad package name %.64q", pk)
		}
	}
	if !templateNameRE.MatchString(req.Name) {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "name must match ^[a-z0-9][a-z0-9._-]{0,63}$")
	}
	ref, err := buildScope(p, req.Name, req.Public)
	if err != nil {
		return err
	}
	op := s.o.Engine.NewOperation(p.ProjectID, "template.build", req.Name)
	op.Fingerprint = core.Fingerprint(r.Method, r.URL.Path, req)
	op, err = s.o.Engine.Submit(r.Context(), op, r.Header.Get("Idempotency-Key"), func(ctx context.Context, progress core.Progress) (any, error) {
		breq := req
		breq.Name = ref
		t, err := s.o.Templates.BuildTemplate(ctx, breq, progress)
		if err == nil {
			s.audit(audit.WithRequestID(ctx, audit.RequestID(r.Context())), p, "template.build", "template", ref, "succeeded")
		}
		return t, err
	})
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	httpx.WriteJSON(w, http.StatusAccepted, map[string]any{"operation": op})
	return nil
}

// maxTemplateUpload bounds an uploaded image archive; the template builder
// bounds what it may unpack separately.
const maxTemplateUpload = 8 << 30

// uploadTemplate builds a template from a docker-archive or OCI-layout
// tarball sent as the request body (?name=NAME). The body is spooled to a
// private temp file that lives as long as the build.
func (s *Server) uploadTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	name, ref, err := queryBuildName(r, p, templateNameRE, "name must match ^[a-z0-9][a-z0-9._-]{0,63}$")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp("", "space-template-upload-")
	if err != nil {
		return fmt.Errorf("template upload: %w", err)
	}
	path := f.Name()
	sum := sha256.New() // the archive's, for the idempotency fingerprint
	_, err = io.Copy(io.MultiWriter(f, sum), http.MaxBytesReader(w, r.Body, maxTemplateUpload))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return httpx.Errorf(http.StatusRequestEntityTooLarge, "body_too_large", "archive larger than %d bytes", int64(maxTemplateUpload))
		}
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "reading the archive: %v", err)
	}
	req := core.TemplateBuildRequest{Name: ref, Source: "archive", Path: path}
	op := s.o.Engine.NewOperation(p.ProjectID, "template.build", name)
	op.Fingerprint = core.Fingerprint(r.Method, r.URL.Path, r.URL.Query(), sum.Sum(nil))
	got, err := s.o.Engine.Submit(r.Context(), op, r.Header.Get("Idempotency-Key"), func(ctx context.Context, progress core.Progress) (any, error) {
		defer os.Remove(path)
		t, err := s.o.Templates.BuildTemplate(ctx, req, progress)
		if err == nil {
			s.audit(audit.WithRequestID(ctx, audit.RequestID(r.Context())), p, "template.build", "template", ref, "succeeded")
		}
		return t, err
	})
	if err != nil || got.ID != op.ID {
		os.Remove(path) // not run: an error, or a replay of an earlier upload
	}
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+got.ID)
	httpx.WriteJSON(w, http.StatusAccepted, map[string]any{"operation": got})
	return nil
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	all, err := allProjects(r, p)
	if err != nil {
		return err
	}
	project := p.ProjectID
	if all {
		project = ""
	}
	keys, err := s.o.Store.ListAPIKeys(r.Context(), project)
	if err != nil {
		return err
	}
	if keys == nil {
		keys = []core.APIKey{}
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"keys": keys})
	return nil
}

// createKey makes a key in the caller's project. Only an admin key may
// name another project or make an admin key.
func (s *Server) createKey(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req struct {
		Name    string `json:"name"`
		Project string `json:"project,omitempty"`
		Admin   bool   `json:"admin,omitempty"`
	}
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	project := p.ProjectID
	if req.Project != "" && req.Project != p.ProjectID || req.Admin {
		if !p.Admin {
			s.audit(r.Context(), p, "key.create", "key", req.Project, "denied")
			return httpx.Errorf(http.StatusForbidden, "forbidden", "only an admin key may create keys for another project or admin keys")
		}
		if req.Project != "" {
			project = req.Project
		}
	}
	k, plain, err := s.o.Keys.CreateKey(r.Context(), project, req.Name, req.Admin)
	if err != nil {
		return err
	}
	s.o.Audit.Record(r.Context(), audit.Event{Action: "key.create", Outcome: "succeeded", ProjectID: p.ProjectID, KeyID: p.KeyID,
		Admin: p.Admin, Kind: "key", Target: k.ID, Owner: k.ProjectID, Reason: adminText(k.Admin)})
	httpx.WriteJSON(w, http.StatusCreated, map[string]any{"key": k, "secret": plain})
	return nil
}

func adminText(admin bool) string {
	if admin {
		return "admin key"
	}
	return ""
}

// revokeKey revokes a key of the caller's project (admin keys: any key).
func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	project := p.ProjectID
	if p.Admin {
		project = ""
	}
	id := r.PathValue("id")
	if err := s.o.Store.RevokeAPIKey(r.Context(), project, id, s.o.Now().UTC()); err != nil {
		return err
	}
	s.audit(r.Context(), p, "key.revoke", "key", id, "succeeded")
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func sandboxOf(op core.Operation) string {
	if strings.HasPrefix(op.Kind, "sandbox.") {
		return op.Target
	}
	return ""
}

// checkCredentials makes sure every credential a policy attaches exists in
// the caller's project, before anything is stored.
func (s *Server) checkCredentials(ctx context.Context, projectID string, n *core.NetworkPolicy) error {
	if n == nil || len(n.Credentials) == 0 {
		return nil
	}
	if s.o.Credentials == nil {
		return errNoCredentials()
	}
	for _, id := range n.Credentials {
		if _, err := s.o.Credentials.GetCredential(ctx, projectID, id); err != nil {
			if errors.Is(err, core.ErrNotFound) {
				return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "network: unknown credential %.40q", id)
			}
			return err
		}
	}
	return nil
}

// errNoCredentials answers a request for credentials on a server without
// the egress gateway, the only place they can be used.
func errNoCredentials() error {
	return httpx.Errorf(http.StatusBadRequest, "egress_disabled",
		"credentials need the egress gateway, and this server runs without it (start it with space server --egress; servers with --remote-nodes keep no credentials yet)")
}

func (s *Server) credentials() (Credentials, error) {
	if s.o.Credentials == nil {
		return nil, errNoCredentials()
	}
	return s.o.Credentials, nil
}

func (s *Server) createCredential(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	cs, err := s.credentials()
	if err != nil {
		return err
	}
	var req core.CredentialRequest
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	c, err := cs.CreateCredential(r.Context(), p.ProjectID, req)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusCreated, c)
	return nil
}

func (s *Server) listCredentials(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	cs, err := s.credentials()
	if err != nil {
		return err
	}
	list, err := cs.ListCredentials(r.Context(), p.ProjectID)
	if err != nil {
		return err
	}
	if list == nil {
		list = []core.Credential{}
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"credentials": list})
	return nil
}

func (s *Server) deleteCredential(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	cs, err := s.credentials()
	if err != nil {
		return err
	}
	if err := cs.DeleteCredential(r.Context(), p.ProjectID, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
