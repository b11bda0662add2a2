package dataplane

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/openapitest"
)

// TestContentTypes: the media types of data-plane request bodies are
// checked (before the session token) as openapi.json documents them. The
// requests carry no token, so an accepted media type answers 401.
func TestContentTypes(t *testing.T) {
	srv := httptest.NewServer(httpx.Limits(New(Options{})))
	defer srv.Close()
	const sb = "/v1/sandboxes/sbx-0123456789abcdef"
	cases := []struct {
		route, method, path, ct string
		want                    int
	}{
		{"POST /v1/sandboxes/{id}/commands", "POST", sb + "/commands", "application/json", 401},
		{"POST /v1/sandboxes/{id}/commands", "POST", sb + "/commands", "", 401},
		{"POST /v1/sandboxes/{id}/commands", "POST", sb + "/commands", "text/plain", 415},
		{"POST /v1/sandboxes/{id}/commands", "POST", sb + "/commands", "application/x-www-form-urlencoded", 415},
		{"POST /v1/sandboxes/{id}/files/mkdir", "POST", sb + "/files/mkdir", "text/plain", 415},
		{"POST /v1/sandboxes/{id}/commands/{cid}/signal", "POST", sb + "/commands/1/signal", "text/plain", 415},
		// File and stdin bodies are bytes of any media type but multipart.
		{"PUT /v1/sandboxes/{id}/files", "PUT", sb + "/files?path=/x", "application/octet-stream", 401},
		{"PUT /v1/sandboxes/{id}/files", "PUT", sb + "/files?path=/x", "application/x-www-form-urlencoded", 401},
		{"PUT /v1/sandboxes/{id}/files", "PUT", sb + "/files?path=/x", "text/x-python", 401},
		{"PUT /v1/sandboxes/{id}/files", "PUT", sb + "/files?path=/x", "", 401},
		{"PUT /v1/sandboxes/{id}/files", "PUT", sb + "/files?path=/x", "multipart/form-data; boundary=b", 415},
		{"POST /v1/sandboxes/{id}/commands/{cid}/stdin", "POST", sb + "/commands/1/stdin", "text/plain", 401},
		{"POST /v1/sandboxes/{id}/commands/{cid}/stdin", "POST", sb + "/commands/1/stdin", "multipart/form-data; boundary=b", 415},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, bytes.NewReader([]byte(`{"argv":["true"]}`)))
		if c.ct != "" {
			req.Header.Set("Content-Type", c.ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %q: %d %q, want %d with JSON", c.route, c.ct, resp.StatusCode, resp.Header.Get("Content-Type"), c.want)
		}
		method, pattern, _ := strings.Cut(c.route, " ")
		if !openapitest.Documents(OpenAPI(), method, pattern, resp.StatusCode) {
			t.Errorf("%s: %d is not documented for the route", c.route, resp.StatusCode)
		}
	}
}
