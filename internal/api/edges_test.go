package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/openapitest"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// edgeRuntime is a core runtime whose sandboxes start at once and whose
// snapshots are captured at once: enough for the API's edges.
type edgeRuntime struct{}

func (edgeRuntime) StartSandbox(context.Context, core.Sandbox, core.Progress) (core.Placement, error) {
	return core.Placement{Driver: "fake", Instance: "i"}, nil
}
func (edgeRuntime) StopSandbox(context.Context, string) error               { return nil }
func (edgeRuntime) AdoptSandbox(context.Context, core.Sandbox) error        { return nil }
func (edgeRuntime) Sweep(context.Context, map[string]bool) error            { return nil }
func (edgeRuntime) CollectSnapshots(context.Context, []string) (any, error) { return nil, nil }
func (edgeRuntime) HasTemplate(_ context.Context, name string) error {
	if name == "minimal" {
		return nil
	}
	return core.ErrNotFound
}
func (edgeRuntime) CaptureSnapshot(context.Context, string, []string) (string, core.SnapshotStats, error) {
	return "sha256:manifest", core.SnapshotStats{}, nil
}
func (r edgeRuntime) StartSandboxFromSnapshot(ctx context.Context, sb core.Sandbox, _ []string, p core.Progress) (core.Placement, error) {
	return r.StartSandbox(ctx, sb, p)
}

// edgeTemplates builds nothing; it counts the builds it was asked for.
// The embedded interface makes it a TemplateAdmin (the methods not
// defined here are never reached by these tests).
type edgeTemplates struct {
	TemplateAdmin
	mu     sync.Mutex
	builds int
}

func (t *edgeTemplates) ListTemplates(context.Context) ([]core.TemplateInfo, error) {
	return []core.TemplateInfo{{Name: "minimal", Public: true}}, nil
}
func (t *edgeTemplates) GetTemplate(_ context.Context, name string) (core.TemplateInfo, error) {
	if name == "minimal" {
		return core.TemplateInfo{Name: "minimal", Public: true}, nil
	}
	return core.TemplateInfo{}, core.ErrNotFound
}
func (t *edgeTemplates) BuildTemplate(_ context.Context, req core.TemplateBuildRequest, _ core.Progress) (core.TemplateInfo, error) {
	t.mu.Lock()
	t.builds++
	t.mu.Unlock()
	return core.TemplateInfo{Name: req.Name}, nil
}
func (t *edgeTemplates) ValidateBuildfile([]byte) error { return nil }
func (t *edgeTemplates) ExtractContext(_ context.Context, r io.Reader, _ string) error {
	_, err := io.Copy(io.Discard, r)
	return err
}
func (t *edgeTemplates) BuildFromFile(context.Context, BuildfileRequest, core.Progress) (any, error) {
	t.mu.Lock()
	t.builds++
	t.mu.Unlock()
	return nil, nil
}
func (t *edgeTemplates) DeleteTemplate(context.Context, string) error { return core.ErrNotFound }
func (t *edgeTemplates) AliasTemplate(context.Context, string, string) (core.TemplateInfo, error) {
	return core.TemplateInfo{}, core.ErrNotFound
}

func (t *edgeTemplates) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.builds
}

type edgeEnv struct {
	url, key  string
	store     core.Store
	templates *edgeTemplates
}

// newEdgeEnv serves the control API on loopback, as space server does
// (httpx.Limits, httpx.Listener), on a SQLite store, without egress.
func newEdgeEnv(t *testing.T) *edgeEnv {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	broker := core.NewBroker(st, time.Now)
	engine := core.NewEngine(ctx, st, broker, time.Now, t.Logf)
	svc := core.NewService(st, engine, broker, edgeRuntime{}, core.ServiceOptions{NodeName: "local"})
	keys := auth.NewKeys(st, time.Now)
	sessions, err := auth.NewSessions(ctx, st, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := keys.Create(ctx, "p1", "edges")
	if err != nil {
		t.Fatal(err)
	}
	tpl := &edgeTemplates{}
	h := New(Options{Service: svc, Engine: engine, Broker: broker, Keys: keys, Sessions: sessions, Templates: tpl,
		Store: st, DataURL: "http://127.0.0.1:1", SessionTTL: time.Hour, Logf: t.Logf})
	srv := httptest.NewUnstartedServer(httpx.Limits(h))
	srv.Config.MaxHeaderBytes = httpx.ServerMaxHeaderBytes
	srv.Listener = httpx.Listener(srv.Listener)
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		engine.Shutdown(context.Background())
		st.Close()
	})
	return &edgeEnv{url: srv.URL, key: key, store: st, templates: tpl}
}

type answer struct {
	status int
	code   string
	body   []byte
}

// do sends a request; ct "" sends no Content-Type.
func (e *edgeEnv) do(t *testing.T, method, path, ct string, body []byte, hdr ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == nil {
		req.Body, req.ContentLength = nil, 0
	}
	req.Header.Set("X-API-Key", e.key)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: b}
	if resp.StatusCode >= 400 {
		var env struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(b, &env); err != nil || env.Error.Code == "" || env.Error.Message == "" {
			t.Fatalf("%s %s: %d is not the JSON error envelope: %q", method, path, resp.StatusCode, b)
		}
		if resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s %s: %d with Content-Type %q", method, path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		a.code = env.Error.Code
	}
	return a
}

// expect checks an answer and that the route documents its status.
func (e *edgeEnv) expect(t *testing.T, route string, a answer, status int, code string) {
	t.Helper()
	if a.status != status || a.code != code {
		t.Errorf("%s: %d %s (%s), want %d %s", route, a.status, a.code, a.body, status, code)
	}
	method, pattern, _ := strings.Cut(route, " ")
	if !openapitest.Documents(OpenAPI(), method, pattern, a.status) {
		t.Errorf("%s answered %d, which openapi.json does not document for it", route, a.status)
	}
}

func (e *edgeEnv) createSandbox(t *testing.T) string {
	t.Helper()
	a := e.do(t, "POST", "/v1/sandboxes", "application/json", []byte(`{"template":"minimal"}`))
	if a.status != 202 {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	var out struct {
		Sandbox   core.Sandbox
		Operation core.Operation
	}
	json.Unmarshal(a.body, &out)
	e.wait(t, out.Operation.ID)
	return out.Sandbox.ID
}

func (e *edgeEnv) wait(t *testing.T, opID string) core.Operation {
	t.Helper()
	a := e.do(t, "GET", "/v1/operations/"+opID+"?wait=10s", "", nil)
	var op core.Operation
	json.Unmarshal(a.body, &op)
	if op.State != core.OpSucceeded {
		t.Fatalf("operation %s: %d %s", opID, a.status, a.body)
	}
	return op
}

func multipartBody(t *testing.T, parts map[string]string) (string, []byte) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, name := range []string{"buildfile", "context"} {
		if v, ok := parts[name]; ok {
			w, _ := mw.CreateFormFile(name, name)
			io.WriteString(w, v)
		}
	}
	mw.Close()
	return mw.FormDataContentType(), b.Bytes()
}

func TestContentTypesEnforced(t *testing.T) {
	e := newEdgeEnv(t)
	sbx := e.createSandbox(t)
	create := []byte(`{"template":"minimal"}`)
	r := "POST /v1/sandboxes"
	e.expect(t, r, e.do(t, "POST", "/v1/sandboxes", "text/plain", create), 415, "unsupported_media_type")
	e.expect(t, r, e.do(t, "POST", "/v1/sandboxes", "application/x-www-form-urlencoded", create), 415, "unsupported_media_type")
	e.expect(t, r, e.do(t, "POST", "/v1/sandboxes", "multipart/form-data; boundary=x", create), 415, "unsupported_media_type")
	e.expect(t, r, e.do(t, "POST", "/v1/sandboxes", "application/json; charset=utf-8", create), 202, "")
	e.expect(t, r, e.do(t, "POST", "/v1/sandboxes", "", create), 202, "") // no Content-Type: JSON
	e.expect(t, "POST /v1/sandboxes/{id}/timeout", e.do(t, "POST", "/v1/sandboxes/"+sbx+"/timeout", "text/plain", []byte(`{"timeout_seconds":60}`)), 415, "unsupported_media_type")
	e.expect(t, "PUT /v1/sandboxes/{id}/network", e.do(t, "PUT", "/v1/sandboxes/"+sbx+"/network", "text/xml", []byte(`{"mode":"blocked"}`)), 415, "unsupported_media_type")
	e.expect(t, "POST /v1/keys", e.do(t, "POST", "/v1/keys", "text/plain", []byte(`{"name":"x"}`)), 415, "unsupported_media_type")
	// A route without a request body does not look at Content-Type.
	e.expect(t, "POST /v1/sandboxes/{id}/session", e.do(t, "POST", "/v1/sandboxes/"+sbx+"/session", "text/plain", []byte("ignored")), 200, "")

	// The multipart build takes multipart/form-data only.
	ct, body := multipartBody(t, map[string]string{"buildfile": "FROM minimal\n"})
	e.expect(t, "POST /v1/templates/build", e.do(t, "POST", "/v1/templates/build?name=mp", "application/json", body), 415, "unsupported_media_type")
	e.expect(t, "POST /v1/templates/build", e.do(t, "POST", "/v1/templates/build?name=mp", "", body), 415, "unsupported_media_type")
	e.expect(t, "POST /v1/templates/build", e.do(t, "POST", "/v1/templates/build?name=mp", ct, body), 202, "")

	// The upload takes the archive as tar, gzip or octet-stream (or no type).
	for _, ok := range []string{"application/x-tar", "application/gzip", "application/octet-stream", ""} {
		e.expect(t, "POST /v1/templates/upload", e.do(t, "POST", "/v1/templates/upload?name=up", ok, []byte("tar bytes "+ok)), 202, "")
	}
	for _, bad := range []string{"application/json", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded"} {
		e.expect(t, "POST /v1/templates/upload", e.do(t, "POST", "/v1/templates/upload?name=up", bad, []byte("tar")), 415, "unsupported_media_type")
	}
	a := e.do(t, "POST", "/v1/templates", "application/x-www-form-urlencoded", []byte(`{"name":"x","source":"busybox"}`))
	if a.status != 415 || !bytes.Contains(a.body, []byte("Content-Type: application/json")) {
		t.Errorf("form-encoded JSON: %d %s; want 415 with a hint", a.status, a.body)
	}
}

func TestOversizeRequestsAnswerJSON(t *testing.T) {
	e := newEdgeEnv(t)
	e.expect(t, "GET /v1/sandboxes", e.do(t, "GET", "/v1/sandboxes?state=running&x="+strings.Repeat("a", httpx.MaxURIBytes), "", nil), 414, "uri_too_long")
	e.expect(t, "GET /v1/sandboxes", e.do(t, "GET", "/v1/sandboxes", "", nil, "X-Big", strings.Repeat("b", httpx.MaxHeaderBytes)), 431, "header_too_large")
	// Past net/http's own limit: its plain-text 431, rewritten.
	a := e.do(t, "GET", "/v1/sandboxes", "", nil, "X-Huge", strings.Repeat("c", 2*httpx.ServerMaxHeaderBytes))
	e.expect(t, "GET /v1/sandboxes", a, 431, "header_too_large")
}

func TestNetworkPolicyWithoutEgress(t *testing.T) {
	e := newEdgeEnv(t)
	sbx := e.createSandbox(t)
	for _, body := range []string{
		`{"template":"minimal","network":{"mode":"open"}}`,
		`{"template":"minimal","network":{"mode":"allowlist","allow":["pypi.org"]}}`,
		`{"template":"minimal","network":{"mode":"blocked","credentials":["cred-0123456789abcdef"]}}`,
	} {
		a := e.do(t, "POST", "/v1/sandboxes", "application/json", []byte(body))
		e.expect(t, "POST /v1/sandboxes", a, 400, "egress_disabled")
		if !bytes.Contains(a.body, []byte("space server --egress")) {
			t.Errorf("%s: the message does not say how to get egress: %s", body, a.body)
		}
	}
	e.expect(t, "PUT /v1/sandboxes/{id}/network", e.do(t, "PUT", "/v1/sandboxes/"+sbx+"/network", "application/json", []byte(`{"mode":"open"}`)), 400, "egress_disabled")
	e.expect(t, "PUT /v1/sandboxes/{id}/network", e.do(t, "PUT", "/v1/sandboxes/"+sbx+"/network", "application/json", []byte(`{"mode":"blocked"}`)), 200, "")
	e.expect(t, "POST /v1/credentials", e.do(t, "POST", "/v1/credentials", "application/json",
		[]byte(`{"name":"gh","host":"api.github.com","header":"Authorization","value":"Bearer x"}`)), 400, "egress_disabled")
	e.expect(t, "GET /v1/credentials", e.do(t, "GET", "/v1/credentials", "", nil), 400, "egress_disabled")
	e.expect(t, "DELETE /v1/credentials/{id}", e.do(t, "DELETE", "/v1/credentials/cred-0123456789abcdef", "", nil), 400, "egress_disabled")
}

func TestEmptyTemplateNames(t *testing.T) {
	e := newEdgeEnv(t)
	ct, body := multipartBody(t, map[string]string{"buildfile": "FROM minimal\n"})
	cases := []struct {
		route, method, path, ct string
		body                    []byte
	}{
		{"POST /v1/templates", "POST", "/v1/templates", "application/json", []byte(`{"name":"","source":"busybox"}`)},
		{"POST /v1/templates", "POST", "/v1/templates", "application/json", []byte(`{"name":" ","source":"busybox"}`)},
		{"POST /v1/templates/upload", "POST", "/v1/templates/upload?name=", "application/x-tar", []byte("tar")},
		{"POST /v1/templates/upload", "POST", "/v1/templates/upload", "application/x-tar", []byte("tar")},
		{"POST /v1/templates/build", "POST", "/v1/templates/build?name=", ct, body},
		{"POST /v1/templates/build", "POST", "/v1/templates/build?name=%20", ct, body},
		{"POST /v1/templates/{name}/alias", "POST", "/v1/templates/minimal/alias", "application/json", []byte(`{"alias":""}`)},
		{"POST /v1/templates/{name}/alias", "POST", "/v1/templates/%20/alias", "application/json", []byte(`{"alias":"x"}`)},
		{"DELETE /v1/templates/{name}", "DELETE", "/v1/templates/%20", "", nil},
		{"GET /v1/templates/{name}", "GET", "/v1/templates/%20", "", nil},
	}
	for _, c := range cases {
		if a := e.do(t, c.method, c.path, c.ct, c.body); a.status != 400 || a.code != "invalid_argument" {
			t.Errorf("%s %s: %d %s (%s), want 400 invalid_argument", c.method, c.path, a.status, a.code, a.body)
		} else {
			e.expect(t, c.route, a, 400, "invalid_argument")
		}
	}
	if n := e.templates.count(); n != 0 {
		t.Fatalf("%d builds started", n)
	}
}

func TestIdempotencyKeyReuse(t *testing.T) {
	e := newEdgeEnv(t)
	post := func(route, path, ct string, body []byte, key string) answer {
		t.Helper()
		return e.do(t, "POST", path, ct, body, "Idempotency-Key", key)
	}
	opID := func(a answer) string {
		var out struct{ Operation core.Operation }
		json.Unmarshal(a.body, &out)
		return out.Operation.ID
	}
	// Sandbox create: the same body replays (whatever its JSON spelling),
	// another body is 422 and creates nothing.
	r := "POST /v1/sandboxes"
	first := post(r, "/v1/sandboxes", "application/json", []byte(`{"template":"minimal","metadata":{"a":"1","b":"2"}}`), "k-create")
	e.expect(t, r, first, 202, "")
	again := post(r, "/v1/sandboxes", "application/json", []byte(`{ "metadata":{"b":"2","a":"1"}, "template":"minimal" }`), "k-create")
	e.expect(t, r, again, 202, "")
	if opID(again) != opID(first) {
		t.Fatalf("the same request with the same key made a new operation: %s %s", opID(first), opID(again))
	}
	e.expect(t, r, post(r, "/v1/sandboxes", "application/json", []byte(`{"template":"minimal","metadata":{"a":"other"}}`), "k-create"), 422, "idempotency_key_reused")
	list, _ := e.store.ListSandboxes(context.Background(), core.SandboxFilter{ProjectID: "p1"})
	if len(list) != 1 {
		t.Fatalf("%d sandboxes, want 1", len(list))
	}
	sbx := list[0].ID
	e.wait(t, opID(first))

	// Another route with the same key is another request.
	e.expect(t, "POST /v1/sandboxes/{id}/snapshots", post("", "/v1/sandboxes/"+sbx+"/snapshots", "", nil, "k-create"), 422, "idempotency_key_reused")

	// Snapshot, then fork: count and body are the request.
	r = "POST /v1/sandboxes/{id}/snapshots"
	snapA := post(r, "/v1/sandboxes/"+sbx+"/snapshots", "", nil, "k-snap")
	e.expect(t, r, snapA, 202, "")
	e.expect(t, r, post(r, "/v1/sandboxes/"+sbx+"/snapshots", "", nil, "k-snap"), 202, "")
	e.wait(t, opID(snapA))
	var snap struct{ Snapshot core.Snapshot }
	json.Unmarshal(snapA.body, &snap)
	r = "POST /v1/snapshots/{id}/fork"
	fork := func(body string) answer {
		return post(r, "/v1/snapshots/"+snap.Snapshot.ID+"/fork", "application/json", []byte(body), "k-fork")
	}
	f1 := fork(`{"count":2,"metadata":{"f":"1"}}`)
	e.expect(t, r, f1, 202, "")
	f2 := fork(`{"metadata":{"f":"1"},"count":2}`)
	e.expect(t, r, f2, 202, "")
	if !bytes.Equal(forkIDs(f1.body), forkIDs(f2.body)) {
		t.Fatalf("fork replay made other sandboxes: %s vs %s", forkIDs(f1.body), forkIDs(f2.body))
	}
	e.expect(t, r, fork(`{"count":3,"metadata":{"f":"1"}}`), 422, "idempotency_key_reused")
	e.expect(t, r, fork(`{"count":2,"metadata":{"f":"2"}}`), 422, "idempotency_key_reused")

	// Template builds (JSON), uploads and build files.
	r = "POST /v1/templates"
	e.expect(t, r, post(r, "/v1/templates", "application/json", []byte(`{"name":"t1","source":"busybox"}`), "k-build"), 202, "")
	e.expect(t, r, post(r, "/v1/templates", "application/json", []byte(`{"name":"t1","source":"busybox"}`), "k-build"), 202, "")
	e.expect(t, r, post(r, "/v1/templates", "application/json", []byte(`{"name":"t2","source":"busybox"}`), "k-build"), 422, "idempotency_key_reused")
	r = "POST /v1/templates/upload"
	e.expect(t, r, post(r, "/v1/templates/upload?name=u1", "application/x-tar", []byte("archive one"), "k-upload"), 202, "")
	e.expect(t, r, post(r, "/v1/templates/upload?name=u1", "application/x-tar", []byte("archive one"), "k-upload"), 202, "")
	e.expect(t, r, post(r, "/v1/templates/upload?name=u1", "application/x-tar", []byte("archive two"), "k-upload"), 422, "idempotency_key_reused")
	e.expect(t, r, post(r, "/v1/templates/upload?name=u2", "application/x-tar", []byte("archive one"), "k-upload"), 422, "idempotency_key_reused")
	r = "POST /v1/templates/build"
	ct1, b1 := multipartBody(t, map[string]string{"buildfile": "FROM minimal\n", "context": "ctx one"})
	ct2, b2 := multipartBody(t, map[string]string{"buildfile": "FROM minimal\n", "context": "ctx one"}) // another boundary
	ct3, b3 := multipartBody(t, map[string]string{"buildfile": "FROM minimal\n", "context": "ctx two"})
	e.expect(t, r, post(r, "/v1/templates/build?name=b1", ct1, b1, "k-file"), 202, "")
	e.expect(t, r, post(r, "/v1/templates/build?name=b1", ct2, b2, "k-file"), 202, "")
	e.expect(t, r, post(r, "/v1/templates/build?name=b1", ct3, b3, "k-file"), 422, "idempotency_key_reused")
	deadline := time.Now().Add(10 * time.Second)
	for e.templates.count() != 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := e.templates.count(); n != 3 {
		t.Fatalf("%d template builds ran, want 3 (one per key)", n)
	}
}

func forkIDs(body []byte) []byte {
	var out struct {
		Sandboxes []struct{ Sandbox core.Sandbox }
	}
	json.Unmarshal(body, &out)
	var ids []string
	for _, s := range out.Sandboxes {
		ids = append(ids, s.Sandbox.ID)
	}
	return []byte(strings.Join(ids, ","))
}
