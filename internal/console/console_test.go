package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func serve(h http.Handler, method, path string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestServesEmbeddedApp(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := New(Options{DataURLs: func() []string { return []string{"http://127.0.0.1:7071/", "http://127.0.0.1:7071"} }}).Wrap(next)

	for path, ctype := range map[string]string{"/ui/": "text/html", "/ui/index.html": "text/html", "/ui/app.js": "text/javascript", "/ui/app.css": "text/css"} {
		w := serve(h, "GET", path)
		if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), ctype) || w.Body.Len() == 0 {
			t.Fatalf("GET %s: %d %q (%d bytes)", path, w.Code, w.Header().Get("Content-Type"), w.Body.Len())
		}
		csp := w.Header().Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'none'", "script-src 'self';", "connect-src 'self' http://127.0.0.1:7071;", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: CSP %q lacks %q", path, csp, want)
			}
		}
		if strings.Contains(csp, "script-src 'self' 'unsafe") {
			t.Errorf("scripts must not be inline or eval'd: %q", csp)
		}
		if w.Header().Get("X-Frame-Options") != "DENY" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: headers %v", path, w.Header())
		}
		if etag := w.Header().Get("ETag"); etag == "" {
			t.Errorf("GET %s: no ETag", path)
		} else if w2 := serve(h, "GET", path, "If-None-Match", etag); w2.Code != http.StatusNotModified {
			t.Errorf("GET %s with its ETag: %d", path, w2.Code)
		}
	}
	// The page loads its script and style from files, never inline.
	idx := serve(h, "GET", "/ui/").Body.String()
	if !strings.Contains(idx, `<script src="app.js" defer></script>`) || strings.Count(idx, "<script") != 1 || strings.Contains(idx, "<style") {
		t.Errorf("index.html has inline script or style:\n%s", idx)
	}
	if w := serve(h, "GET", "/"); w.Code != http.StatusFound || w.Header().Get("Location") != "/ui/" {
		t.Errorf("GET /: %d %q", w.Code, w.Header().Get("Location"))
	}
	if w := serve(h, "GET", "/ui/nope.js"); w.Code != 404 || w.Header().Get("X-Frame-Options") != "DENY" {
		t.Errorf("GET /ui/nope.js: %d", w.Code)
	}
	if w := serve(h, "POST", "/ui/"); w.Code != 404 {
		t.Errorf("POST /ui/: %d", w.Code)
	}
	// Everything else is the API's.
	for _, p := range []string{"/v1/sandboxes", "/healthz", "/uix"} {
		if w := serve(h, "GET", p); w.Code != http.StatusTeapot {
			t.Errorf("GET %s: %d, want the next handler", p, w.Code)
		}
	}
	if w := serve(h, "POST", "/"); w.Code != http.StatusTeapot {
		t.Errorf("POST /: %d, want the next handler", w.Code)
	}
}

func TestPolicyOrigins(t *testing.T) {
	got := Policy([]string{"https://Data.example.com:8443/base/", "http://10.0.0.2:7071", "ftp://x", "http://a b", "javascript:alert(1)", "http://*.evil", "http://u:p@host:1", ""})
	want := "connect-src 'self' http://10.0.0.2:7071 https://data.example.com:8443;"
	if !strings.Contains(got, want) {
		t.Fatalf("policy %q lacks %q", got, want)
	}
}
