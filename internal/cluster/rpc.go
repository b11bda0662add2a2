package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
)

// Node RPC paths (all POST, JSON in and out).
const (
	PathStart       = "/node/v1/start"
	PathStop        = "/node/v1/stop"
	PathAdopt       = "/node/v1/adopt"
	PathPause       = "/node/v1/pause"
	PathResume      = "/node/v1/resume"
	PathHasTemplate = "/node/v1/has-template"
)

// maxRPCBody bounds request and answer bodies (a sandbox record with its
// env and metadata is well under this).
const maxRPCBody = 1 << 20

// rpcWorkLimit bounds one call's work on the node.
const rpcWorkLimit = 10 * time.Minute

// authScheme prefixes the token in the Authorization header.
const authScheme = "SpaceNode "

// Backend is what a node offers over RPC.
type Backend interface {
	StartSandbox(ctx context.Context, sb core.Sandbox, progress core.Progress) (core.Placement, error)
	StopSandbox(ctx context.Context, id string) error
	AdoptSandbox(ctx context.Context, sb core.Sandbox) error
	HasTemplate(ctx context.Context, name string) error
	PauseSandbox(ctx context.Context, id string) error
	ResumeSandbox(ctx context.Context, id string) error
}

type sandboxReq struct {
	Sandbox core.Sandbox `json:"sandbox"`
	// Credentials: the secrets the sandbox's policy attaches (start only).
	Credentials []Credential `json:"credentials,omitempty"`
}

type idReq struct {
	ID string `json:"id"`
}

type nameReq struct {
	Name string `json:"name"`
}

type placementResp struct {
	Placement core.Placement `json:"placement"`
}

type okResp struct {
	OK bool `json:"ok"`
}

// Handler serves the node RPC API: every request must carry a token for
// this node (Verifier); bodies are bounded and decoded strictly.
type Handler struct {
	b    Backend
	v    *Verifier
	logf func(string, ...any)
	mux  *http.ServeMux
}

// NewHandler returns the node RPC handler.
func NewHandler(b Backend, v *Verifier, logf func(string, ...any)) http.Handler {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	h := &Handler{b: b, v: v, logf: logf, mux: http.NewServeMux()}
	h.mux.HandleFunc("/", httpx.NotFound)
	h.route(PathStart, func(ctx context.Context, body []byte) (any, error) {
		var r sandboxReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.Sandbox.ID) {
			return nil, fmt.Errorf("sandbox id %.40q: %w", r.Sandbox.ID, core.ErrInvalid)
		}
		pl, err := h.startSandbox(ctx, r)
		return placementResp{Placement: pl}, err
	})
	h.route(PathStop, h.byID(h.stopRoute))
	h.route(PathPause, h.byID(h.b.PauseSandbox))
	h.route(PathResume, h.byID(h.b.ResumeSandbox))
	h.route(PathAdopt, func(ctx context.Context, body []byte) (any, error) {
		var r sandboxReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.Sandbox.ID) {
			return nil, fmt.Errorf("sandbox id %.40q: %w", r.Sandbox.ID, core.ErrInvalid)
		}
		return okResp{true}, h.b.AdoptSandbox(ctx, r.Sandbox)
	})
	h.route(PathHasTemplate, func(ctx context.Context, body []byte) (any, error) {
		var r nameReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if r.Name == "" || len(r.Name) > 200 { // a ref: "~project~name:tag"
			return nil, fmt.Errorf("template name: %w", core.ErrInvalid)
		}
		return okResp{true}, h.b.HasTemplate(ctx, r.Name)
	})
	h.snapshotRoutes()
	h.networkRoutes()
	h.credentialRoutes()
	h.idleRoutes()
	h.metricsRoutes()
	return httpx.Recover(h.mux, logf)
}

func decode(body []byte, v any) error {
	if err := httpx.DecodeStrict(body, v); err != nil {
		return fmt.Errorf("%w: %w", core.ErrInvalid, err)
	}
	return nil
}

func (h *Handler) byID(fn func(context.Context, string) error) func(context.Context, []byte) (any, error) {
	return func(ctx context.Context, body []byte) (any, error) {
		var r idReq
		if err := decode(body, &r); err != nil {
			return nil, err
		}
		if !core.ValidSandboxID(r.ID) {
			return nil, fmt.Errorf("sandbox id %.40q: %w", r.ID, core.ErrInvalid)
		}
		return okResp{true}, fn(ctx, r.ID)
	}
}

func (h *Handler) route(path string, fn func(ctx context.Context, body []byte) (any, error)) {
	h.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		tok, ok := postToken(w, r)
		if !ok {
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRPCBody))
		if err != nil {
			httpx.WriteError(w, err)
			return
		}
		if err := h.v.Verify(tok, r.Method, r.URL.Path, body); err != nil {
			h.logf("node rpc %s from %s refused: %v", r.URL.Path, r.RemoteAddr, err)
			httpx.WriteError(w, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "node token refused"))
			return
		}
		// A caller that dies mid-call (a replica killed) must not abort
		// the node half-way through a start or stop: the work finishes, and
		// the surviving replicas settle the sandbox from its record. The
		// caller's request id (X-Request-Id: the API request that made the
		// operation) goes with the work into the node's log records.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), rpcWorkLimit)
		if id := r.Header.Get("X-Request-Id"); id != "" && audit.RequestID(ctx) == "" {
			ctx = audit.WithRequestID(ctx, audit.RequestIDFrom(id))
		}
		defer cancel()
		meta := &rpcMeta{}
		out, err := fn(context.WithValue(ctx, rpcMetaKey{}, meta), body)
		h.writeGenerations(w, meta)
		if err != nil {
			writeErr(w, err)
			return
		}
		httpx.WriteJSON(w, http.StatusOK, out)
	})
}

// postToken checks that r is a POST with a node token and returns the
// token; otherwise it answers and reports false.
func postToken(w http.ResponseWriter, r *http.Request) (string, bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		httpx.WriteError(w, httpx.Errorf(http.StatusMethodNotAllowed, "method_not_allowed", "use POST"))
		return "", false
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), authScheme)
	if !ok {
		httpx.WriteError(w, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "a node token is required"))
	}
	return tok, ok
}

// writeErr writes the error envelope with the full message: the caller is
// a server of the same cluster, which reports it in its operation.
func writeErr(w http.ResponseWriter, err error) {
	code := core.ErrorCode(err)
	status := http.StatusInternalServerError
	switch code {
	case "not_found":
		status = http.StatusNotFound
	case "conflict":
		status = http.StatusConflict
	case "invalid_argument":
		status = http.StatusBadRequest
	case "resource_exhausted":
		status = http.StatusTooManyRequests
	case "unavailable":
		status = http.StatusServiceUnavailable
	case "deadline_exceeded":
		status = http.StatusGatewayTimeout
	}
	httpx.WriteJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": err.Error()}})
}

// Client calls one node.
type Client struct {
	Name string // the node's name: the tokens' audience
	URL  string // its RPC base URL
	s    *Signer
	http *http.Client
}

// NewClient returns a client for node name at url.
func NewClient(name, url string, s *Signer, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Minute}
	}
	return &Client{Name: name, URL: strings.TrimRight(url, "/"), s: s, http: hc}
}

// call posts in to path and decodes the answer into out. A node's error
// envelope becomes the matching core sentinel; a node that cannot be
// reached is ErrUnavailable.
func (c *Client) call(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("node %s: encode: %w", c.Name, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("node %s: %w", c.Name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", authScheme+c.s.Sign(c.Name, http.MethodPost, path, body))
	if id := audit.RequestID(ctx); id != "" {
		req.Header.Set("X-Request-Id", id) // the node logs its work under the request that made it
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("node %s: %w", c.Name, ctx.Err())
		}
		return unreachableError{fmt.Sprintf("node %s unreachable: %v: %v", c.Name, err, core.ErrUnavailable)}
	}
	defer resp.Body.Close()
	readGenerations(ctx, resp.Header)
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxRPCBody+1))
	if err != nil {
		return fmt.Errorf("node %s: read answer: %v: %w", c.Name, err, core.ErrUnavailable)
	}
	if len(raw) > maxRPCBody {
		return fmt.Errorf("node %s: answer larger than %d bytes: %w", c.Name, maxRPCBody, core.ErrUnavailable)
	}
	if resp.StatusCode != http.StatusOK {
		var env struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(raw, &env) != nil || env.Error.Code == "" {
			return fmt.Errorf("node %s: HTTP %d: %w", c.Name, resp.StatusCode, core.ErrUnavailable)
		}
		return fmt.Errorf("node %s: %.500s: %w", c.Name, env.Error.Message, sentinel(env.Error.Code))
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("node %s: decode answer: %v: %w", c.Name, err, core.ErrUnavailable)
	}
	return nil
}

// sentinel maps a wire error code back to core's errors.
func sentinel(code string) error {
	switch code {
	case "not_found":
		return core.ErrNotFound
	case "conflict":
		return core.ErrConflict
	case "invalid_argument", "body_too_large":
		return core.ErrInvalid
	case "resource_exhausted":
		return core.ErrExhausted
	case "unavailable":
		return core.ErrUnavailable
	case "deadline_exceeded":
		return context.DeadlineExceeded
	case "unauthorized":
		// The server's own misconfiguration (secret, clock): not the client's fault.
		return fmt.Errorf("node refused this server's token (cluster secret or clock skew): %w", core.ErrUnavailable)
	default:
		return errors.New("node error " + code)
	}
}

// StartSandbox starts sb on the node, with the secrets of the credentials
// its policy attaches (nil: none).
func (c *Client) StartSandbox(ctx context.Context, sb core.Sandbox, creds ...Credential) (core.Placement, error) {
	var out placementResp
	err := c.call(ctx, PathStart, sandboxReq{Sandbox: sb, Credentials: creds}, &out)
	return out.Placement, err
}

// StopSandbox stops a sandbox on the node.
func (c *Client) StopSandbox(ctx context.Context, id string) error {
	return c.call(ctx, PathStop, idReq{ID: id}, &okResp{})
}

// AdoptSandbox asks the node whether it still runs sb.
func (c *Client) AdoptSandbox(ctx context.Context, sb core.Sandbox) error {
	return c.call(ctx, PathAdopt, sandboxReq{Sandbox: sb}, &okResp{})
}

// PauseSandbox freezes a sandbox.
func (c *Client) PauseSandbox(ctx context.Context, id string) error {
	return c.call(ctx, PathPause, idReq{ID: id}, &okResp{})
}

// ResumeSandbox thaws a sandbox.
func (c *Client) ResumeSandbox(ctx context.Context, id string) error {
	return c.call(ctx, PathResume, idReq{ID: id}, &okResp{})
}

// HasTemplate asks whether the node has a template.
func (c *Client) HasTemplate(ctx context.Context, name string) error {
	return c.call(ctx, PathHasTemplate, nameReq{Name: name}, &okResp{})
}
