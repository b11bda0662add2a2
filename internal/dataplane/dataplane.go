// Package dataplane serves the data connection: commands, their streamed
// output, stdin, signals and files of one sandbox. It listens on its own
// port and accepts only session tokens, each bound to one sandbox; the
// control API's keys do not work here and tokens do not work there.
package dataplane

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/space-sandbox/space/internal/audit"
	"io"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/execlog"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/portfwd"
)

//go:embed openapi.json
var openapiDoc []byte

// OpenAPI returns the data plane's OpenAPI 3 document.
func OpenAPI() []byte { return openapiDoc }

// Limits on client input.
const (
	MaxPathBytes   = 4096
	MaxStdinBytes  = 1 << 20
	MaxUploadBytes = 4 << 30
)

// Options configure the data plane.
type Options struct {
	Node     *node.Node
	Sessions *auth.Sessions
	Logf     func(string, ...any)
	// Wake, if set, resumes a paused or hibernated sandbox that asked for
	// automatic resume; it reports whether it did (core.Service.AutoResume).
	Wake func(ctx context.Context, projectID, id string) (bool, error)
	// PortURLs, if set, builds the URLs of forwarded ports in the port
	// listing.
	PortURLs *portfwd.URLs
	// Audit receives refusals: a session token used on another sandbox,
	// a files or command request the sandbox refused with 403. Nil
	// discards them.
	Audit *audit.Log
}

// Server is the data-plane handler.
type Server struct {
	o    Options
	mux  *http.ServeMux
	edge http.Handler // mux behind the request media-type check
}

type handler func(s *Server, w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error

type route struct {
	method, pattern string
	h               handler
}

var routes = []route{
	{"POST", "/v1/sandboxes/{id}/commands", (*Server).startCommand},
	{"GET", "/v1/sandboxes/{id}/commands", (*Server).listCommands},
	{"GET", "/v1/sandboxes/{id}/commands/{cid}", (*Server).getCommand},
	{"GET", "/v1/sandboxes/{id}/commands/{cid}/events", (*Server).commandEvents},
	{"POST", "/v1/sandboxes/{id}/commands/{cid}/stdin", (*Server).writeStdin},
	{"POST", "/v1/sandboxes/{id}/commands/{cid}/stdin/close", (*Server).closeStdin},
	{"POST", "/v1/sandboxes/{id}/commands/{cid}/signal", (*Server).signal},
	{"POST", "/v1/sandboxes/{id}/commands/{cid}/resize", (*Server).resize},
	{"GET", "/v1/sandboxes/{id}/files", (*Server).download},
	{"PUT", "/v1/sandboxes/{id}/files", (*Server).upload},
	{"DELETE", "/v1/sandboxes/{id}/files", (*Server).remove},
	{"GET", "/v1/sandboxes/{id}/files/list", (*Server).listDir},
	{"GET", "/v1/sandboxes/{id}/files/stat", (*Server).stat},
	{"POST", "/v1/sandboxes/{id}/files/mkdir", (*Server).mkdir},
	{"POST", "/v1/sandboxes/{id}/files/move", (*Server).move},
	{"GET", "/v1/sandboxes/{id}/ports", (*Server).listPorts},
	{"POST", "/v1/sandboxes/{id}/code", (*Server).runCode},
}

// Routes returns "METHOD pattern" for every authenticated route.
func Routes() []string {
	out := make([]string, len(routes))
	for i, rt := range routes {
		out[i] = rt.method + " " + rt.pattern
	}
	return out
}

// New returns the data-plane handler.
func New(o Options) *Server {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	s := &Server{o: o, mux: http.NewServeMux()}
	for _, rt := range routes {
		rt := rt
		s.mux.HandleFunc(rt.method+" "+rt.pattern, func(w http.ResponseWriter, r *http.Request) {
			sb, err := s.authorize(r)
			if err == nil {
				err = rt.h(s, w, r, sb)
			}
			if err != nil {
				err = mapAgentError(err)
				if st, code, msg := httpx.StatusOf(err); st == http.StatusForbidden && sb != nil {
					s.o.Audit.Record(r.Context(), audit.Event{Action: "data " + rt.method + " " + rt.pattern, Outcome: "denied",
						ProjectID: sb.ProjectID, Kind: "sandbox", Target: sb.ID, Reason: code + ": " + msg})
				}
				httpx.WriteError(w, err)
			}
		})
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
	})
	s.mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openapiDoc)
	})
	s.mux.HandleFunc("/", httpx.NotFound)
	// Request bodies must have the media types openapi.json gives each
	// route (415 otherwise): JSON routes take application/json (or no
	// Content-Type), file and stdin bodies any type but multipart.
	edge, err := httpx.ContentTypes(openapiDoc, s.mux, s.mux)
	if err != nil {
		panic(err) // the embedded document; its tests parse it
	}
	s.edge = cors(edge) // browsers: cors.go
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	httpx.Recover(s.edge, s.o.Logf).ServeHTTP(w, r)
}

func (s *Server) authorize(r *http.Request) (*node.Sandbox, error) {
	tok := r.Header.Get("X-Access-Token")
	if a := r.Header.Get("Authorization"); tok == "" && strings.HasPrefix(a, "Bearer ") {
		tok = strings.TrimPrefix(a, "Bearer ")
	}
	if tok == "" {
		return nil, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "missing session token (Authorization: Bearer or X-Access-Token)")
	}
	sess, err := s.o.Sessions.Verify(tok)
	if err != nil {
		if errors.Is(err, auth.ErrExpired) {
			return nil, httpx.Errorf(http.StatusUnauthorized, "token_expired", "session token expired; ask the control API for a new one")
		}
		return nil, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "invalid session token")
	}
	// A token names exactly one sandbox; any other id is "not found" so a
	// token reveals nothing about sandboxes it is not for.
	if sess.SandboxID != r.PathValue("id") {
		s.o.Audit.Record(r.Context(), audit.Event{Action: "data " + r.Method + " " + r.Pattern, Outcome: "denied", ProjectID: sess.ProjectID,
			Kind: "sandbox", Target: truncate(r.PathValue("id"), 64), Reason: "session token of sandbox " + sess.SandboxID + " used on another sandbox"})
		return nil, httpx.Errorf(http.StatusNotFound, "not_found", "sandbox not found")
	}
	sb, err := s.o.Node.Sandbox(sess.SandboxID)
	if err != nil && s.o.Wake != nil {
		if woke, werr := s.o.Wake(r.Context(), sess.ProjectID, sess.SandboxID); werr != nil {
			s.o.Logf("sandbox %s: auto-resume: %v", sess.SandboxID, werr)
		} else if woke {
			sb, err = s.o.Node.Sandbox(sess.SandboxID)
		}
	}
	if errors.Is(err, core.ErrConflict) {
		return nil, httpx.Errorf(http.StatusConflict, "sandbox_paused", "the sandbox is paused; resume it through the control API")
	}
	if err != nil {
		return nil, httpx.Errorf(http.StatusNotFound, "not_found", "sandbox not found or not running")
	}
	return sb, nil
}

// mapAgentError passes the agent's client errors through and hides its
// internal ones: the agent is untrusted, its 5xx text is not shown.
func mapAgentError(err error) error {
	var ae *client.Error
	if errors.As(err, &ae) {
		if ae.Status >= 400 && ae.Status < 500 {
			return httpx.Errorf(ae.Status, ae.Code, "%s", truncate(ae.Message, 512))
		}
		return httpx.Errorf(http.StatusBadGateway, "agent_error", "the sandbox agent failed")
	}
	return err
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// CleanPath validates a sandbox path from a client: absolute, bounded, no
// NUL, and cleaned so "/a/../../etc" cannot mean anything but "/etc" inside
// the sandbox's own root.
func CleanPath(p string) (string, error) {
	if p == "" {
		return "", httpx.Errorf(http.StatusBadRequest, "invalid_path", "path is required")
	}
	if len(p) > MaxPathBytes {
		return "", httpx.Errorf(http.StatusBadRequest, "invalid_path", "path longer than %d bytes", MaxPathBytes)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", httpx.Errorf(http.StatusBadRequest, "invalid_path", "path contains a NUL byte")
	}
	if !strings.HasPrefix(p, "/") {
		return "", httpx.Errorf(http.StatusBadRequest, "invalid_path", "path must be absolute")
	}
	return path.Clean(p), nil
}

func queryPath(r *http.Request) (string, error) { return CleanPath(r.URL.Query().Get("path")) }

// fileAgent is the sandbox's agent acting as the user a file request names
// (query parameter "user"; empty: the sandbox's default user, the
// template's user else root), with that user's permissions: what the user
// may not read, write or reach is refused (403 permission_denied) and what
// it creates belongs to the user. The agent checks the name.
func fileAgent(r *http.Request, sb *node.Sandbox) *client.Client {
	return sb.Agent.As(r.URL.Query().Get("user"))
}

type commandView struct {
	agent.ProcessInfo
	LastEventID uint64 `json:"last_event_id"`
	Truncated   bool   `json:"output_truncated,omitempty"`
}

func view(c *node.Command) commandView {
	v := commandView{ProcessInfo: c.Info, LastEventID: c.Log.LastSeq(), Truncated: c.Log.Truncated()}
	if ex := c.Exit(); ex != nil {
		v.Running, v.Exit = false, ex
	} else {
		v.Running, v.Exit = true, nil
	}
	return v
}

// DecodeSpec strictly decodes a command request.
func DecodeSpec(body []byte) (agent.ProcessSpec, error) {
	var spec agent.ProcessSpec
	if err := httpx.DecodeStrict(body, &spec); err != nil {
		return spec, err
	}
	if (len(spec.Argv) == 0) == (spec.Shell == "") {
		return spec, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "give exactly one of argv or shell")
	}
	if len(spec.Argv) > agent.MaxArgs {
		return spec, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "more than %d arguments", agent.MaxArgs)
	}
	total := len(spec.Shell)
	for _, a := range spec.Argv {
		total += len(a)
	}
	for k, v := range spec.Env {
		total += len(k) + len(v)
	}
	if total > agent.MaxArgBytes {
		return spec, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "argv and env larger than %d bytes", agent.MaxArgBytes)
	}
	if spec.Cwd != "" {
		c, err := CleanPath(spec.Cwd)
		if err != nil {
			return spec, err
		}
		spec.Cwd = c
	}
	if spec.TimeoutMs < 0 {
		return spec, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "timeout_ms must not be negative")
	}
	if spec.PTY != nil && (spec.PTY.Cols == 0 || spec.PTY.Rows == 0) {
		return spec, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "pty cols and rows must be positive")
	}
	return spec, nil
}

func (s *Server) startCommand(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, httpx.MaxJSONBody))
	if err != nil {
		return err
	}
	spec, err := DecodeSpec(body)
	if err != nil {
		return err
	}
	c, err := sb.Exec(r.Context(), spec)
	if err != nil {
		return err
	}
	w.Header().Set("Location", r.URL.Path+"/"+c.Info.ID)
	// A client that asks for a stream gets the command's events on this
	// response, after a "start" event with what the JSON answer holds:
	// one round trip fewer than POST and then GET .../events.
	accept := r.Header.Get("Accept")
	frames := strings.Contains(accept, agent.EventsContentType)
	if frames || strings.Contains(accept, "text/event-stream") {
		rd, err := c.Log.NewReader(0) // from the start: cannot be gone
		if err != nil {
			return fmt.Errorf("command %s: %w", c.Info.ID, err)
		}
		if frames {
			return streamFrames(w, r, c, rd, http.StatusCreated)
		}
		return streamSSE(w, r, c, rd, http.StatusCreated)
	}
	httpx.WriteJSON(w, http.StatusCreated, view(c))
	return nil
}

func (s *Server) listCommands(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	cmds := sb.Commands()
	out := make([]commandView, len(cmds))
	for i, c := range cmds {
		out[i] = view(c)
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"commands": out})
	return nil
}

func (s *Server) command(r *http.Request, sb *node.Sandbox) (*node.Command, error) {
	return sb.Command(r.PathValue("cid"))
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	c, err := s.command(r, sb)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, view(c))
	return nil
}

var eventNames = map[byte]string{execlog.Stdout: "stdout", execlog.Stderr: "stderr", execlog.Exit: "exit", execlog.Dropped: "dropped"}

// commandEvents streams a command's output as SSE: "stdout"/"stderr" events
// carry base64 chunks, the last event is "exit" with JSON. Event ids are
// sequence numbers; Last-Event-ID resumes after one. Where the sandbox's
// output bound dropped events the client asked for, a "dropped" event
// (JSON execlog.DropInfo, id: the last dropped event) comes first.
func (s *Server) commandEvents(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	c, err := s.command(r, sb)
	if err != nil {
		return err
	}
	after, ok := httpx.LastEventID(r)
	if !ok {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "Last-Event-ID must be a number")
	}
	rd, err := c.Log.NewReader(after)
	if err != nil {
		return httpx.Errorf(http.StatusGone, "events_gone", "%v", err)
	}
	if strings.Contains(r.Header.Get("Accept"), agent.EventsContentType) {
		return streamFrames(w, r, c, rd, http.StatusOK)
	}
	return streamSSE(w, r, c, rd, http.StatusOK)
}

// startEvent is the type of the first event of a stream that a POST of a
// command answers: its payload is the command's JSON view. Binary frames
// carry it with seq 0 and type 5.
const startEvent = "start"

// streamSSE answers with status and c's events from rd as SSE. With
// status 201 (the command was just started) a "start" event with the
// command's view comes first.
func streamSSE(w http.ResponseWriter, r *http.Request, c *node.Command, rd *execlog.Reader, status int) error {
	sse := httpx.StartSSEStatus(w, status)
	if status == http.StatusCreated {
		raw, _ := json.Marshal(view(c))
		if sse.Event("", startEvent, raw) != nil || sse.Flush() != nil {
			return nil
		}
	}
	ctx := r.Context()
	keepAlive := time.NewTicker(15 * time.Second)
	defer keepAlive.Stop()
	var enc []byte
	for {
		if !rd.Ready() {
			if err := sse.Flush(); err != nil {
				return nil
			}
			if err := waitReady(ctx, rd, keepAlive.C, sse); err != nil {
				return nil
			}
		}
		rec, err := rd.Next(ctx)
		if err == io.EOF {
			sse.Flush()
			return nil
		}
		if err != nil {
			return nil // the client left or the sandbox went away
		}
		id := strconv.FormatUint(rec.Seq, 10)
		if rec.Type == execlog.Exit {
			sse.Event(id, "exit", rec.Data)
			sse.Flush()
			return nil
		}
		if rec.Type == execlog.Dropped {
			if err := sse.Event(id, "dropped", rec.Data); err != nil {
				return nil
			}
			continue
		}
		n := base64.StdEncoding.EncodedLen(len(rec.Data))
		if cap(enc) < n {
			enc = make([]byte, n)
		}
		enc = enc[:n]
		base64.StdEncoding.Encode(enc, rec.Data)
		if err := sse.Event(id, eventNames[rec.Type], enc); err != nil {
			return nil
		}
		if sse.Buffered() > 256<<10 {
			if err := sse.Flush(); err != nil {
				return nil
			}
		}
	}
}

// streamFrames is the binary alternative to SSE for bulk consumers: the
// same events, each as a 13-byte header (seq u64, type u8, length u32, big
// endian) and the raw bytes, so output needs no base64 on either side
// (types: 1 stdout, 2 stderr, 3 exit and 4 dropped, both with JSON; on a
// POST of the command, 5 start with its JSON view and seq 0 first). A
// client asks for it with Accept: application/x-space-events and resumes
// with Last-Event-ID like an SSE client.
func streamFrames(w http.ResponseWriter, r *http.Request, c *node.Command, rd *execlog.Reader, status int) error {
	w.Header().Set("Content-Type", agent.EventsContentType)
	w.Header().Set("Cache-Control", "no-store")
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	w.WriteHeader(status)
	bw := bufio.NewWriterSize(w, 256<<10)
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	var hdr [agent.FrameHeaderSize]byte
	if status == http.StatusCreated {
		raw, _ := json.Marshal(view(c))
		hdr[8] = agent.EventStarted
		binary.BigEndian.PutUint32(hdr[9:13], uint32(len(raw)))
		bw.Write(hdr[:])
		bw.Write(raw)
	}
	if err := flush(); err != nil {
		return nil
	}
	ctx := r.Context()
	for {
		if ch := rd.Wait(); ch != nil {
			if err := flush(); err != nil {
				return nil
			}
			select {
			case <-ctx.Done():
				return nil
			case <-ch:
			}
			continue
		}
		rec, err := rd.Next(ctx)
		if err != nil {
			flush()
			return nil // io.EOF: the log ended; otherwise the client left
		}
		binary.BigEndian.PutUint64(hdr[0:8], rec.Seq)
		hdr[8] = rec.Type
		binary.BigEndian.PutUint32(hdr[9:13], uint32(len(rec.Data)))
		bw.Write(hdr[:])
		if _, err := bw.Write(rec.Data); err != nil {
			return nil
		}
		if rec.Type == execlog.Exit {
			flush()
			return nil
		}
	}
}

// waitReady waits for the next record, sending keep-alive comments.
func waitReady(ctx context.Context, rd *execlog.Reader, tick <-chan time.Time, sse *httpx.SSE) error {
	for {
		ch := rd.Wait()
		if ch == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			if err := sse.Comment("keep-alive"); err != nil {
				return err
			}
			if err := sse.Flush(); err != nil {
				return err
			}
		case <-ch:
		}
	}
}

func (s *Server) writeStdin(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	c, err := s.command(r, sb)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxStdinBytes))
	if err != nil {
		return err
	}
	if err := sb.Agent.WriteStdin(r.Context(), c.Info.ID, data); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) closeStdin(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	c, err := s.command(r, sb)
	if err != nil {
		return err
	}
	if err := sb.Agent.CloseStdin(r.Context(), c.Info.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) signal(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	c, err := s.command(r, sb)
	if err != nil {
		return err
	}
	var req struct {
		Signal json.RawMessage `json:"signal"`
	}
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	sig := strings.Trim(string(req.Signal), `"`)
	if sig == "" || len(sig) > 16 {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "signal is required, e.g. \"SIGTERM\" or 15")
	}
	if err := sb.Agent.Signal(r.Context(), c.Info.ID, sig); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) resize(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	c, err := s.command(r, sb)
	if err != nil {
		return err
	}
	var req struct {
		Cols uint16 `json:"cols"`
		Rows uint16 `json:"rows"`
	}
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Cols == 0 || req.Rows == 0 {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "cols and rows must be positive")
	}
	if err := sb.Agent.Resize(r.Context(), c.Info.ID, req.Cols, req.Rows); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) download(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	rc, size, err := fileAgent(r, sb).Download(r.Context(), p)
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	http.NewResponseController(w).SetWriteDeadline(time.Time{})
	w.WriteHeader(http.StatusOK)
	io.Copy(w, rc)
	return nil
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	mode := os.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o7777 {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "mode must be octal, e.g. 0644")
		}
		mode = os.FileMode(v)
	}
	http.NewResponseController(w).SetReadDeadline(time.Time{})
	if err := fileAgent(r, sb).Upload(r.Context(), p, mode, http.MaxBytesReader(w, r.Body, MaxUploadBytes)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) remove(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	if p == "/" {
		return httpx.Errorf(http.StatusBadRequest, "invalid_path", "refusing to remove /")
	}
	rec := r.URL.Query().Get("recursive") == "true"
	if err := fileAgent(r, sb).Remove(r.Context(), p, rec); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listDir(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	entries, err := fileAgent(r, sb).ListDir(r.Context(), p)
	if err != nil {
		return err
	}
	if entries == nil {
		entries = []agent.FileInfo{}
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"entries": entries})
	return nil
}

func (s *Server) stat(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	fi, err := fileAgent(r, sb).Stat(r.Context(), p)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, fi)
	return nil
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	var req struct {
		Path string `json:"path"`
	}
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	p, err := CleanPath(req.Path)
	if err != nil {
		return err
	}
	if err := fileAgent(r, sb).Mkdir(r.Context(), p); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) move(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	var req struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	from, err := CleanPath(req.From)
	if err != nil {
		return err
	}
	to, err := CleanPath(req.To)
	if err != nil {
		return err
	}
	if err := fileAgent(r, sb).Move(r.Context(), from, to); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
