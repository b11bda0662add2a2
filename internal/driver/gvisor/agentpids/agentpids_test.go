package agentpids

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseMax(t *testing.T) {
	for in, want := range map[string]int64{"64": 64, " 7\n": 7, "max": 0} {
		if got, err := ParseMax(in); err != nil || got != want {
			t.Errorf("ParseMax(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "x", "1e3"} {
		if _, err := ParseMax(in); err == nil {
			t.Errorf("ParseMax(%q) succeeded", in)
		}
	}
}

func TestHandlerWithoutGroup(t *testing.T) {
	var g *Group
	h := g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	for path, want := range map[string]int{Path: http.StatusNotImplemented, KillPath: http.StatusNotImplemented, "/v1/other": http.StatusTeapot} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPut, path, strings.NewReader("64")))
		if w.Code != want {
			t.Errorf("PUT %s: %d, want %d", path, w.Code, want)
		}
	}
}

func TestSetupNotCgroup2(t *testing.T) {
	if _, err := Setup(t.TempDir()); err == nil {
		t.Error("Setup on a plain directory succeeded")
	}
}
