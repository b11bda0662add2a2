package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults for Options fields left zero.
const (
	DefaultRetainBytes  = 4 << 20
	DefaultMaxProcesses = 1024
	DefaultMaxExited    = 256
	DefaultExitGrace    = 500 * time.Millisecond
	DefaultMaxUpload    = 64 << 30
	DefaultReaderGrace  = 10 * time.Second
	DefaultRetainExited = 64 << 20
)

// Options configure a Server.
type Options struct {
	Config Config // initial defaults for commands; PUT /v1/config replaces them
	Logf   func(format string, args ...any)
	// RetainBytes is how much output per process is kept for re-reads
	// (GET .../events?after=N).
	RetainBytes int
	// ReaderGrace is how long output waits for a reader (after a command
	// starts, or after its last reader went away) before the oldest
	// retained events are dropped to make room; until then a full
	// retention buffer blocks the command.
	ReaderGrace time.Duration
	// MaxProcesses bounds processes that have not exited yet.
	MaxProcesses int
	// MaxExited bounds exited processes kept for listings and re-reads.
	MaxExited int
	// RetainExitedBytes bounds the output retained by all exited processes
	// together; the oldest exited processes are forgotten first.
	RetainExitedBytes int
	// ExitGrace is how long, after a command exits, output is still
	// collected from pipes that its background children hold open. After
	// it the exit event is sent and later output is discarded.
	ExitGrace time.Duration
	// MaxUploadBytes bounds one file upload.
	MaxUploadBytes int64
	// Version is reported by GET /health.
	Version string
	// Wrap, if set, wraps the agent's handler (e.g. with the routes a
	// driver's listener needs, such as gVisor's listener release).
	Wrap func(http.Handler) http.Handler
	// ProcAttr, if set, adjusts each command's process attributes before
	// it starts (e.g. gVisor's agent starts commands in the in-sandbox
	// pids cgroup: UseCgroupFD).
	ProcAttr func(*syscall.SysProcAttr)

	// etcDir is where passwd and group are read; "/etc" unless a test
	// points it elsewhere.
	etcDir string
	// maxListEntries caps directory listings; tests lower it.
	maxListEntries int
	// procDirOverride is where the port listing reads net/tcp{,6}; "/proc"
	// unless a test points it at a fixture.
	procDirOverride string
}

// Server is the agent's HTTP API. Create it with NewServer.
type Server struct {
	opts     Options
	reaper   *reaper
	handler  http.Handler
	shutdown chan struct{} // closed when Serve returns: stop everything
	wg       sync.WaitGroup
	writers  sync.Pool // *bufio.Writer for event streams

	mu       sync.Mutex
	cfg      Config
	procs    map[string]*process
	exited   []*process // exited processes, oldest first
	exitedB  int        // output bytes they retain
	live     int        // processes not yet exited (including starting)
	nextID   uint64
	closing  bool
	shutOnce sync.Once
}

// NewServer returns a server; nothing runs until Serve.
func NewServer(opts Options) *Server {
	if opts.RetainBytes <= 0 {
		opts.RetainBytes = DefaultRetainBytes
	}
	if opts.MaxProcesses <= 0 {
		opts.MaxProcesses = DefaultMaxProcesses
	}
	if opts.MaxExited <= 0 {
		opts.MaxExited = DefaultMaxExited
	}
	if opts.RetainExitedBytes <= 0 {
		opts.RetainExitedBytes = DefaultRetainExited
	}
	if opts.ExitGrace <= 0 {
		opts.ExitGrace = DefaultExitGrace
	}
	if opts.ReaderGrace <= 0 {
		opts.ReaderGrace = DefaultReaderGrace
	}
	if opts.MaxUploadBytes <= 0 {
		opts.MaxUploadBytes = DefaultMaxUpload
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.maxListEntries <= 0 {
		opts.maxListEntries = DefaultMaxListEntries
	}
	if opts.etcDir == "" {
		opts.etcDir = "/etc"
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	s := &Server{
		opts:     opts,
		reaper:   sharedReaper(),
		shutdown: make(chan struct{}),
		cfg:      opts.Config,
		procs:    make(map[string]*process),
		nextID:   1,
	}
	s.handler = http.HandlerFunc(s.route)
	if opts.Wrap != nil {
		s.handler = opts.Wrap(s.handler)
	}
	return s
}

// Handler returns the HTTP API. Serve uses it; tests may mount it elsewhere.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves the API on l until ctx is done, then closes every connection,
// kills every process the server started (SIGKILL to its process group) and
// waits for their goroutines. It returns nil when stopped by ctx.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          nil,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	srv.Close()
	if err == nil {
		<-errc
	}
	s.stopAll()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("agent: serve: %w", err)
	}
	return nil
}

// stopAll kills every process and waits for the server's goroutines.
func (s *Server) stopAll() {
	s.shutOnce.Do(func() { close(s.shutdown) })
	s.mu.Lock()
	s.closing = true
	procs := make([]*process, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		p.killForShutdown()
		p.closeOutputs()
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(stopTimeout):
		// A command stuck in uninterruptible sleep cannot be reaped;
		// do not hang the caller with it.
		s.opts.Logf("agent: processes still running %v after SIGKILL", stopTimeout)
	}
}

// stopTimeout bounds how long Serve waits for killed commands to be reaped.
const stopTimeout = 10 * time.Second

// route dispatches requests. A hand-written router keeps every error,
// including 404 and 405, in the JSON envelope.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/health":
		s.method(w, r, http.MethodGet, s.handleHealth)
	case p == "/v1/config":
		s.method(w, r, http.MethodPut, s.handleConfig)
	case p == "/v1/processes":
		switch r.Method {
		case http.MethodGet:
			s.handleListProcesses(w, r)
		case http.MethodPost:
			s.handleStart(w, r)
		default:
			writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "method not allowed")
		}
	case strings.HasPrefix(p, "/v1/processes/"):
		s.routeProcess(w, r, strings.TrimPrefix(p, "/v1/processes/"))
	case p == "/v1/files":
		switch r.Method {
		case http.MethodGet:
			s.handleDownload(w, r)
		case http.MethodPut:
			s.handleUpload(w, r)
		case http.MethodDelete:
			s.handleRemove(w, r)
		default:
			writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "method not allowed")
		}
	case p == "/v1/ports" || strings.HasPrefix(p, "/v1/ports/"):
		s.routePorts(w, r, strings.TrimPrefix(strings.TrimPrefix(p, "/v1/ports"), "/"))
	case p == "/v1/metrics":
		s.method(w, r, http.MethodGet, s.handleMetrics)
	case p == "/v1/files/list":
		s.method(w, r, http.MethodGet, s.handleListDir)
	case p == "/v1/files/stat":
		s.method(w, r, http.MethodGet, s.handleStat)
	case p == "/v1/files/mkdir":
		s.method(w, r, http.MethodPost, s.handleMkdir)
	case p == "/v1/files/move":
		s.method(w, r, http.MethodPost, s.handleMove)
	default:
		writeError(w, http.StatusNotFound, CodeNotFound, "no such route")
	}
}

func (s *Server) routeProcess(w http.ResponseWriter, r *http.Request, rest string) {
	id, action, _ := strings.Cut(rest, "/")
	proc := s.lookup(id)
	if proc == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, "no such process")
		return
	}
	var h func(http.ResponseWriter, *http.Request, *process)
	method := http.MethodPost
	switch action {
	case "":
		h, method = s.handleGetProcess, http.MethodGet
	case "events":
		h, method = s.handleEvents, http.MethodGet
	case "stdin":
		h = s.handleStdin
	case "stdin/close":
		h = s.handleStdinClose
	case "signal":
		h = s.handleSignal
	case "resize":
		h = s.handleResize
	default:
		writeError(w, http.StatusNotFound, CodeNotFound, "no such route")
		return
	}
	if r.Method != method {
		writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "method not allowed")
		return
	}
	h(w, r, proc)
}

func (s *Server) method(w http.ResponseWriter, r *http.Request, m string, h http.HandlerFunc) {
	if r.Method != m {
		writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "method not allowed")
		return
	}
	h(w, r)
}

func (s *Server) lookup(id string) *process {
	if len(id) > 20 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[id]
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, Health{OK: true, PID: os.Getpid(), Version: s.opts.Version})
}

func (s *Server) handleConfig(w http.ResponseWriter, r *http.Request) {
	var cfg Config
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, MaxJSONBody), &cfg); err != nil {
		writeErr(w, err)
		return
	}
	if err := validateConfig(&cfg); err != nil {
		writeErr(w, err)
		return
	}
	s.mu.Lock()
	s.cfg = cfg
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// apiError carries an explicit status and code to writeErr.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func newAPIError(status int, code, format string, args ...any) error {
	return &apiError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

// writeErr maps an error to a status and code.
func writeErr(w http.ResponseWriter, err error) {
	var ae *apiError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		writeError(w, ae.status, ae.code, ae.msg)
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("body larger than %d bytes", mbe.Limit))
	case errors.Is(err, errInvalid):
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
	default:
		status, code := errnoStatus(err)
		writeError(w, status, code, err.Error())
	}
}

// errnoStatus classifies filesystem and exec errors.
func errnoStatus(err error) (int, string) {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		if errors.Is(err, fs.ErrNotExist) {
			return http.StatusNotFound, CodeNotFound
		}
		return http.StatusInternalServerError, CodeInternal
	}
	switch errno {
	case syscall.ENOENT:
		return http.StatusNotFound, CodeNotFound
	case syscall.EEXIST:
		return http.StatusConflict, CodeAlreadyExists
	case syscall.ENOTEMPTY:
		return http.StatusConflict, CodeNotEmpty
	case syscall.ENOTDIR:
		return http.StatusBadRequest, CodeNotADirectory
	case syscall.EISDIR:
		return http.StatusBadRequest, CodeIsADirectory
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return http.StatusForbidden, CodePermissionDenied
	case syscall.ENOSPC, syscall.EDQUOT:
		return http.StatusInsufficientStorage, CodeNoSpace
	case syscall.ENAMETOOLONG, syscall.ELOOP, syscall.EINVAL, syscall.EXDEV, syscall.EBUSY:
		return http.StatusBadRequest, CodeBadRequest
	}
	return http.StatusInternalServerError, CodeInternal
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, ErrorBody{Error: ErrorDetail{Code: code, Message: truncate(msg, 4096)}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"encoding response"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
