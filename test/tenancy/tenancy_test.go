// Package tenancy checks that projects cannot touch each other. Against a
// real `space server` (namespace driver, egress gateway on, its own
// template directory) with two projects and an operator key, every route of
// the control API, the E2B API and the data plane is called as the wrong
// project; each must refuse (404, or 403 where the object is public), change
// nothing, and leave the right project working. The case table is checked
// against the servers' route tables, so a route added without a check
// fails here. It needs root.
package tenancy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/dataplane"
	"github.com/space-sandbox/space/internal/e2b"
	"github.com/space-sandbox/space/internal/openapitest"
	"github.com/space-sandbox/space/test/testenv"
)

// world is the server and project A's objects that B goes after.
type world struct {
	srv              *testenv.Server
	keyA, keyB, keyO string // project p1 (A), project p2 (B), operator (admin, project ops)
	sbA, sbB         sandbox
	snapA            string // A's snapshot
	opA              string // A's create operation
	buildA           string // A's template build operation
	tplA             string // A's private template (B later builds its own of that name)
	onlyA            string // a template name only A has
	keyAID           string // A's key id
	credA            string // A's credential
	digestA          string // A's template digest before the run
	route            string // the route whose case runs now ("control GET /v1/…")
}

type sandbox struct{ ID, Token, Data string }

func TestTenancy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, cgroups, nftables)")
	}
	w := setup(t)
	cases := routeCases()
	// The table covers exactly the routes the servers serve.
	var all []string
	for _, r := range api.Routes() {
		all = append(all, "control "+r)
	}
	for _, r := range e2b.Routes() {
		all = append(all, "e2b "+r)
	}
	for _, r := range dataplane.Routes() {
		all = append(all, "data "+r)
	}
	for _, r := range all {
		if _, ok := cases[r]; !ok {
			t.Errorf("route %q has no cross-project case: add one to routeCases", r)
		}
	}
	for r := range cases {
		if !slices.Contains(all, r) {
			t.Errorf("case %q names a route that is not served", r)
		}
	}
	before := w.stateOfA(t)
	for _, r := range all {
		c, ok := cases[r]
		if !ok {
			continue
		}
		w.route = r
		t.Run(r, func(t *testing.T) { c(t, w) })
	}
	if after := w.stateOfA(t); after != before {
		t.Errorf("project A's objects changed:\nbefore %s\nafter  %s", before, after)
	}
	t.Run("A still works", func(t *testing.T) { w.aStillWorks(t) })
	t.Run("resolution per project", func(t *testing.T) { w.resolution(t) })
	t.Run("admin", func(t *testing.T) { w.admin(t) })
	t.Run("audit log", func(t *testing.T) { w.auditLog(t) })
}

func setup(t *testing.T) *world {
	t.Helper()
	srv, err := testenv.New("space-tenancy-")
	if err != nil {
		t.Fatal(err)
	}
	// Its own template directory: this test builds and GCs templates.
	srv.TemplateDir = filepath.Join(srv.Work, "templates")
	srv.Args = []string{"--builtins", "minimal", "--egress", "--egress-dns", "127.0.0.1:53",
		"--egress-pool", "10.231.0.0/24", "--egress-if-prefix", "sptn", "--egress-table", "space-tenancy"}
	w := &world{srv: srv}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- server log (tail) ----\n%s", srv.LogTail(20000))
		}
		for _, k := range []string{w.keyA, w.keyB, w.keyO} {
			srv.DeleteSandboxes(k)
		}
		srv.Stop()
		srv.Remove()
	})
	if err := srv.Start(); err != nil {
		t.Fatalf("start: %v\n%s", err, srv.LogTail(4000))
	}
	for _, k := range []struct {
		dst     *string
		project string
		extra   []string
	}{{&w.keyA, "p1", nil}, {&w.keyB, "p2", nil}, {&w.keyO, "ops", []string{"--admin"}}} {
		if *k.dst, err = srv.CreateKey(k.project, k.extra...); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.WaitTemplate(w.keyA, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	w.tplA = fmt.Sprintf("priv-%d", time.Now().UnixNano()%1e9)
	w.buildA = w.buildFile(t, w.keyA, w.tplA, "FROM minimal\nUSER root\nRUN echo A > /owner\n", false, 202)
	if op := w.waitOp(t, w.keyA, w.buildA); op["state"] != "succeeded" {
		t.Fatalf("A's build: %v", op)
	}
	_, tpl := w.must(t, "GET", "/v1/templates/"+w.tplA, w.keyA, nil, 200)
	w.digestA = tpl["digest"].(string)
	if tpl["public"] != false || tpl["project"] != "p1" {
		t.Fatalf("A's template is not A's: %v", tpl)
	}
	w.onlyA = "only-" + w.tplA
	w.must(t, "POST", "/v1/templates/"+w.tplA+"/alias", w.keyA, map[string]any{"alias": w.onlyA}, 200)
	var opID string
	w.sbA, opID = w.create(t, w.keyA, w.tplA)
	w.opA = opID
	w.sbB, _ = w.create(t, w.keyB, "minimal")
	_, m := w.must(t, "POST", "/v1/sandboxes/"+w.sbA.ID+"/snapshots", w.keyA, map[string]any{}, 202)
	w.snapA = m["snapshot"].(map[string]any)["id"].(string)
	if op := w.waitOp(t, w.keyA, m["operation"].(map[string]any)["id"].(string)); op["state"] != "succeeded" {
		t.Fatalf("A's snapshot: %v", op)
	}
	_, m = w.must(t, "POST", "/v1/credentials", w.keyA, map[string]any{"name": "a", "secret": "s3cr3t-of-A", "host": "api.test"}, 201)
	w.credA = m["id"].(string)
	_, m = w.must(t, "GET", "/v1/keys", w.keyA, nil, 200)
	w.keyAID = m["keys"].([]any)[0].(map[string]any)["id"].(string)
	return w
}

// call does a control-API request with a key.
func (w *world) call(method, path, key string, body any) (int, map[string]any) {
	st, m, err := testenv.DoJSON(method, w.srv.Ctrl+path, map[string]string{"X-API-Key": key}, body)
	if err != nil {
		return -1, map[string]any{"transport_error": err.Error()}
	}
	return st, m
}

func (w *world) must(t *testing.T, method, path, key string, body any, want int) (int, map[string]any) {
	t.Helper()
	st, m := w.call(method, path, key, body)
	if st != want {
		t.Fatalf("%s %s: %d %v, want %d", method, path, st, m, want)
	}
	return st, m
}

func (w *world) waitOp(t *testing.T, key, id string) map[string]any {
	t.Helper()
	for i := 0; i < 20; i++ {
		_, m := w.must(t, "GET", "/v1/operations/"+id+"?wait=30s", key, nil, 200)
		if s := m["state"]; s == "succeeded" || s == "failed" || s == "cancelled" {
			return m
		}
	}
	t.Fatalf("operation %s not done", id)
	return nil
}

func (w *world) create(t *testing.T, key, tpl string) (sandbox, string) {
	t.Helper()
	_, m := w.must(t, "POST", "/v1/sandboxes", key, map[string]any{"template": tpl, "timeout_seconds": 900}, 202)
	sess := m["session"].(map[string]any)
	sb := sandbox{ID: m["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), Data: sess["data_url"].(string)}
	op := m["operation"].(map[string]any)["id"].(string)
	if done := w.waitOp(t, key, op); done["state"] != "succeeded" {
		t.Fatalf("create from %s: %v", tpl, done)
	}
	return sb, op
}

// buildFile starts a build-file build and returns its operation.
func (w *world) buildFile(t *testing.T, key, name, file string, public bool, want int) string {
	t.Helper()
	q := "name=" + name
	if public {
		q += "&public=true"
	}
	st, m, err := w.srv.BuildFile(key, q, file)
	if err != nil {
		t.Fatal(err)
	}
	if st != want {
		t.Fatalf("build %s: %d %v, want %d", name, st, m, want)
	}
	if want != 202 {
		return ""
	}
	return m["operation"].(map[string]any)["id"].(string)
}

// run runs a shell command in a sandbox as root and returns its stdout.
func run(t *testing.T, sb sandbox, script string) string {
	t.Helper()
	out, _, err := testenv.Sandbox(sb).Run(script, "root")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// stateOfA is a fingerprint of A's objects, read as A.
func (w *world) stateOfA(t *testing.T) string {
	t.Helper()
	_, sb := w.must(t, "GET", "/v1/sandboxes/"+w.sbA.ID, w.keyA, nil, 200)
	_, sn := w.must(t, "GET", "/v1/snapshots/"+w.snapA, w.keyA, nil, 200)
	_, tp := w.must(t, "GET", "/v1/templates/"+w.tplA, w.keyA, nil, 200)
	_, only := w.must(t, "GET", "/v1/templates/"+w.onlyA, w.keyA, nil, 200)
	_, min := w.must(t, "GET", "/v1/templates/minimal", w.keyA, nil, 200)
	_, cr := w.must(t, "GET", "/v1/credentials", w.keyA, nil, 200)
	_, ks := w.must(t, "GET", "/v1/keys", w.keyA, nil, 200)
	_, op := w.must(t, "GET", "/v1/operations/"+w.opA, w.keyA, nil, 200)
	var creds []string
	for _, c := range cr["credentials"].([]any) {
		creds = append(creds, c.(map[string]any)["id"].(string))
	}
	var keys []string
	for _, k := range ks["keys"].([]any) {
		km := k.(map[string]any)
		keys = append(keys, fmt.Sprint(km["id"], km["revoked_at"]))
	}
	return fmt.Sprintf("sandbox=%v/%v timeout=%v network=%v snapshot=%v template=%v/%v minimal=%v creds=%v keys=%v op=%v",
		sb["state"], sb["template_ref"], sb["expires_at"], sb["network"], sn["state"], tp["digest"], only["digest"], min["digest"], creds, keys, op["state"])
}

func (w *world) aStillWorks(t *testing.T) {
	if got := run(t, w.sbA, "cat /owner"); got != "A\n" {
		t.Errorf("A's sandbox /owner = %q", got)
	}
	_, tp := w.must(t, "GET", "/v1/templates/"+w.tplA, w.keyA, nil, 200)
	if tp["digest"] != w.digestA {
		t.Errorf("A's template digest %v, was %v", tp["digest"], w.digestA)
	}
	// A's next sandbox of its template runs A's files, not B's.
	sb, _ := w.create(t, w.keyA, w.tplA)
	if got := run(t, sb, "cat /owner"); got != "A\n" {
		t.Errorf("A's new sandbox of %s has /owner %q", w.tplA, got)
	}
	w.must(t, "DELETE", "/v1/sandboxes/"+sb.ID, w.keyA, nil, 202)
	if _, m := w.must(t, "GET", "/v1/templates/builds/"+w.buildA+"/logs", w.keyA, nil, 200); m["steps"] == nil {
		t.Errorf("A's build logs: %v", m)
	}
}

// resolution: the same name means each project's own template; B's build
// of A's exact build file is no cache hit of A's.
func (w *world) resolution(t *testing.T) {
	sb, _ := w.create(t, w.keyB, w.tplA) // B built its own under A's name (the build route's case)
	if got := run(t, sb, "cat /owner"); got != "B\n" {
		t.Errorf("B's sandbox of %s has /owner %q, want B's", w.tplA, got)
	}
	w.must(t, "DELETE", "/v1/sandboxes/"+sb.ID, w.keyB, nil, 202)
	op := w.buildFile(t, w.keyB, "copycat", "FROM minimal\nUSER root\nRUN echo A > /owner\n", false, 202)
	res := w.waitOp(t, w.keyB, op)
	steps, _ := res["result"].(map[string]any)["steps"].([]any)
	if len(steps) == 0 {
		t.Fatalf("copycat build: %v", res)
	}
	if last := steps[len(steps)-1].(map[string]any); last["cached"] != false {
		t.Errorf("B's build of A's build file hit A's step cache: %v", last)
	}
}

func (w *world) admin(t *testing.T) {
	_, m := w.must(t, "GET", "/v1/sandboxes?all_projects=true", w.keyO, nil, 200)
	var ids []string
	for _, s := range m["sandboxes"].([]any) {
		ids = append(ids, s.(map[string]any)["id"].(string))
	}
	if !slices.Contains(ids, w.sbA.ID) || !slices.Contains(ids, w.sbB.ID) {
		t.Errorf("admin cross-project list %v lacks A's or B's sandbox", ids)
	}
	_, m = w.must(t, "GET", "/v1/templates?all_projects=true", w.keyO, nil, 200)
	if !hasTemplate(m, w.tplA, "p1") || !hasTemplate(m, w.tplA, "p2") {
		t.Errorf("admin template list lacks a project's %s: %v", w.tplA, m)
	}
	// Publishing: an operator's public template is every project's, and
	// read-only to them.
	name := "pub-" + w.tplA
	op := w.buildFile(t, w.keyO, name, "FROM minimal\nENV PUBLISHED=1\n", true, 202)
	if res := w.waitOp(t, w.keyO, op); res["state"] != "succeeded" {
		t.Fatalf("publish: %v", res)
	}
	_, tp := w.must(t, "GET", "/v1/templates/"+name, w.keyB, nil, 200)
	if tp["public"] != true {
		t.Errorf("published template seen by B: %v", tp)
	}
	w.must(t, "DELETE", "/v1/templates/"+name, w.keyB, nil, 403)
	w.must(t, "POST", "/v1/templates/gc", w.keyO, nil, 200)
	w.must(t, "DELETE", "/v1/templates/"+name, w.keyO, nil, 204)
	w.must(t, "GET", "/v1/templates/"+name, w.keyB, nil, 404)
}

func hasTemplate(m map[string]any, name, project string) bool {
	for _, x := range m["templates"].([]any) {
		tm := x.(map[string]any)
		if tm["name"] == name && tm["project"] == project {
			return true
		}
	}
	return false
}

// auditLog: refused cross-project access and key creation are recorded.
func (w *world) auditLog(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(w.srv.DataDir, "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	var denied, gcDenied, e2bDenied bool
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		var ev map[string]any
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if ev["request_id"] == nil || ev["request_id"] == "" {
			t.Errorf("audit event without request id: %s", line)
		}
		switch {
		case ev["action"] == "GET /v1/sandboxes/{id}" && ev["outcome"] == "denied" && ev["project"] == "p2" && ev["owner"] == "p1" && ev["target"] == w.sbA.ID:
			denied = true
		case ev["action"] == "template.gc" && ev["outcome"] == "denied" && ev["project"] == "p2":
			gcDenied = true
		case ev["action"] == "e2b GET /sandboxes/{id}" && ev["outcome"] == "denied" && ev["owner"] == "p1":
			e2bDenied = true
		}
	}
	if !denied || !gcDenied || !e2bDenied {
		t.Errorf("audit log lacks events (sandbox get denied %v, gc denied %v, e2b denied %v):\n%s", denied, gcDenied, e2bDenied, raw)
	}
}

// refused checks B's request is refused with one of want.
func (w *world) refused(t *testing.T, method, path string, body any, want ...int) {
	t.Helper()
	st, m := w.call(method, path, w.keyB, body)
	if !slices.Contains(want, st) {
		t.Errorf("B: %s %s = %d %v, want %v", method, path, st, m, want)
	}
	w.documented(t, st)
	if m["error"] == nil {
		t.Errorf("B: %s %s: no JSON error: %v", method, path, m)
	}
}

// documented checks the served OpenAPI document lists status for the
// route under test (E2B's API is E2B's document, not in this repository).
func (w *world) documented(t *testing.T, status int) {
	t.Helper()
	plane, route, _ := strings.Cut(w.route, " ")
	method, pattern, _ := strings.Cut(route, " ")
	var doc []byte
	switch plane {
	case "control":
		doc = api.OpenAPI()
	case "data":
		doc = dataplane.OpenAPI()
	default:
		return
	}
	if !openapitest.Documents(doc, method, pattern, status) {
		t.Errorf("%s answered %d, which its OpenAPI document does not list", w.route, status)
	}
}

// e2bRefused checks B's E2B request is refused with 404.
func (w *world) e2bRefused(t *testing.T, method, path string, body any) {
	t.Helper()
	st, m := w.call(method, path, w.keyB, body)
	if st != http.StatusNotFound {
		t.Errorf("B (e2b): %s %s = %d %v, want 404", method, path, st, m)
	}
}

// dataRefused uses B's session token on A's sandbox.
func (w *world) dataRefused(t *testing.T, method, path string, body any) {
	t.Helper()
	st, m, err := testenv.DoJSON(method, w.sbA.Data+strings.ReplaceAll(path, "{id}", w.sbA.ID),
		map[string]string{"Authorization": "Bearer " + w.sbB.Token}, body)
	if err != nil {
		t.Fatal(err)
	}
	if st != http.StatusNotFound && st != http.StatusUnauthorized {
		t.Errorf("B's token on A's sandbox: %s %s = %d %v, want 404/401", method, path, st, m)
	}
	w.documented(t, st)
}

// listExcludes checks a list B gets names none of A's ids.
func (w *world) listExcludes(t *testing.T, path string, ids ...string) {
	t.Helper()
	st, raw, err := rawCall("GET", w.srv.Ctrl+path, w.keyB)
	if err != nil || st != 200 {
		t.Fatalf("B: GET %s = %d %v", path, st, err)
	}
	for _, id := range ids {
		if strings.Contains(raw, id) {
			t.Errorf("B's GET %s shows A's %s: %.300s", path, id, raw)
		}
	}
}

func rawCall(method, url, key string) (int, string, error) {
	req, _ := http.NewRequest(method, url, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := testenv.HTTP.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(b), nil
}

func routeCases() map[string]func(*testing.T, *world) {
	sbx := func(w *world) string { return "/v1/sandboxes/" + w.sbA.ID }
	c := map[string]func(*testing.T, *world){
		"control GET /healthz": func(t *testing.T, w *world) {
			if st, _ := w.call("GET", "/healthz", "", nil); st != 200 {
				t.Errorf("healthz: %d", st)
			}
		},
		"control GET /openapi.json": func(t *testing.T, w *world) {
			if st, raw, _ := rawCall("GET", w.srv.Ctrl+"/openapi.json", ""); st != 200 || strings.Contains(raw, w.sbA.ID) {
				t.Errorf("openapi: %d", st)
			}
		},
		"control GET /v1/info": func(t *testing.T, w *world) { w.listExcludes(t, "/v1/info", w.sbA.ID, "p1") },
		"control POST /v1/sandboxes": func(t *testing.T, w *world) {
			// A's private template is not B's to use.
			w.refused(t, "POST", "/v1/sandboxes", map[string]any{"template": w.onlyA}, 404)
			st, m := w.call("POST", "/v1/sandboxes", w.keyB, map[string]any{"template": w.tplA})
			// B has its own template of that name only after the build case ran.
			if st == 202 {
				id := m["sandbox"].(map[string]any)["id"].(string)
				w.must(t, "DELETE", "/v1/sandboxes/"+id, w.keyB, nil, 202)
				if m["sandbox"].(map[string]any)["template_ref"] != "~p2~"+w.tplA {
					t.Errorf("B's create used %v", m["sandbox"])
				}
			} else if st != 404 {
				t.Errorf("B creates from A's template: %d %v", st, m)
			}
		},
		"control GET /v1/sandboxes": func(t *testing.T, w *world) {
			w.listExcludes(t, "/v1/sandboxes", w.sbA.ID)
			w.listExcludes(t, "/v1/sandboxes?state=running,paused,deleted,failed,lost,creating,deleting,hibernated", w.sbA.ID)
			w.refused(t, "GET", "/v1/sandboxes?all_projects=true", nil, 403)
		},
		"control GET /v1/sandboxes/{id}":    func(t *testing.T, w *world) { w.refused(t, "GET", sbx(w), nil, 404) },
		"control DELETE /v1/sandboxes/{id}": func(t *testing.T, w *world) { w.refused(t, "DELETE", sbx(w), nil, 404) },
		"control POST /v1/sandboxes/{id}/timeout": func(t *testing.T, w *world) {
			w.refused(t, "POST", sbx(w)+"/timeout", map[string]any{"timeout_seconds": 1}, 404)
		},
		"control POST /v1/sandboxes/{id}/session": func(t *testing.T, w *world) { w.refused(t, "POST", sbx(w)+"/session", nil, 404) },
		"control POST /v1/sandboxes/{id}/ports/{port}/url": func(t *testing.T, w *world) {
			w.refused(t, "POST", sbx(w)+"/ports/8000/url", map[string]any{}, 404)
			// B's session token on A's forwarded port, path form: 404.
			w.dataRefused(t, "GET", "/v1/sandboxes/{id}/ports/8000/", nil)
		},
		"control PUT /v1/sandboxes/{id}/network": func(t *testing.T, w *world) {
			w.refused(t, "PUT", sbx(w)+"/network", map[string]any{"mode": "open"}, 404)
		},
		"control GET /v1/sandboxes/{id}/network/log": func(t *testing.T, w *world) {
			w.refused(t, "GET", sbx(w)+"/network/log", nil, 404)
		},
		"control GET /v1/sandboxes/{id}/metrics": func(t *testing.T, w *world) {
			w.refused(t, "GET", sbx(w)+"/metrics", nil, 404)
		},
		"control POST /v1/sandboxes/{id}/pause":     func(t *testing.T, w *world) { w.refused(t, "POST", sbx(w)+"/pause", nil, 404) },
		"control POST /v1/sandboxes/{id}/hibernate": func(t *testing.T, w *world) { w.refused(t, "POST", sbx(w)+"/hibernate", nil, 404) },
		"control POST /v1/sandboxes/{id}/resume":    func(t *testing.T, w *world) { w.refused(t, "POST", sbx(w)+"/resume", nil, 404) },
		"control POST /v1/sandboxes/{id}/snapshots": func(t *testing.T, w *world) {
			w.refused(t, "POST", sbx(w)+"/snapshots", map[string]any{}, 404)
		},
		"control GET /v1/snapshots":         func(t *testing.T, w *world) { w.listExcludes(t, "/v1/snapshots", w.snapA, w.sbA.ID) },
		"control GET /v1/snapshots/{id}":    func(t *testing.T, w *world) { w.refused(t, "GET", "/v1/snapshots/"+w.snapA, nil, 404) },
		"control DELETE /v1/snapshots/{id}": func(t *testing.T, w *world) { w.refused(t, "DELETE", "/v1/snapshots/"+w.snapA, nil, 404) },
		"control POST /v1/snapshots/{id}/fork": func(t *testing.T, w *world) {
			w.refused(t, "POST", "/v1/snapshots/"+w.snapA+"/fork", map[string]any{"count": 1}, 404)
		},
		"control POST /v1/credentials": func(t *testing.T, w *world) {
			// B's credential is B's: it does not join A's list.
			_, m := w.must(t, "POST", "/v1/credentials", w.keyB, map[string]any{"secret": "secret-of-B", "host": "api.test"}, 201)
			if m["project_id"] != "p2" {
				t.Errorf("B's credential belongs to %v", m["project_id"])
			}
			w.must(t, "DELETE", "/v1/credentials/"+m["id"].(string), w.keyB, nil, 204)
		},
		"control GET /v1/credentials":         func(t *testing.T, w *world) { w.listExcludes(t, "/v1/credentials", w.credA, "s3cr3t-of-A") },
		"control DELETE /v1/credentials/{id}": func(t *testing.T, w *world) { w.refused(t, "DELETE", "/v1/credentials/"+w.credA, nil, 404) },
		"control GET /v1/operations/{id}":     func(t *testing.T, w *world) { w.refused(t, "GET", "/v1/operations/"+w.opA, nil, 404) },
		"control GET /v1/operations/{id}/events": func(t *testing.T, w *world) {
			w.refused(t, "GET", "/v1/operations/"+w.opA+"/events", nil, 404)
		},
		"control GET /v1/events": func(t *testing.T, w *world) {
			// B's stream from the very start holds nothing of A's.
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", w.srv.Ctrl+"/v1/events", nil)
			req.Header.Set("X-API-Key", w.keyB)
			req.Header.Set("Last-Event-ID", "0")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body) // ends at the deadline
			if resp.StatusCode != 200 || !strings.Contains(string(b), w.sbB.ID) {
				t.Errorf("B's events: %d %.300s (want B's own events)", resp.StatusCode, b)
			}
			for _, id := range []string{w.sbA.ID, w.opA, `"p1"`} {
				if strings.Contains(string(b), id) {
					t.Errorf("B's event stream shows A's %s", id)
				}
			}
		},
		"control GET /v1/templates": func(t *testing.T, w *world) {
			_, m := w.must(t, "GET", "/v1/templates", w.keyB, nil, 200)
			for _, x := range m["templates"].([]any) {
				if p := x.(map[string]any)["project"]; p != nil && p != "p2" {
					t.Errorf("B's template list shows %v", x)
				}
			}
			if !hasTemplate(m, "minimal", "") && !strings.Contains(fmt.Sprint(m), "minimal") {
				t.Errorf("B does not see the public minimal: %v", m)
			}
			w.refused(t, "GET", "/v1/templates?all_projects=true", nil, 403)
		},
		"control GET /v1/templates/{name}": func(t *testing.T, w *world) {
			w.refused(t, "GET", "/v1/templates/"+w.tplA, nil, 404)
			w.must(t, "GET", "/v1/templates/minimal", w.keyB, nil, 200)
		},
		"control POST /v1/templates": func(t *testing.T, w *world) {
			w.refused(t, "POST", "/v1/templates", map[string]any{"name": "minimal", "source": "busybox", "public": true}, 403)
		},
		"control POST /v1/templates/upload": func(t *testing.T, w *world) {
			req, _ := http.NewRequest("POST", w.srv.Ctrl+"/v1/templates/upload?name=minimal&public=true", strings.NewReader("not a tar"))
			req.Header.Set("Content-Type", "application/x-tar")
			req.Header.Set("X-API-Key", w.keyB)
			resp, err := testenv.HTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 403 {
				t.Errorf("B publishes an upload over minimal: %d", resp.StatusCode)
			}
		},
		"control POST /v1/templates/build": func(t *testing.T, w *world) {
			w.buildFile(t, w.keyB, "minimal", "FROM minimal\nENV EVIL=1\n", true, 403)
			// B's build of A's name makes B's own template.
			op := w.buildFile(t, w.keyB, w.tplA, "FROM minimal\nUSER root\nRUN echo B > /owner\n", false, 202)
			if res := w.waitOp(t, w.keyB, op); res["state"] != "succeeded" {
				t.Fatalf("B's build: %v", res)
			}
		},
		"control DELETE /v1/templates/{name}": func(t *testing.T, w *world) {
			w.refused(t, "DELETE", "/v1/templates/"+w.onlyA, nil, 404)
			w.refused(t, "DELETE", "/v1/templates/minimal", nil, 403)
		},
		"control POST /v1/templates/{name}/alias": func(t *testing.T, w *world) {
			w.refused(t, "POST", "/v1/templates/"+w.onlyA+"/alias", map[string]any{"alias": "x"}, 404)
			w.refused(t, "POST", "/v1/templates/minimal/alias", map[string]any{"alias": "base", "public": true}, 403)
			// Re-pointing "minimal" in B's project shadows it for B only.
			_, m := w.must(t, "POST", "/v1/templates/"+w.tplA+"/alias", w.keyB, map[string]any{"alias": "minimal"}, 200)
			if m["project"] != "p2" {
				t.Errorf("B's alias: %v", m)
			}
			w.must(t, "DELETE", "/v1/templates/minimal", w.keyB, nil, 204) // B's own alias goes
		},
		"control GET /v1/templates/builds/{op}/logs": func(t *testing.T, w *world) {
			w.refused(t, "GET", "/v1/templates/builds/"+w.buildA+"/logs", nil, 404)
			w.refused(t, "GET", "/v1/templates/builds/"+w.buildA+"/logs?step=2", nil, 404)
		},
		"control POST /v1/templates/gc": func(t *testing.T, w *world) { w.refused(t, "POST", "/v1/templates/gc", nil, 403) },
		"control GET /v1/keys": func(t *testing.T, w *world) {
			w.listExcludes(t, "/v1/keys", w.keyAID, `"p1"`)
			w.refused(t, "GET", "/v1/keys?all_projects=true", nil, 403)
		},
		"control POST /v1/keys": func(t *testing.T, w *world) {
			w.refused(t, "POST", "/v1/keys", map[string]any{"name": "x", "project": "p1"}, 403)
			w.refused(t, "POST", "/v1/keys", map[string]any{"name": "x", "admin": true}, 403)
		},
		"control DELETE /v1/keys/{id}": func(t *testing.T, w *world) { w.refused(t, "DELETE", "/v1/keys/"+w.keyAID, nil, 404) },
		// Nodes are the operator's: a project key may neither list nor
		// drain them, whatever the server's layout.
		"control GET /v1/nodes":                 func(t *testing.T, w *world) { w.refused(t, "GET", "/v1/nodes", nil, 403) },
		"control POST /v1/nodes/{name}/drain":   func(t *testing.T, w *world) { w.refused(t, "POST", "/v1/nodes/n1/drain", nil, 403) },
		"control POST /v1/nodes/{name}/undrain": func(t *testing.T, w *world) { w.refused(t, "POST", "/v1/nodes/n1/undrain", nil, 403) },

		"e2b POST /sandboxes": func(t *testing.T, w *world) {
			w.e2bRefused(t, "POST", "/sandboxes", map[string]any{"templateID": w.onlyA})
		},
		"e2b POST /v2/sandboxes": func(t *testing.T, w *world) {
			w.e2bRefused(t, "POST", "/v2/sandboxes", map[string]any{"templateID": w.onlyA})
		},
		"e2b GET /sandboxes":    func(t *testing.T, w *world) { w.listExcludes(t, "/sandboxes", w.sbA.ID) },
		"e2b GET /v2/sandboxes": func(t *testing.T, w *world) { w.listExcludes(t, "/v2/sandboxes", w.sbA.ID) },
		"e2b GET /sandboxes/{id}": func(t *testing.T, w *world) {
			w.e2bRefused(t, "GET", "/sandboxes/"+w.sbA.ID, nil)
		},
		"e2b DELETE /sandboxes/{id}": func(t *testing.T, w *world) { w.e2bRefused(t, "DELETE", "/sandboxes/"+w.sbA.ID, nil) },
		"e2b POST /sandboxes/{id}/timeout": func(t *testing.T, w *world) {
			w.e2bRefused(t, "POST", "/sandboxes/"+w.sbA.ID+"/timeout", map[string]any{"timeout": 1})
		},
		"e2b POST /sandboxes/{id}/refreshes": func(t *testing.T, w *world) {
			w.e2bRefused(t, "POST", "/sandboxes/"+w.sbA.ID+"/refreshes", map[string]any{"duration": 1})
		},
		"e2b POST /sandboxes/{id}/connect": func(t *testing.T, w *world) {
			w.e2bRefused(t, "POST", "/sandboxes/"+w.sbA.ID+"/connect", map[string]any{"timeout": 60})
		},
		"e2b POST /v2/sandboxes/{id}/connect": func(t *testing.T, w *world) {
			w.e2bRefused(t, "POST", "/v2/sandboxes/"+w.sbA.ID+"/connect", map[string]any{"timeout": 60})
		},
		"e2b POST /sandboxes/{id}/pause":  func(t *testing.T, w *world) { w.e2bRefused(t, "POST", "/sandboxes/"+w.sbA.ID+"/pause", nil) },
		"e2b POST /sandboxes/{id}/resume": func(t *testing.T, w *world) { w.e2bRefused(t, "POST", "/sandboxes/"+w.sbA.ID+"/resume", nil) },
		"e2b GET /sandboxes/{id}/metrics": func(t *testing.T, w *world) { w.e2bRefused(t, "GET", "/sandboxes/"+w.sbA.ID+"/metrics", nil) },
		"e2b PUT /sandboxes/{id}/network": func(t *testing.T, w *world) {
			w.e2bRefused(t, "PUT", "/sandboxes/"+w.sbA.ID+"/network", map[string]any{"allow_internet_access": false})
		},
		"e2b POST /sandboxes/{id}/snapshots": func(t *testing.T, w *world) {
			w.e2bRefused(t, "POST", "/sandboxes/"+w.sbA.ID+"/snapshots", map[string]any{"name": "stolen"})
		},
		"e2b GET /snapshots": func(t *testing.T, w *world) {
			w.listExcludes(t, "/snapshots", w.snapA)
			w.listExcludes(t, "/snapshots?sandboxID="+w.sbA.ID, w.snapA)
			// A's snapshot as B's template: not found.
			w.e2bRefused(t, "POST", "/v2/sandboxes", map[string]any{"templateID": w.snapA})
		},
		"e2b DELETE /templates/{id}": func(t *testing.T, w *world) { w.e2bRefused(t, "DELETE", "/templates/"+w.snapA, nil) },
		"e2b POST /sandboxes/{id}/fork": func(t *testing.T, w *world) {
			w.e2bRefused(t, "POST", "/sandboxes/"+w.sbA.ID+"/fork", map[string]any{"count": 1})
		},
	}
	// The data plane: B's session token (valid, for B's own sandbox) on
	// each of A's sandbox routes.
	bodies := map[string]any{
		"POST /v1/sandboxes/{id}/commands":                   map[string]any{"argv": []string{"true"}},
		"POST /v1/sandboxes/{id}/commands/{cid}/stdin":       "x",
		"POST /v1/sandboxes/{id}/commands/{cid}/signal":      map[string]any{"signal": "KILL"},
		"POST /v1/sandboxes/{id}/commands/{cid}/resize":      map[string]any{"rows": 10, "cols": 10},
		"PUT /v1/sandboxes/{id}/files":                       "data",
		"POST /v1/sandboxes/{id}/files/mkdir":                map[string]any{"path": "/tmp/x"},
		"POST /v1/sandboxes/{id}/files/move":                 map[string]any{"from": "/owner", "to": "/tmp/y"},
		"POST /v1/sandboxes/{id}/commands/{cid}/stdin/close": nil,
		"POST /v1/sandboxes/{id}/code":                       map[string]any{"code": "1", "language": "bash"},
	}
	for _, r := range dataplane.Routes() {
		method, pattern, _ := strings.Cut(r, " ")
		body := bodies[r]
		c["data "+r] = func(t *testing.T, w *world) {
			path := strings.ReplaceAll(pattern, "{cid}", "1")
			if strings.Contains(path, "/files") && !strings.Contains(path, "mkdir") && !strings.Contains(path, "move") {
				path += "?path=/owner"
			}
			w.dataRefused(t, method, path, body)
		}
	}
	return c
}
