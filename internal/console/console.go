// Package console serves the web console: a single-page app under /ui/ on
// the control listener, built from web/console (scripts/console.sh) into
// dist/ and embedded here, so a plain `go build` ships it. The console
// uses only the public APIs the SDKs use: the control API on this same
// origin with an API key the browser keeps in sessionStorage, and the data
// plane (a session's data_url, another origin) with session tokens. This
// package adds no API: it serves static files with a strict
// Content-Security-Policy.
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/httpx"
)

//go:embed dist
var dist embed.FS

// Prefix is where the console is served.
const Prefix = "/ui/"

// Options configure the console.
type Options struct {
	// DataURLs returns the base URLs of the data planes the console's
	// sandboxes are served by (a session's data_url): the single server's
	// own, or every node's with --remote-nodes. Their origins join 'self'
	// in the connect-src of the Content-Security-Policy. Called at most
	// every few seconds.
	DataURLs func() []string
}

type file struct {
	body  []byte
	etag  string
	ctype string
}

// Handler serves the console under Prefix.
type Handler struct {
	o     Options
	files map[string]file

	mu      sync.Mutex
	csp     string
	cspTime time.Time
}

// New returns the console's handler.
func New(o Options) *Handler {
	h := &Handler{o: o, files: map[string]file{}}
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err)
	}
	err = fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(sub, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		h.files[p] = file{body: b, etag: `"` + hex.EncodeToString(sum[:12]) + `"`, ctype: contentType(p)}
		return nil
	})
	if err != nil {
		panic(err) // the embedded tree
	}
	return h
}

func contentType(p string) string {
	switch path.Ext(p) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".png":
		return "image/png"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}

// Wrap serves the console under Prefix (and redirects / and /ui to it);
// every other request goes to next.
func (h *Handler) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case strings.HasPrefix(p, Prefix):
			h.ServeHTTP(w, r)
		case p == "/" || p == "/ui":
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				next.ServeHTTP(w, r)
				return
			}
			h.security(w)
			http.Redirect(w, r, Prefix, http.StatusFound)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// ServeHTTP serves one file of the console; the app routes in the URL's
// fragment, so only the files themselves exist.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.security(w)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		httpx.NotFound(w, r) // as the control API answers a method it does not route
		return
	}
	name := strings.TrimPrefix(r.URL.Path, Prefix)
	if name == "" {
		name = "index.html"
	}
	f, ok := h.files[name]
	if !ok {
		httpx.NotFound(w, r)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", f.ctype)
	hd.Set("ETag", f.etag)
	hd.Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.body))
}

// security sets the headers of every console response: the page may run
// only its own script, talk only to this origin and the data planes, and
// never be framed.
func (h *Handler) security(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", h.policy())
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
}

// cspTTL bounds how stale the data planes named in the policy may be.
const cspTTL = 5 * time.Second

func (h *Handler) policy() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.csp != "" && time.Since(h.cspTime) < cspTTL {
		return h.csp
	}
	var urls []string
	if h.o.DataURLs != nil {
		urls = h.o.DataURLs()
	}
	h.csp, h.cspTime = Policy(urls), time.Now()
	return h.csp
}

// Policy is the console's Content-Security-Policy for these data-plane
// URLs: scripts, styles, images and fonts from this origin only (the
// terminal emulator also sets inline styles, hence 'unsafe-inline' for
// styles and only styles), fetch to this origin and the data planes'
// origins, no frames, forms, plugins or <base>.
func Policy(dataURLs []string) string {
	connect := []string{"'self'"}
	seen := map[string]bool{}
	var origins []string
	for _, u := range dataURLs {
		if o := origin(u); o != "" && !seen[o] {
			seen[o] = true
			origins = append(origins, o)
		}
	}
	sort.Strings(origins)
	connect = append(connect, origins...)
	return strings.Join([]string{
		"default-src 'none'",
		"script-src 'self'",
		"style-src 'self' 'unsafe-inline'",
		"img-src 'self' data: blob:",
		"font-src 'self' data:",
		"connect-src " + strings.Join(connect, " "),
		"base-uri 'none'",
		"form-action 'none'",
		"frame-ancestors 'none'",
		"object-src 'none'",
	}, "; ")
}

// origin is scheme://host[:port] of an http(s) URL, "" for anything else
// (nothing that could widen the policy: no wildcards, no paths, no
// separators).
func origin(s string) string {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return ""
	}
	if strings.ContainsAny(u.Host, " ;,'\"*") {
		return ""
	}
	return u.Scheme + "://" + strings.ToLower(u.Host)
}
