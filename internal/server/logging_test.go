package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Every route of both listeners names its own pattern in the access log:
// the tables register in one mux without a conflict, and a request finds
// the route it was served by.
func TestAccessRoutes(t *testing.T) {
	for name, routes := range map[string][]string{"control": controlRoutes(), "data": dataRoutes()} {
		mux := http.NewServeMux()
		for _, p := range routes {
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Errorf("%s route %q conflicts: %v", name, p, v)
					}
				}()
				mux.Handle(p, http.NotFoundHandler())
			}()
		}
	}
	mux := http.NewServeMux()
	for _, p := range controlRoutes() {
		mux.Handle(p, http.NotFoundHandler())
	}
	for path, want := range map[string]string{"/v1/sandboxes/sbx-1": "GET /v1/sandboxes/{id}", "/sandboxes/sbx-1": "GET /sandboxes/{id}", "/metrics": "GET /metrics"} {
		if _, got := mux.Handler(httptest.NewRequest("GET", path, nil)); got != want {
			t.Errorf("GET %s: pattern %q, want %q", path, got, want)
		}
	}
}
