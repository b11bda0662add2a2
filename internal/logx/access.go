package logx

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/audit"
)

// Principal is who made a request, as its access-log line names it.
type Principal struct {
	Project string // the project of the key or session token
	KeyID   string // the API key's id (control API)
	Sandbox string // the sandbox a session token is bound to (data plane)
}

type entry struct {
	mu sync.Mutex
	p  Principal
}

type entryKey struct{}

// SetPrincipal records who a request authenticated as, for its access-log
// line (auth.Keys.Verify calls it). Outside an access-logged request it
// does nothing.
func SetPrincipal(ctx context.Context, p Principal) {
	e, _ := ctx.Value(entryKey{}).(*entry)
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.Project != "" {
		e.p.Project = p.Project
	}
	if p.KeyID != "" {
		e.p.KeyID = p.KeyID
	}
	if p.Sandbox != "" {
		e.p.Sandbox = p.Sandbox
	}
}

// AccessOptions configure Access.
type AccessOptions struct {
	Logger *slog.Logger
	// Plane names the listener in every line: "control", "data" or "node".
	Plane string
	// Routes are the handler's route patterns ("METHOD /path/{id}" or
	// "/prefix/"), so that a line names the pattern a request matched
	// rather than only its path; "" when none matched.
	Routes []string
	// Pattern, if set, names the pattern instead of Routes.
	Pattern func(*http.Request) string
	// Classify, if set, names requests that no route serves (forwarded
	// ports); "" falls back to Routes or Pattern.
	Classify func(*http.Request) string
	// Identify, if set, names who made a request that no handler recorded
	// with SetPrincipal (e.g. by reading its session token).
	Identify func(*http.Request) Principal
	// Quiet paths (health checks) are logged at debug, not info.
	Quiet []string
}

// Access wraps next with the access log: every request gets a request id
// (the client's X-Request-Id when it is a sane token, else a new one; see
// audit.RequestIDFrom), set on the request, the response and its context,
// and one record when it ends: plane, method, pattern, path, status, bytes
// (response body), duration_ms, request_id, remote, and project, key_id
// and sandbox where known, and the cause of an internal error (error).
// 5xx answers are logged at warn.
func Access(next http.Handler, o AccessOptions) http.Handler {
	if o.Logger == nil {
		return next
	}
	match := func(*http.Request) string { return "" }
	if o.Pattern != nil {
		match = o.Pattern
	} else if len(o.Routes) > 0 {
		mux := http.NewServeMux()
		nop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
		for _, p := range o.Routes {
			func() {
				defer func() { _ = recover() }() // a pattern two tables share
				mux.Handle(p, nop)
			}()
		}
		match = func(r *http.Request) string {
			_, p := mux.Handler(r)
			return p
		}
	}
	if o.Classify != nil {
		routed := match
		match = func(r *http.Request) string {
			if p := o.Classify(r); p != "" {
				return p
			}
			return routed(r)
		}
	}
	quiet := map[string]bool{}
	for _, p := range o.Quiet {
		quiet[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		id := audit.RequestIDFrom(r.Header.Get("X-Request-Id"))
		r.Header.Set("X-Request-Id", id) // the handlers behind reuse it
		w.Header().Set("X-Request-Id", id)
		e := &entry{}
		ctx := audit.WithRequestID(context.WithValue(r.Context(), entryKey{}, e), id)
		r = r.WithContext(ctx)
		rec := &recorder{ResponseWriter: w}
		defer func() {
			status := rec.status
			if status == 0 {
				status = http.StatusOK
			}
			level := slog.LevelInfo
			switch {
			case status >= 500:
				level = slog.LevelWarn
			case quiet[r.URL.Path]:
				level = slog.LevelDebug
			}
			lctx := context.WithoutCancel(ctx)
			if !o.Logger.Enabled(lctx, level) {
				return
			}
			e.mu.Lock()
			p := e.p
			e.mu.Unlock()
			if p == (Principal{}) && o.Identify != nil {
				p = o.Identify(r)
			}
			path := r.URL.Path
			if len(path) > 256 {
				path = path[:256]
			}
			attrs := []slog.Attr{
				slog.String("plane", o.Plane),
				slog.String("method", r.Method),
				slog.String("pattern", match(r)),
				slog.String("path", path),
				slog.Int("status", status),
				slog.Int64("bytes", rec.bytes),
				slog.Float64("duration_ms", float64(time.Since(t0).Microseconds())/1000),
				slog.String("request_id", id),
				slog.String("remote", r.RemoteAddr),
			}
			if p.Project != "" {
				attrs = append(attrs, slog.String("project", p.Project))
			}
			if p.KeyID != "" {
				attrs = append(attrs, slog.String("key_id", p.KeyID))
			}
			if p.Sandbox != "" {
				attrs = append(attrs, slog.String("sandbox", p.Sandbox))
			}
			if rec.err != nil {
				msg := rec.err.Error()
				if len(msg) > maxErrorLen {
					msg = msg[:maxErrorLen]
				}
				attrs = append(attrs, slog.String("error", msg))
			}
			o.Logger.LogAttrs(lctx, level, "http request", attrs...)
		}()
		next.ServeHTTP(rec, r)
	})
}

// recorder notes a response's status and body size; it keeps streaming
// working (Flush, and Unwrap for http.ResponseController).
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
	err    error // an internal error's cause (httpx.WriteError)
}

// maxErrorLen bounds the error attribute of a log line.
const maxErrorLen = 1024

// NoteError implements httpx.ErrorNoter: the cause of a 500 goes in the
// request's log line, not to the client.
func (w *recorder) NoteError(err error) { w.err = err }

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *recorder) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
