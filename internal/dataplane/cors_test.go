package dataplane

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A browser page on another origin (the web console) can call the data
// plane with its session token: preflights are answered, answers are
// readable, and nothing invites credentials.
func TestCORS(t *testing.T) {
	s := New(Options{})
	pre := httptest.NewRequest("OPTIONS", "/v1/sandboxes/sbx-0123456789abcdef/commands/1/stdin", nil)
	pre.Header.Set("Origin", "http://127.0.0.1:7070")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	pre.Header.Set("Access-Control-Request-Headers", "authorization,content-type")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, pre)
	h := w.Header()
	if w.Code != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("preflight: %d %v", w.Code, h)
	}
	for _, want := range []string{"Authorization", "X-Access-Token", "Content-Type", "Last-Event-ID"} {
		if !strings.Contains(h.Get("Access-Control-Allow-Headers"), want) {
			t.Errorf("Allow-Headers %q lacks %s", h.Get("Access-Control-Allow-Headers"), want)
		}
	}
	for _, m := range []string{"GET", "POST", "PUT", "DELETE"} {
		if !strings.Contains(h.Get("Access-Control-Allow-Methods"), m) {
			t.Errorf("Allow-Methods %q lacks %s", h.Get("Access-Control-Allow-Methods"), m)
		}
	}
	if h.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("credentials allowed: %v", h)
	}

	// The actual request: the error envelope is readable by the page.
	r := httptest.NewRequest("GET", "/v1/sandboxes/sbx-0123456789abcdef/commands", nil)
	r.Header.Set("Origin", "http://127.0.0.1:7070")
	w = httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized || w.Header().Get("Access-Control-Allow-Origin") != "*" || !strings.Contains(w.Header().Get("Access-Control-Expose-Headers"), "X-Request-Id") {
		t.Fatalf("GET with Origin: %d %v", w.Code, w.Header())
	}

	// Without an Origin (SDKs, curl) nothing changes; an OPTIONS that is
	// not a preflight is not a route.
	r = httptest.NewRequest("OPTIONS", "/v1/sandboxes/sbx-0123456789abcdef/commands", nil)
	w = httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Header().Get("Access-Control-Allow-Origin") != "" || w.Code == http.StatusNoContent {
		t.Fatalf("OPTIONS without Origin: %d %v", w.Code, w.Header())
	}
}
