package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/e2b/gen/filesystem/filesystempbconnect"
	"github.com/space-sandbox/space/internal/e2b/gen/process/processpbconnect"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/node"
)

// Limits on envd input.
const (
	maxRPCMessage   = 4 << 20
	maxPathBytes    = 4096
	maxUserBytes    = 64
	maxUploadBytes  = 4 << 30
	maxWatchers     = 16 // per sandbox
	watcherIdleTTL  = 10 * time.Minute
	healthTimeout   = 3 * time.Second
	maxKeepalive    = 600 * time.Second
	defaultKeepWait = 90 * time.Second
)

// EnvdOptions configure the envd front door.
type EnvdOptions struct {
	Node     *node.Node
	Sessions *auth.Sessions
	Logf     func(string, ...any)
	// Wake, if set, resumes a paused or hibernated sandbox created with
	// autoResume (core.Service.AutoResume); it reports whether it did.
	Wake func(ctx context.Context, projectID, id string) (bool, error)
	// SessionTTL is the E2B API's (APIOptions.SessionTTL): signed file URLs
	// are checked against the stable tokens it issues. Default 24h.
	SessionTTL time.Duration
}

// Envd serves E2B's envd protocol for every sandbox on one origin, routed by
// the E2b-Sandbox-Id header (or a "<port>-<id>.<domain>" Host).
type Envd struct {
	o   EnvdOptions
	rpc *http.ServeMux

	mu       sync.Mutex
	watchers map[string]*watcher // watcher id -> poller

	// scan admits one search at a time for the sandbox of a signed URL
	// that names none (serveSigned): the request needs no credential to
	// cause it.
	scan chan struct{}
	// tokMu guards toks: each sandbox's valid stable tokens, computed
	// (two HMACs each) at most once a second; the set changes only at
	// whole seconds (window starts and expiries).
	tokMu sync.Mutex
	toks  map[string]stableSet
}

// stableSet is a sandbox's valid stable tokens as of one second.
type stableSet struct {
	sec  int64
	toks []string
}

// NewEnvd returns the envd handler.
func NewEnvd(o EnvdOptions) *Envd {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.SessionTTL <= 0 {
		o.SessionTTL = 24 * time.Hour
	}
	e := &Envd{o: o, rpc: http.NewServeMux(), watchers: map[string]*watcher{}, scan: make(chan struct{}, 1), toks: map[string]stableSet{}}
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxRPCMessage), connect.WithSendMaxBytes(maxRPCMessage)}
	e.rpc.Handle(processpbconnect.NewProcessHandler(&processService{e: e}, opts...))
	e.rpc.Handle(filesystempbconnect.NewFilesystemHandler(&filesystemService{e: e}, opts...))
	return e
}

// IsEnvdRequest reports whether a data-listener request is for envd.
func IsEnvdRequest(r *http.Request) bool {
	if r.Header.Get("E2b-Sandbox-Id") != "" {
		return true
	}
	p := r.URL.Path
	return p == "/health" || p == "/files" || strings.HasPrefix(p, "/process.Process/") || strings.HasPrefix(p, "/filesystem.Filesystem/")
}

// Wrap sends envd requests to e and everything else to next.
func (e *Envd) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if IsEnvdRequest(r) {
			e.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// call is what an authorized envd request carries in its context.
type call struct {
	sb   *node.Sandbox
	user string // from Authorization: Basic <user>: ; "" = the sandbox default
	// startTimeoutMs is Connect-Timeout-Ms of Process.Start: envd treats it
	// as the process's lifetime, not as the stream's deadline.
	startTimeoutMs int64
	keepalive      time.Duration
	// signed: authorized by a signed /files URL, whose username is user.
	signed bool
}

type callKey struct{}

func callOf(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

func isRPC(p string) bool {
	return strings.HasPrefix(p, "/process.Process/") || strings.HasPrefix(p, "/filesystem.Filesystem/")
}

// envdError writes an error in the shape the caller's client parses: Connect's
// {"code":"<name>","message"} for RPCs, E2B's {"code":<status>,"message"}
// for the plain HTTP routes.
func envdError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if isRPC(r.URL.Path) {
		code := map[int]string{400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
			404: "not_found", 409: "already_exists", 413: "resource_exhausted", 429: "resource_exhausted",
			502: "unavailable", 503: "unavailable", 507: "resource_exhausted"}[status]
		if code == "" {
			code = "internal"
		}
		httpx.WriteJSON(w, status, map[string]string{"code": code, "message": msg})
		return
	}
	httpx.WriteJSON(w, status, map[string]any{"code": status, "message": msg})
}

// sandboxIDOf finds the sandbox a request is for.
func sandboxIDOf(r *http.Request) string {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		return id
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if label, _, ok := strings.Cut(host, "."); ok {
		if port, id, ok := strings.Cut(label, "-"); ok {
			if _, err := strconv.Atoi(port); err == nil {
				return id
			}
		}
	}
	return ""
}

// ServeHTTP authenticates the request, finds its sandbox and dispatches.
func (e *Envd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			e.o.Logf("e2b envd: panic in %s %s: %v", r.Method, r.URL.Path, v)
			envdError(w, r, http.StatusInternalServerError, "internal error")
		}
	}()
	tok := r.Header.Get("X-Access-Token")
	if tok == "" && r.URL.Path == "/files" && r.URL.Query().Has("signature") {
		e.serveSigned(w, r)
		return
	}
	if tok == "" {
		envdError(w, r, http.StatusUnauthorized, "missing X-Access-Token")
		return
	}
	sess, err := e.o.Sessions.Verify(tok)
	if err != nil {
		msg := "invalid access token"
		if errors.Is(err, auth.ErrExpired) {
			msg = "access token expired; connect to the sandbox again for a new one"
		}
		envdError(w, r, http.StatusUnauthorized, msg)
		return
	}
	id := sandboxIDOf(r)
	if id == "" {
		id = sess.SandboxID
	}
	if len(id) > 128 || id != sess.SandboxID {
		envdError(w, r, http.StatusUnauthorized, "access token is not valid for this sandbox")
		return
	}
	// Like E2B's edge: a sandbox that is not running here answers 502, which
	// the SDK reads as "not running" (isRunning() == false).
	sb, err := e.o.Node.Sandbox(id)
	if err != nil && e.o.Wake != nil {
		// E2B's edge resumes a paused sandbox with autoResume on traffic.
		if woke, werr := e.o.Wake(r.Context(), sess.ProjectID, id); werr != nil {
			e.o.Logf("e2b envd: sandbox %s: auto-resume: %v", id, werr)
		} else if woke {
			sb, err = e.o.Node.Sandbox(id)
		}
	}
	if err != nil {
		envdError(w, r, http.StatusBadGateway, "sandbox "+id+" is not running")
		return
	}
	c := &call{sb: sb, keepalive: defaultKeepWait}
	if u, ok := basicUser(r); ok {
		c.user = u
	} else if r.Header.Get("Authorization") != "" {
		envdError(w, r, http.StatusBadRequest, "Authorization must be Basic base64(<user>:)")
		return
	}
	if v := r.Header.Get("Keepalive-Ping-Interval"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			c.keepalive = min(time.Duration(n)*time.Second, maxKeepalive)
		}
	}
	if r.URL.Path == "/process.Process/Start" {
		if v := r.Header.Get("Connect-Timeout-Ms"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || len(v) > 10 {
				envdError(w, r, http.StatusBadRequest, "bad Connect-Timeout-Ms")
				return
			}
			c.startTimeoutMs = n
			r.Header.Del("Connect-Timeout-Ms")
		}
	}
	r = r.WithContext(context.WithValue(r.Context(), callKey{}, c))
	switch {
	case r.URL.Path == "/health":
		e.health(w, r, c)
	case r.URL.Path == "/files" && r.Method == http.MethodGet:
		e.download(w, r, c)
	case r.URL.Path == "/files" && r.Method == http.MethodPost:
		e.upload(w, r, c)
	case isRPC(r.URL.Path):
		e.rpc.ServeHTTP(w, r)
	default:
		envdError(w, r, http.StatusNotFound, "envd route "+r.Method+" "+r.URL.Path+" is not supported")
	}
}

// basicUser parses "Authorization: Basic base64(<user>:)".
func basicUser(r *http.Request) (string, bool) {
	v := r.Header.Get("Authorization")
	if !strings.HasPrefix(v, "Basic ") || len(v) > 512 {
		return "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(v, "Basic "))
	if err != nil {
		return "", false
	}
	u, _, _ := strings.Cut(string(raw), ":")
	if u == "" || len(u) > maxUserBytes || strings.ContainsAny(u, "/\x00") {
		return "", false
	}
	return u, true
}

func (e *Envd) health(w http.ResponseWriter, r *http.Request, c *call) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	if err := c.sb.Agent.Health(ctx); err != nil {
		envdError(w, r, http.StatusBadGateway, "sandbox agent does not answer")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// homeOf is where relative paths of a user resolve, as in envd.
func homeOf(user string) string {
	switch user {
	case "", "user":
		return "/home/user"
	case "root":
		return "/root"
	}
	return "/home/" + user
}

// resolvePath validates a client path and makes it absolute: relative paths
// resolve against the user's home; "/a/../../x" can only mean "/x".
func resolvePath(p, user string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("path is required: %w", core.ErrInvalid)
	}
	if len(p) > maxPathBytes || strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path longer than %d bytes or containing NUL: %w", maxPathBytes, core.ErrInvalid)
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = homeOf(user) + p[1:]
	}
	if !strings.HasPrefix(p, "/") {
		p = homeOf(user) + "/" + p
	}
	return path.Clean(p), nil
}
