package integration

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/dataplane"
	"github.com/space-sandbox/space/internal/openapitest"
)

// edgeAnswer is one raw answer: status, error code ("" if none) and body.
type edgeAnswer struct {
	status int
	code   string
	body   []byte
}

// rawCall sends body with exactly the headers given (no Content-Type
// unless hdr has one) and requires the JSON error envelope on errors.
func rawCall(t *testing.T, method, url string, hdr map[string]string, body []byte) edgeAnswer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := httpc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := edgeAnswer{status: resp.StatusCode, body: b}
	if resp.StatusCode >= 400 {
		var env struct {
			Error struct{ Code, Message string }
			Code  int // E2B's shape
		}
		if err := json.Unmarshal(b, &env); err != nil || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s %s: %d is not JSON (%q): %.300q", method, url, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		a.code = env.Error.Code
	}
	return a
}

// TestAPIEdges drives a real server over loopback: media types, oversize
// requests on both listeners, network policies without --egress and
// reused idempotency keys; every answer of a native route must be
// documented for that route.
func TestAPIEdges(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	key := map[string]string{"X-API-Key": e.key}
	with := func(h map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range h {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	check := func(doc []byte, route string, a edgeAnswer, status int, code string) {
		t.Helper()
		if a.status != status || a.code != code {
			t.Errorf("%s: %d %s %.300s, want %d %s", route, a.status, a.code, a.body, status, code)
		}
		method, pattern, _ := strings.Cut(route, " ")
		if !openapitest.Documents(doc, method, pattern, a.status) {
			t.Errorf("%s answered %d, which its OpenAPI document does not list", route, a.status)
		}
	}
	ctl := func(route string, a edgeAnswer, status int, code string) {
		t.Helper()
		check(api.OpenAPI(), route, a, status, code)
	}
	data := func(route string, a edgeAnswer, status int, code string) {
		t.Helper()
		check(dataplane.OpenAPI(), route, a, status, code)
	}
	tok := map[string]string{"Authorization": "Bearer " + sb.Token}
	dpURL := sb.Data + "/v1/sandboxes/" + sb.ID

	// Media types.
	ctl("POST /v1/sandboxes", rawCall(t, "POST", e.Ctrl+"/v1/sandboxes", with(key, "Content-Type", "text/plain"), []byte(`{"template":"minimal"}`)), 415, "unsupported_media_type")
	ctl("POST /v1/templates/build", rawCall(t, "POST", e.Ctrl+"/v1/templates/build?name=x", with(key, "Content-Type", "application/json"), []byte(`{}`)), 415, "unsupported_media_type")
	data("POST /v1/sandboxes/{id}/commands", rawCall(t, "POST", dpURL+"/commands", with(tok, "Content-Type", "application/x-www-form-urlencoded"), []byte(`{"argv":["true"]}`)), 415, "unsupported_media_type")
	data("PUT /v1/sandboxes/{id}/files", rawCall(t, "PUT", dpURL+"/files?path=/tmp/x", with(tok, "Content-Type", "multipart/form-data; boundary=b"), []byte("--b--")), 415, "unsupported_media_type")
	data("PUT /v1/sandboxes/{id}/files", rawCall(t, "PUT", dpURL+"/files?path=/tmp/x.py", with(tok, "Content-Type", "text/x-python"), []byte("print(1)\n")), 204, "")
	data("PUT /v1/sandboxes/{id}/files", rawCall(t, "PUT", dpURL+"/files?path=/tmp/y", tok, []byte("no type")), 204, "")

	// Oversize URIs and headers, on both listeners.
	long := strings.Repeat("a", 20<<10)
	big := strings.Repeat("b", 100<<10)
	huge := strings.Repeat("c", 600<<10)
	ctl("GET /v1/sandboxes", rawCall(t, "GET", e.Ctrl+"/v1/sandboxes?x="+long, key, nil), 414, "uri_too_long")
	ctl("GET /v1/sandboxes", rawCall(t, "GET", e.Ctrl+"/v1/sandboxes", with(key, "X-Big", big), nil), 431, "header_too_large")
	ctl("GET /v1/sandboxes", rawCall(t, "GET", e.Ctrl+"/v1/sandboxes", with(key, "X-Huge", huge), nil), 431, "header_too_large")
	data("GET /v1/sandboxes/{id}/files/stat", rawCall(t, "GET", dpURL+"/files/stat?path=/"+long, tok, nil), 414, "uri_too_long")
	data("GET /v1/sandboxes/{id}/files/stat", rawCall(t, "GET", dpURL+"/files/stat?path=/", with(tok, "X-Big", big), nil), 431, "header_too_large")
	data("GET /v1/sandboxes/{id}/files/stat", rawCall(t, "GET", dpURL+"/files/stat?path=/", with(tok, "X-Huge", huge), nil), 431, "header_too_large")

	// A network policy on a server without --egress says so.
	jsonKey := with(key, "Content-Type", "application/json")
	a := rawCall(t, "POST", e.Ctrl+"/v1/sandboxes", jsonKey, []byte(`{"template":"minimal","network":{"mode":"open"}}`))
	ctl("POST /v1/sandboxes", a, 400, "egress_disabled")
	if !bytes.Contains(a.body, []byte("--egress")) {
		t.Errorf("egress_disabled does not name --egress: %s", a.body)
	}
	ctl("PUT /v1/sandboxes/{id}/network", rawCall(t, "PUT", e.Ctrl+"/v1/sandboxes/"+sb.ID+"/network", jsonKey, []byte(`{"mode":"allowlist","allow":["pypi.org"]}`)), 400, "egress_disabled")
	ctl("GET /v1/credentials", rawCall(t, "GET", e.Ctrl+"/v1/credentials", key, nil), 400, "egress_disabled")

	// An Idempotency-Key names one request.
	idem := with(jsonKey, "Idempotency-Key", "edges-1")
	first := rawCall(t, "POST", e.Ctrl+"/v1/sandboxes", idem, []byte(`{"template":"minimal","metadata":{"edge":"1"}}`))
	ctl("POST /v1/sandboxes", first, 202, "")
	var created struct {
		Sandbox   struct{ ID string }
		Operation struct{ ID string }
	}
	json.Unmarshal(first.body, &created)
	again := rawCall(t, "POST", e.Ctrl+"/v1/sandboxes", idem, []byte(`{"metadata":{"edge":"1"},"template":"minimal"}`))
	ctl("POST /v1/sandboxes", again, 202, "")
	if !bytes.Contains(again.body, []byte(created.Operation.ID)) {
		t.Errorf("replay did not return operation %s: %s", created.Operation.ID, again.body)
	}
	ctl("POST /v1/sandboxes", rawCall(t, "POST", e.Ctrl+"/v1/sandboxes", idem, []byte(`{"template":"minimal","metadata":{"edge":"2"}}`)), 422, "idempotency_key_reused")
	e.waitOp(t, created.Operation.ID)
	(&sandbox{e: e, ID: created.Sandbox.ID}).delete(t)

	// The E2B API: JSON or no Content-Type, as the SDKs send; 415 otherwise.
	e2b := rawCall(t, "POST", e.Ctrl+"/sandboxes", with(key, "Content-Type", "text/plain"), []byte(`{"templateID":"minimal"}`))
	if e2b.status != 415 || !bytes.Contains(e2b.body, []byte(`"code":415`)) {
		t.Errorf("E2B create with text/plain: %d %s", e2b.status, e2b.body)
	}
	for _, h := range []map[string]string{jsonKey, key} {
		a := rawCall(t, "POST", e.Ctrl+"/sandboxes", h, []byte(`{"templateID":"minimal","timeout":60}`))
		if a.status != 201 {
			t.Errorf("E2B create (Content-Type %q): %d %s", h["Content-Type"], a.status, a.body)
			continue
		}
		var out struct{ SandboxID string }
		json.Unmarshal(a.body, &out)
		if k := rawCall(t, "DELETE", e.Ctrl+"/sandboxes/"+out.SandboxID, key, nil); k.status != 204 {
			t.Errorf("E2B kill: %d %s", k.status, k.body)
		}
	}
}
