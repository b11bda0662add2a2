// Package e2b makes SPACE speak E2B's protocol, so the unmodified e2b SDKs
// work against it: the control REST API (create, list, get, kill, timeout,
// connect, ...) mapped onto core.Service, and envd (Connect RPC process and
// filesystem services, /files, /health) mapped onto node.Sandbox and its
// agent. Nothing here is a second implementation of the lifecycle: every
// call goes through the same service, operations and credentials as SPACE's
// own API. See docs/e2b-compat.md for what is supported.
package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress/policy"
	"github.com/space-sandbox/space/internal/httpx"
)

// EnvdVersion is the envd version SPACE reports. The SDK switches features
// on by it; 0.6.4 is the highest whose wire features SPACE serves (octet
// stream and gzip uploads, closeStdin, watchDir options).
const EnvdVersion = "0.6.4"

// Bounds on client input.
const (
	maxBody       = 1 << 20
	maxListLimit  = 100
	defaultTTL    = 300 // seconds, E2B's default sandbox timeout
	createWaitMax = 5 * time.Minute
	killWait      = 30 * time.Second
)

// APIOptions configure the E2B control API.
type APIOptions struct {
	Service    *core.Service
	Engine     *core.Engine
	Keys       *auth.Keys
	Sessions   *auth.Sessions
	SessionTTL time.Duration
	// Aliases maps E2B template names to SPACE templates. Names not in the
	// table are used as SPACE template names as they are.
	Aliases map[string]string
	// CreateWait bounds how long create waits for the sandbox to run.
	CreateWait time.Duration
	Logf       func(string, ...any)
	Now        func() time.Time
	// Audit receives refused cross-project access (nil: discarded).
	Audit *audit.Log
	// InternalRange reports whether every address of a range is internal
	// to the egress gateway (never dialled in any mode): an E2B denyOut of
	// such ranges is what SPACE's open mode does anyway. nil: none is.
	InternalRange func(netip.Prefix) bool
	// PortDomain returns the sandbox domain of a sandbox's forwarded ports
	// (the answers' "domain": the SDK's getHost(port) is
	// "<port>-<id>.<domain>"); nil: no domain is reported.
	PortDomain func(core.Sandbox) string
	// OpenByDefault gives a sandbox whose create asks for no network
	// E2B's default, the open internet (SPACE's open mode), instead of
	// SPACE's, blocked: the operator's choice (space server
	// --e2b-network), which needs the egress gateway.
	OpenByDefault bool
}

// DefaultAliases is the alias table used when APIOptions.Aliases is nil.
func DefaultAliases() map[string]string {
	return map[string]string{"base": "base"}
}

// API is the E2B control REST API.
type API struct {
	o   APIOptions
	mux *http.ServeMux
}

type apiHandler func(a *API, w http.ResponseWriter, r *http.Request, p auth.Principal) error

// restRoutes is the E2B control API's route table.
var restRoutes = []struct {
	pattern string
	h       apiHandler
}{
	{"POST /sandboxes", (*API).create},
	{"POST /v2/sandboxes", (*API).create},
	{"GET /sandboxes", (*API).listV1},
	{"GET /v2/sandboxes", (*API).listV2},
	{"GET /sandboxes/{id}", (*API).get},
	{"DELETE /sandboxes/{id}", (*API).kill},
	{"POST /sandboxes/{id}/timeout", (*API).setTimeout},
	{"POST /sandboxes/{id}/refreshes", (*API).refresh},
	{"POST /sandboxes/{id}/connect", (*API).connect},
	{"POST /v2/sandboxes/{id}/connect", (*API).connect},
	{"POST /sandboxes/{id}/pause", (*API).pause},
	{"POST /sandboxes/{id}/resume", (*API).resume},
	{"GET /sandboxes/{id}/metrics", (*API).metrics},
	{"PUT /sandboxes/{id}/network", (*API).updateNetwork},
	{"POST /sandboxes/{id}/snapshots", (*API).createSnapshot},
	{"GET /snapshots", (*API).listSnapshots},
	{"DELETE /templates/{id}", (*API).deleteSnapshot},
	{"POST /sandboxes/{id}/fork", (*API).fork},
}

// Routes returns "METHOD pattern" for every E2B control route (for tests).
func Routes() []string {
	out := make([]string, len(restRoutes))
	for i, rt := range restRoutes {
		out[i] = rt.pattern
	}
	return out
}

// NewAPI returns the E2B control API handler.
func NewAPI(o APIOptions) *API {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Aliases == nil {
		o.Aliases = DefaultAliases()
	}
	if o.CreateWait <= 0 || o.CreateWait > createWaitMax {
		o.CreateWait = 2 * time.Minute
	}
	if o.SessionTTL <= 0 {
		o.SessionTTL = 24 * time.Hour
	}
	a := &API{o: o, mux: http.NewServeMux()}
	for _, rt := range restRoutes {
		h, pattern := rt.h, rt.pattern
		a.mux.HandleFunc(rt.pattern, func(w http.ResponseWriter, r *http.Request) {
			p, err := a.authenticate(r)
			if err == nil {
				if err = h(a, w, r, p); err != nil {
					a.auditRefusal(r, pattern, p, err)
				}
			}
			if err != nil {
				writeError(w, err)
			}
		})
	}
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// Known E2B features SPACE does not have (fork, snapshots, logs,
		// templates) answer 501 rather than a 404 the SDK
		// would read as "sandbox not found".
		writeError(w, httpx.Errorf(http.StatusNotImplemented, "not_implemented",
			"%s %s is not supported by SPACE's E2B compatibility layer (see docs/e2b-compat.md)", r.Method, r.URL.Path))
	})
	return a
}

// auditRefusal records a 404 for a sandbox of another project: a refused
// cross-project access.
func (a *API) auditRefusal(r *http.Request, pattern string, p auth.Principal, err error) {
	id := r.PathValue("id")
	if status, _, _ := httpx.StatusOf(err); status != http.StatusNotFound || id == "" || a.o.Audit == nil {
		return
	}
	sb, gerr := a.o.Service.Get(r.Context(), "", id)
	if gerr != nil || sb.ProjectID == p.ProjectID {
		return
	}
	a.o.Audit.Record(r.Context(), audit.Event{Action: "e2b " + pattern, Outcome: "denied", ProjectID: p.ProjectID,
		KeyID: p.KeyID, Admin: p.Admin, Kind: "sandbox", Target: id, Owner: sb.ProjectID, Reason: "object of another project"})
}

// IsAPIPath reports whether a control-listener path belongs to the E2B API.
func IsAPIPath(p string) bool {
	for _, pre := range []string{"/sandboxes", "/v2/sandboxes", "/snapshots", "/templates", "/v2/templates", "/v3/templates"} {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

// Wrap sends E2B paths to the E2B API and everything else to next.
func (a *API) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if IsAPIPath(r.URL.Path) {
			a.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			a.o.Logf("e2b: panic in %s %s: %v", r.Method, r.URL.Path, v)
			writeError(w, httpx.Errorf(http.StatusInternalServerError, "internal", "internal error"))
		}
	}()
	id := audit.RequestIDFrom(r.Header.Get("X-Request-Id"))
	w.Header().Set("X-Request-Id", id)
	a.mux.ServeHTTP(w, r.WithContext(audit.WithRequestID(r.Context(), id)))
}

// writeError writes E2B's error shape: {"code": <status>, "message"}. The SDK
// reads the JSON code, so it must equal the HTTP status.
func writeError(w http.ResponseWriter, err error) {
	status, _, msg := httpx.StatusOf(err)
	if status == 499 {
		return
	}
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	httpx.WriteJSON(w, status, v)
}

func errf(status int, format string, args ...any) error {
	return httpx.Errorf(status, http.StatusText(status), format, args...)
}

func (a *API) authenticate(r *http.Request) (auth.Principal, error) {
	key := r.Header.Get("X-API-Key")
	if key == "" {
		if v := r.Header.Get("Authorization"); strings.HasPrefix(v, "Bearer ") {
			key = strings.TrimPrefix(v, "Bearer ")
		}
	}
	if key == "" {
		return auth.Principal{}, errf(http.StatusUnauthorized, "missing API key (X-API-KEY)")
	}
	p, err := a.o.Keys.Verify(r.Context(), key)
	if errors.Is(err, core.ErrUnauthorized) {
		return p, errf(http.StatusUnauthorized, "invalid API key")
	}
	return p, err
}

// decode reads a bounded JSON body into v. Unknown fields are ignored: the
// SDK adds fields over time and old servers must not break on them; fields
// SPACE cannot honour are checked explicitly by the caller.
func decode(w http.ResponseWriter, r *http.Request, v any, required bool) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errf(http.StatusRequestEntityTooLarge, "request body larger than %d bytes", maxBody)
		}
		return errf(http.StatusBadRequest, "read body: %v", err)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		if required {
			return errf(http.StatusBadRequest, "a JSON body is required")
		}
		return nil
	}
	// As lenient as the SDKs need (they send application/json; a body
	// without a Content-Type is read as JSON too), and no more: 415.
	if err := httpx.CheckContentType(r.Header.Get("Content-Type"), []string{"application/json"}); err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return errf(http.StatusBadRequest, "field %q: expected %s", ute.Field, ute.Type)
		}
		return errf(http.StatusBadRequest, "malformed JSON body")
	}
	return nil
}

// newSandboxReq is NewSandbox (v1) and NewSandboxV2.
type newSandboxReq struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  *bool             `json:"autoPause"`
	AutoResume *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
	// Accepted: every envd is secured.
	Secure *bool `json:"secure"`
	// Mapped onto a SPACE network policy (network.go).
	AllowInternetAccess *bool       `json:"allow_internet_access"`
	Network             *e2bNetwork `json:"network"`
}

// sandboxResp is E2B's Sandbox (create/connect answer).
type sandboxResp struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// listedSandbox is E2B's ListedSandbox; detail adds the SandboxDetail fields.
type listedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	CPUCount    int64             `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	State       string            `json:"state"`
}

type detail struct {
	listedSandbox
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain"`
	Lifecycle       struct {
		OnTimeout  string `json:"onTimeout"`
		AutoResume bool   `json:"autoResume"`
	} `json:"lifecycle"`
	// The sandbox's SPACE network policy in E2B's terms (network.go).
	AllowInternetAccess *bool           `json:"allowInternetAccess"`
	Network             *e2bNetworkInfo `json:"network,omitempty"`
}

const clientID = "space"

// alive reports whether E2B would call the sandbox existing: E2B has no
// visible "creating" state (create answers once it runs), and killed or
// failed sandboxes are gone.
func alive(sb core.Sandbox) bool {
	return sb.State == core.SandboxRunning || sb.State == core.SandboxCreating || paused(sb)
}

// paused reports whether E2B would call the sandbox paused: frozen in
// place or hibernated (E2B's own pause is a snapshot, like hibernation).
func paused(sb core.Sandbox) bool {
	return sb.State == core.SandboxPaused || sb.State == core.SandboxHibernated
}

func (a *API) listed(sb core.Sandbox) listedSandbox {
	cpu := (sb.Limits.CPUMillis + 999) / 1000
	if cpu < 1 {
		cpu = 1
	}
	end := sb.CreatedAt.Add(core.MaxTimeoutSecond * time.Second)
	if sb.ExpiresAt != nil {
		end = *sb.ExpiresAt
	}
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	state := "running"
	if paused(sb) {
		state = "paused"
	}
	return listedSandbox{
		SandboxID: sb.ID, TemplateID: sb.Template, ClientID: clientID, CPUCount: cpu,
		MemoryMB: sb.Limits.MemoryBytes >> 20, DiskSizeMB: sb.Limits.DiskBytes >> 20, EnvdVersion: EnvdVersion, Metadata: md,
		StartedAt: sb.CreatedAt.UTC(), EndAt: end.UTC(), State: state,
	}
}

func (a *API) sandboxResp(sb core.Sandbox, alias string) sandboxResp {
	// A stable token: signed file URLs hash it, and envd recomputes it
	// (auth.Sessions.IssueStable).
	tok, _ := a.o.Sessions.IssueStable(sb.ProjectID, sb.ID, a.o.SessionTTL)
	resp := sandboxResp{SandboxID: sb.ID, TemplateID: sb.Template, Alias: alias, ClientID: clientID,
		EnvdVersion: EnvdVersion, EnvdAccessToken: tok, Domain: a.domain(sb)}
	if !sb.PublicPorts {
		// allowPublicTraffic: false: the ports need this token
		// (E2b-Traffic-Access-Token); it opens ports only, not envd.
		traffic, _ := a.o.Sessions.IssuePort(sb.ProjectID, sb.ID, auth.AnyPort, a.o.SessionTTL)
		resp.TrafficAccessToken = &traffic
	}
	return resp
}

// domain is the sandbox domain reported for sb (nil: none).
func (a *API) domain(sb core.Sandbox) *string {
	if a.o.PortDomain == nil {
		return nil
	}
	d := a.o.PortDomain(sb)
	return &d
}

func (a *API) create(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req newSandboxReq
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	// autoPause: at the timeout the sandbox hibernates (a snapshot that
	// resume or connect brings back) instead of being killed. autoResume:
	// envd traffic to a paused sandbox resumes it.
	var onTimeout string
	if req.AutoPause != nil && *req.AutoPause {
		onTimeout = core.OnTimeoutHibernate
	}
	autoResume := req.AutoResume != nil && req.AutoResume.Enabled
	if len(req.VolumeMounts) > 0 {
		return errf(http.StatusBadRequest, "volumeMounts are not supported")
	}
	alias := req.TemplateID
	if alias == "" {
		alias = "base"
	}
	tpl := alias
	if t, ok := a.o.Aliases[alias]; ok {
		tpl = t
	}
	timeout := int64(defaultTTL)
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 || timeout > core.MaxTimeoutSecond {
		return errf(http.StatusBadRequest, "timeout must be between 1 and %d seconds", core.MaxTimeoutSecond)
	}
	// The v1 route gets allow_internet_access: true from every SDK that
	// uses it (JS before 2.51, Python) whether or not the caller set it:
	// there it is E2B's default, not a request for the internet.
	network, err := mapNetwork(req.AllowInternetAccess, strings.HasPrefix(r.URL.Path, "/v2/"), req.Network, a.o.InternalRange)
	if err != nil {
		return err
	}
	var sb core.Sandbox
	var op core.Operation
	if core.ValidSnapshotID(alias) {
		// A snapshot id as the template (createSnapshot's answer): a fork
		// of that snapshot, with its files (and processes, where the
		// driver captured them).
		sb, op, err = a.createFromSnapshot(r, p, alias, &req, timeout, network)
	} else {
		if network == nil && a.o.OpenByDefault {
			network = &core.NetworkPolicy{Mode: string(policy.Open)}
		}
		sb, op, err = a.o.Service.Create(r.Context(), p.ProjectID, core.CreateRequest{
			Template: tpl, Env: req.EnvVars, Metadata: req.Metadata, TimeoutSeconds: &timeout,
			OnTimeout: onTimeout, AutoResume: autoResume, Network: network,
			// E2B's default: a sandbox's ports are public unless
			// network.allowPublicTraffic is false.
			PublicPorts: req.Network == nil || req.Network.AllowPublicTraffic == nil || *req.Network.AllowPublicTraffic,
		}, "")
	}
	if errors.Is(err, core.ErrNotFound) {
		return errf(http.StatusNotFound, "template %.64q not found", alias)
	}
	if err != nil {
		return err
	}
	// E2B's create answers once the sandbox is usable: wait for the SPACE
	// operation rather than handing back a sandbox that is still starting.
	deadline := time.Now().Add(a.o.CreateWait)
	for !op.State.Done() {
		left := time.Until(deadline)
		if left <= 0 {
			return errf(http.StatusGatewayTimeout, "sandbox %s did not start within %v (operation %s)", sb.ID, a.o.CreateWait, op.ID)
		}
		if op, err = a.o.Engine.Wait(r.Context(), p.ProjectID, op.ID, min(left, 30*time.Second)); err != nil {
			return err
		}
	}
	if op.State != core.OpSucceeded {
		msg := "sandbox creation failed"
		if op.Error != nil {
			msg += ": " + op.Error.Message
		}
		return errf(http.StatusInternalServerError, "%s", msg)
	}
	if sb, err = a.o.Service.Get(r.Context(), p.ProjectID, sb.ID); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, a.sandboxResp(sb, alias))
	return nil
}

// lookup returns a live sandbox of the caller's project, 404 otherwise.
func (a *API) lookup(r *http.Request, p auth.Principal) (core.Sandbox, error) {
	id := r.PathValue("id")
	sb, err := a.o.Service.Get(r.Context(), p.ProjectID, id)
	if errors.Is(err, core.ErrNotFound) || err == nil && !alive(sb) {
		return core.Sandbox{}, errf(http.StatusNotFound, "sandbox %.80q not found", id)
	}
	return sb, err
}

func (a *API) get(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	d := detail{listedSandbox: a.listed(sb), Domain: a.domain(sb)}
	d.Lifecycle.OnTimeout = "kill"
	if sb.OnTimeout == core.OnTimeoutHibernate {
		d.Lifecycle.OnTimeout = "pause"
	}
	d.Lifecycle.AutoResume = sb.AutoResume
	d.AllowInternetAccess, d.Network = networkInfo(sb.Network)
	writeJSON(w, http.StatusOK, d)
	return nil
}

func (a *API) kill(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	op, err := a.o.Service.Delete(r.Context(), p.ProjectID, sb.ID)
	if errors.Is(err, core.ErrNotFound) {
		return errf(http.StatusNotFound, "sandbox %s not found", sb.ID)
	}
	if err != nil {
		return err
	}
	// E2B's kill is synchronous; wait (bounded) so isRunning() right after
	// kill() says false.
	if _, err := a.o.Engine.Wait(r.Context(), p.ProjectID, op.ID, killWait); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) setTimeout(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	if req.Timeout == nil || *req.Timeout <= 0 || *req.Timeout > core.MaxTimeoutSecond {
		return errf(http.StatusBadRequest, "timeout must be between 1 and %d seconds", core.MaxTimeoutSecond)
	}
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	if _, err := a.o.Service.SetTimeout(r.Context(), p.ProjectID, sb.ID, *req.Timeout); err != nil {
		if errors.Is(err, core.ErrConflict) {
			return errf(http.StatusNotFound, "sandbox %s not found", sb.ID)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// extend moves a sandbox's end to now+seconds unless it already ends later
// (connect and refresh only ever extend).
func (a *API) extend(r *http.Request, sb core.Sandbox, seconds int64) (core.Sandbox, error) {
	if sb.ExpiresAt == nil {
		return sb, nil
	}
	if a.o.Now().Add(time.Duration(seconds) * time.Second).Before(*sb.ExpiresAt) {
		return sb, nil
	}
	out, err := a.o.Service.SetTimeout(r.Context(), sb.ProjectID, sb.ID, seconds)
	if errors.Is(err, core.ErrConflict) {
		return out, errf(http.StatusNotFound, "sandbox %s not found", sb.ID)
	}
	return out, err
}

func (a *API) refresh(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req struct {
		Duration *int64 `json:"duration"`
	}
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	secs := int64(defaultTTL)
	if req.Duration != nil {
		secs = *req.Duration
	}
	if secs <= 0 || secs > core.MaxTimeoutSecond {
		return errf(http.StatusBadRequest, "duration must be between 1 and %d seconds", core.MaxTimeoutSecond)
	}
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	if _, err := a.extend(r, sb, secs); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) connect(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	secs := int64(defaultTTL)
	if req.Timeout != nil {
		secs = *req.Timeout
	}
	if secs <= 0 || secs > core.MaxTimeoutSecond {
		return errf(http.StatusBadRequest, "timeout must be between 1 and %d seconds", core.MaxTimeoutSecond)
	}
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	// E2B's connect resumes a paused sandbox.
	if paused(sb) {
		if sb, err = a.runOp(r, p, sb, a.o.Service.Resume); err != nil {
			return err
		}
	}
	if sb, err = a.extend(r, sb, secs); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a.sandboxResp(sb, ""))
	return nil
}

// runOp runs a pause or resume operation and waits for it (E2B's calls are
// synchronous).
func (a *API) runOp(r *http.Request, p auth.Principal, sb core.Sandbox,
	start func(ctx context.Context, projectID, id, idemKey string) (core.Operation, error)) (core.Sandbox, error) {
	op, err := start(r.Context(), p.ProjectID, sb.ID, "")
	if err != nil {
		return sb, err
	}
	if op, err = a.o.Engine.Wait(r.Context(), p.ProjectID, op.ID, killWait); err != nil {
		return sb, err
	}
	if op.State != core.OpSucceeded {
		msg := "operation did not finish"
		if op.Error != nil {
			msg = op.Error.Message
		}
		return sb, errf(http.StatusInternalServerError, "%s", msg)
	}
	return a.o.Service.Get(r.Context(), p.ProjectID, sb.ID)
}

// pause freezes the sandbox in place (SPACE keeps a paused sandbox's
// processes in memory; the timeout clock stops).
func (a *API) pause(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	if paused(sb) {
		return errf(http.StatusConflict, "sandbox %s is already paused", sb.ID)
	}
	if _, err := a.runOp(r, p, sb, a.o.Service.Pause); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) resume(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	if !paused(sb) {
		return errf(http.StatusConflict, "sandbox is already running")
	}
	if sb, err = a.runOp(r, p, sb, a.o.Service.Resume); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, a.sandboxResp(sb, ""))
	return nil
}

// listFilter turns E2B list query parameters into a core filter. No state
// means running and paused, as in E2B; "paused" also matches hibernated
// sandboxes. ok is false when the filter can match nothing.
func listFilter(q url.Values, projectID string) (core.SandboxFilter, bool, error) {
	f := core.SandboxFilter{ProjectID: projectID}
	if v := q.Get("metadata"); v != "" {
		md, err := parseMetadataQuery(v)
		if err != nil {
			return f, false, err
		}
		f.Metadata = md
	}
	v := q.Get("state")
	if v == "" {
		v = "running,paused"
	}
	var running, paused bool
	for _, s := range strings.Split(v, ",") {
		switch s {
		case "running":
			running = true
		case "paused":
			paused = true
		default:
			return f, false, errf(http.StatusBadRequest, "unknown state %.32q (running, paused)", s)
		}
	}
	if running {
		f.States = append(f.States, core.SandboxCreating, core.SandboxRunning)
	}
	if paused {
		f.States = append(f.States, core.SandboxPaused, core.SandboxHibernated)
	}
	return f, len(f.States) > 0, nil
}

// parseMetadataQuery decodes the SDK's metadata filter: the query value is a
// URL-encoded "k=v&k2=v2" whose keys and values are URL-encoded once more.
func parseMetadataQuery(v string) (map[string]string, error) {
	if len(v) > 8<<10 {
		return nil, errf(http.StatusBadRequest, "metadata filter too long")
	}
	raw, err := url.QueryUnescape(v)
	if err != nil {
		return nil, errf(http.StatusBadRequest, "metadata filter is not URL-encoded")
	}
	md := map[string]string{}
	for _, pair := range strings.Split(raw, "&") {
		if pair == "" {
			continue
		}
		k, val, found := strings.Cut(pair, "=")
		if !found {
			return nil, errf(http.StatusBadRequest, "metadata filter must be key=value pairs")
		}
		dk, err1 := url.QueryUnescape(k)
		dv, err2 := url.QueryUnescape(val)
		if err1 != nil || err2 != nil {
			return nil, errf(http.StatusBadRequest, "metadata filter is not URL-encoded")
		}
		if len(md) >= core.MaxMetadata {
			return nil, errf(http.StatusBadRequest, "at most %d metadata filters", core.MaxMetadata)
		}
		md[dk] = dv
	}
	return md, nil
}

func (a *API) listV2(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	f, ok, err := listFilter(q, p.ProjectID)
	if err != nil {
		return err
	}
	f.Limit = maxListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return errf(http.StatusBadRequest, "limit must be 1..%d", maxListLimit)
		}
		f.Limit = n
	}
	if v := q.Get("nextToken"); v != "" {
		if !core.ValidSandboxID(v) {
			return errf(http.StatusBadRequest, "bad nextToken")
		}
		f.After = v
	}
	out := []listedSandbox{}
	if ok {
		f.Limit++ // one extra says whether there is a next page
		list, err := a.o.Service.List(r.Context(), f)
		if err != nil {
			return err
		}
		if len(list) == f.Limit {
			list = list[:f.Limit-1]
			w.Header().Set("X-Next-Token", list[len(list)-1].ID)
		}
		for _, sb := range list {
			out = append(out, a.listed(sb))
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listV1 is the deprecated unpaged list: running sandboxes only.
func (a *API) listV1(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	f, _, err := listFilter(url.Values{"metadata": r.URL.Query()["metadata"], "state": {"running"}}, p.ProjectID)
	if err != nil {
		return err
	}
	out := []listedSandbox{}
	f.Limit = 1000
	for {
		list, err := a.o.Service.List(r.Context(), f)
		if err != nil {
			return err
		}
		for _, sb := range list {
			out = append(out, a.listed(sb))
		}
		if len(list) < f.Limit || len(out) >= 10000 {
			break
		}
		f.After = list[len(list)-1].ID
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
