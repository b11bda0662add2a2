package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
)

// Handler serves the registry in the Prometheus exposition formats (text
// 0.0.4, or what the scraper negotiates). A collector that fails (the
// store did not answer) leaves its series out and the rest is served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Serve serves /metrics on addr (the operator listener; no
// authentication: keep it on a private address) until ctx ends. It
// returns once the listener is open, with its address.
func (m *Metrics) Serve(ctx context.Context, wg *sync.WaitGroup, addr string, logf func(string, ...any)) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("metrics: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("/", httpx.NotFound)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 16 << 10}
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logf("metrics: serve %s: %v", ln.Addr(), err)
		}
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		srv.Close()
	}()
	return ln.Addr().String(), nil
}

// ControlAPI serves GET /metrics on the control API to admin keys only and
// passes every other request to next. A project key is refused (403, and
// an audit event), a request without a valid key gets 401.
func (m *Metrics) ControlAPI(next http.Handler, keys *auth.Keys, al *audit.Log) http.Handler {
	h := m.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			next.ServeHTTP(w, r)
			return
		}
		id := audit.RequestIDFrom(r.Header.Get("X-Request-Id"))
		w.Header().Set("X-Request-Id", id)
		ctx := audit.WithRequestID(r.Context(), id)
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			httpx.WriteError(w, httpx.Errorf(http.StatusMethodNotAllowed, "method_not_allowed", "%s /metrics: only GET", r.Method))
			return
		}
		key := r.Header.Get("X-API-Key")
		if a := r.Header.Get("Authorization"); key == "" && strings.HasPrefix(a, "Bearer ") {
			key = strings.TrimPrefix(a, "Bearer ")
		}
		if key == "" {
			httpx.WriteError(w, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "missing API key (X-API-Key or Authorization: Bearer)"))
			return
		}
		p, err := keys.Verify(ctx, key)
		switch {
		case errors.Is(err, core.ErrUnauthorized):
			httpx.WriteError(w, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "invalid API key"))
			return
		case err != nil:
			httpx.WriteError(w, err)
			return
		case !p.Admin:
			al.Record(ctx, audit.Event{Action: "GET /metrics", Outcome: "denied", ProjectID: p.ProjectID, KeyID: p.KeyID,
				Kind: "metrics", Reason: "metrics need an admin key"})
			httpx.WriteError(w, httpx.Errorf(http.StatusForbidden, "forbidden", "GET /metrics needs an admin key (space keys create --admin)"))
			return
		}
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// DataPlane counts a data-plane handler's requests by status class, the
// bytes of request and response bodies, and its streaming responses
// (space_dataplane_streams_open while they last).
func (m *Metrics) DataPlane(next http.Handler) http.Handler {
	in, out := m.dpBytes.WithLabelValues("in"), m.dpBytes.WithLabelValues("out")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &countingWriter{ResponseWriter: w, m: m, out: out}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &countingBody{ReadCloser: r.Body, add: in.Add}
		}
		defer func() {
			if cw.stream {
				m.dpStreamsOpen.Dec()
			}
			status := cw.status
			if status == 0 {
				status = http.StatusOK // nothing written: net/http answers 200
			}
			m.dpRequests.WithLabelValues(fmt.Sprintf("%dxx", status/100)).Inc()
		}()
		next.ServeHTTP(cw, r)
	})
}

type countingBody struct {
	io.ReadCloser
	add func(float64)
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.add(float64(n))
	}
	return n, err
}

// countingWriter is the data plane's ResponseWriter. Deadlines, flushes
// and hijacks reach the real one through Unwrap (http.ResponseController).
type countingWriter struct {
	http.ResponseWriter
	m      *Metrics
	out    interface{ Add(float64) }
	status int
	stream bool
}

// isStream reports whether a response of this Content-Type is a stream:
// SSE, the binary event frames, or a Connect/gRPC streaming RPC.
func isStream(ct string) bool {
	ct = strings.ToLower(ct)
	return strings.HasPrefix(ct, "text/event-stream") || strings.HasPrefix(ct, "application/x-space-events") ||
		strings.HasPrefix(ct, "application/connect+") || strings.HasPrefix(ct, "application/grpc")
}

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		if code < 300 && isStream(w.Header().Get("Content-Type")) {
			w.stream = true
			w.m.dpStreams.Inc()
			w.m.dpStreamsOpen.Inc()
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	if n > 0 {
		w.out.Add(float64(n))
	}
	return n, err
}

// Flush is for handlers that assert http.Flusher rather than use a
// ResponseController.
func (w *countingWriter) Flush() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the real ResponseWriter (for http.ResponseController).
func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
