// Package e2btest runs the real e2b npm SDK (2.51.0 and 2.50.0) against a
// real `space server`, plus raw-HTTP checks of the E2B routes' auth and
// bad-input handling. It needs root (the server makes namespaces), node and
// the npm packages (scripts/e2b-deps.sh); without them it skips and says why.
package e2btest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/criu"
	"github.com/space-sandbox/space/test/testenv"
)

// env is one running server.
type env struct {
	*testenv.Server
	key, key2 string // API keys of projects p1 and p2
	template  string
	interp    bool // the server builds code-interpreter-v1
}

var (
	theEnv   *env
	setupErr error
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("e2b tests need root (the server makes namespaces): skipping all")
		os.Exit(m.Run())
	}
	code := func() int {
		theEnv, setupErr = setup()
		defer func() {
			if theEnv != nil {
				theEnv.deleteAll()
				theEnv.Stop()
				theEnv.RemoveCgroupBase()
				theEnv.Remove()
			}
		}()
		code := m.Run()
		if code != 0 && theEnv != nil {
			// The suites run many sandboxes: a failure's cause is often
			// far above the tail, so every warning and error comes first.
			fmt.Printf("---- server log (warnings and errors) ----\n")
			for _, line := range strings.Split(theEnv.LogTail(64<<20), "\n") {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.Contains(line, "failed") {
					fmt.Println(line)
				}
			}
			fmt.Printf("---- server log (tail) ----\n%s\n", theEnv.LogTail(20000))
		}
		return code
	}()
	os.Exit(code)
}

func repoRoot() string { return testenv.RepoRoot() }

func setup() (*env, error) {
	srv, err := testenv.New("space-e2b-")
	if err != nil {
		return nil, err
	}
	e := &env{Server: srv, template: "minimal"}
	// The Debian "base" template (bash, like E2B's) when the suite builds it;
	// otherwise busybox "minimal" (envd's /bin/bash falls back to /bin/sh).
	builtins := "minimal"
	if os.Getenv("SPACE_TEST_BASE") == "1" {
		// code-interpreter-v1 builds after base, so the tests of base
		// need not wait for it (interp_test.go does).
		e.template, builtins = "base", "minimal,base,code-interpreter-v1"
		e.interp = true
	}
	srv.Args = []string{"--builtins", builtins}
	if err := e.Start(); err != nil {
		return e, err
	}
	if e.key, err = e.CreateKey("p1"); err != nil {
		return e, err
	}
	if e.key2, err = e.CreateKey("p2"); err != nil {
		return e, err
	}
	// A cold cache builds Debian first.
	return e, e.WaitTemplate(e.key, e.template, 15*time.Minute)
}

// deleteAll deletes the sandboxes a failed test left: they would outlive
// the server process.
func (e *env) deleteAll() {
	if e.Ctrl == "" {
		return
	}
	for _, key := range []string{e.key, e.key2} {
		req, _ := http.NewRequest("GET", e.Ctrl+"/v1/sandboxes?state=creating,running&limit=1000", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := hc.Do(req)
		if err != nil {
			continue
		}
		var list struct {
			Sandboxes []struct{ ID string } `json:"sandboxes"`
		}
		json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list)
		resp.Body.Close()
		for _, sb := range list.Sandboxes {
			e.do("DELETE", e.Ctrl+"/sandboxes/"+sb.ID, map[string]string{"X-API-KEY": key}, nil)
		}
	}
}

func need(t *testing.T) *env {
	t.Helper()
	if theEnv == nil && setupErr == nil {
		t.Skip("needs root")
	}
	if setupErr != nil {
		t.Fatalf("setup: %v", setupErr)
	}
	return theEnv
}

var hc = &http.Client{Timeout: 3 * time.Minute}

// do sends a request and decodes a JSON object answer (nil for none).
func (e *env) do(method, url string, hdr map[string]string, body any) (int, map[string]any, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if rd != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var m map[string]any
	if len(bytes.TrimSpace(raw)) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, &m); err != nil {
			return resp.StatusCode, nil, fmt.Errorf("bad JSON (%d): %.200s", resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, m, nil
}

// TestSDK runs test/e2b/sdk.test.mjs with each pinned SDK version.
func TestSDK(t *testing.T) {
	e := need(t)
	conc := os.Getenv("SPACE_E2B_CONCURRENCY")
	if conc == "" {
		conc = "50"
	}
	// Auto-pause hibernates: with the namespace driver's CRIU the suite
	// also checks a background process runs on after the resume.
	procs := "0"
	if _, _, err := criu.ProbeSandboxes(context.Background(), ""); err == nil {
		procs = "1"
	}
	runSuite(t, e, "sdk.test.mjs", 3*time.Minute, "SPACE_E2B_CONCURRENCY="+conc, "SPACE_E2B_PROCESSES="+procs)
}

// createRaw makes a sandbox through the E2B REST API.
func (e *env) createRaw(t *testing.T) (id, token string) {
	t.Helper()
	st, m, err := e.do("POST", e.Ctrl+"/v2/sandboxes", map[string]string{"X-API-KEY": e.key},
		map[string]any{"templateID": e.template, "timeout": 120})
	if err != nil || st != 201 {
		t.Fatalf("create: %d %v %v", st, m, err)
	}
	if m["envdVersion"] != "0.6.4" || m["clientID"] == "" {
		t.Fatalf("create answer: %v", m)
	}
	return m["sandboxID"].(string), m["envdAccessToken"].(string)
}

func TestRESTAuthAndBadInput(t *testing.T) {
	e := need(t)
	id, _ := e.createRaw(t)
	defer e.do("DELETE", e.Ctrl+"/sandboxes/"+id, map[string]string{"X-API-KEY": e.key}, nil)
	key := map[string]string{"X-API-KEY": e.key}
	routes := []struct{ method, path string }{
		{"POST", "/sandboxes"}, {"POST", "/v2/sandboxes"}, {"GET", "/sandboxes"}, {"GET", "/v2/sandboxes"},
		{"GET", "/sandboxes/" + id}, {"DELETE", "/sandboxes/" + id}, {"POST", "/sandboxes/" + id + "/timeout"},
		{"POST", "/sandboxes/" + id + "/connect"}, {"POST", "/v2/sandboxes/" + id + "/connect"},
		{"POST", "/sandboxes/" + id + "/pause"}, {"GET", "/sandboxes/" + id + "/metrics"},
	}
	for _, rt := range routes {
		for name, hdr := range map[string]map[string]string{
			"none": {}, "bad": {"X-API-KEY": "space_nope_nope"}, "token": {"X-API-KEY": "sst_abc.def"},
		} {
			st, m, err := e.do(rt.method, e.Ctrl+rt.path, hdr, "{}")
			if err != nil || st != 401 || m["code"] != float64(401) || m["message"] == "" {
				t.Errorf("%s %s with %s key: %d %v %v", rt.method, rt.path, name, st, m, err)
			}
		}
	}
	cases := []struct {
		method, path string
		hdr          map[string]string
		body         any
		want         int
	}{
		{"POST", "/v2/sandboxes", key, `{"templateID":`, 400},
		{"POST", "/v2/sandboxes", key, `{"templateID":7}`, 400},
		{"POST", "/v2/sandboxes", key, `[]`, 400},
		{"POST", "/v2/sandboxes", key, ``, 400},
		{"POST", "/v2/sandboxes", key, map[string]any{"templateID": "../../etc"}, 400},
		{"POST", "/v2/sandboxes", key, map[string]any{"templateID": "no-such-template"}, 404},
		{"POST", "/v2/sandboxes", key, map[string]any{"templateID": e.template, "timeout": -1}, 400},
		{"POST", "/v2/sandboxes", key, map[string]any{"templateID": e.template, "envVars": map[string]string{"A=B": "x"}}, 400},
		{"POST", "/v2/sandboxes", key, map[string]any{"templateID": e.template, "metadata": map[string]string{"k": strings.Repeat("v", 600)}}, 400},
		{"POST", "/v2/sandboxes", key, map[string]any{"templateID": e.template, "volumeMounts": []any{map[string]any{"name": "v", "path": "/data"}}}, 400},
		{"POST", "/v2/sandboxes", key, bytes.Repeat([]byte(" "), 2<<20), 413},
		{"GET", "/v2/sandboxes?limit=0", key, nil, 400},
		{"GET", "/v2/sandboxes?limit=abc", key, nil, 400},
		{"GET", "/v2/sandboxes?state=sleeping", key, nil, 400},
		{"GET", "/v2/sandboxes?nextToken=%27%20OR%201", key, nil, 400},
		{"GET", "/v2/sandboxes?metadata=%25zz", key, nil, 400},
		{"GET", "/v2/sandboxes?metadata=novalue", key, nil, 400},
		{"GET", "/sandboxes/sbx-0000000000000000", key, nil, 404},
		{"GET", "/sandboxes/" + strings.Repeat("x", 300), key, nil, 404},
		{"GET", "/sandboxes/" + id, map[string]string{"X-API-KEY": e.key2}, nil, 404}, // another project's
		{"DELETE", "/sandboxes/sbx-0000000000000000", key, nil, 404},
		{"POST", "/sandboxes/" + id + "/timeout", key, `{}`, 400},
		{"POST", "/sandboxes/" + id + "/timeout", key, `{"timeout":"x"}`, 400},
		{"POST", "/sandboxes/" + id + "/timeout", key, `{"timeout":99999999}`, 400},
		{"POST", "/sandboxes/sbx-0000000000000000/timeout", key, `{"timeout":10}`, 404},
		{"POST", "/sandboxes/" + id + "/connect", key, `{"timeout":0}`, 400},
		{"POST", "/sandboxes/sbx-0000000000000000/connect", key, `{"timeout":10}`, 404},
		{"POST", "/sandboxes/sbx-0000000000000000/pause", key, `{}`, 404},
		{"POST", "/sandboxes/" + id + "/resume", key, `{}`, 409}, // already running
		{"POST", "/sandboxes/" + id + "/fork", key, `{"count":0}`, 400},
		{"POST", "/sandboxes/" + id + "/fork", key, `{"count":21}`, 400},
		{"POST", "/sandboxes/" + id + "/fork", key, `{"timeout":-1}`, 400},
		{"POST", "/sandboxes/sbx-0000000000000000/fork", key, `{}`, 404},
		{"POST", "/sandboxes/" + id + "/snapshots", key, `{"name":7}`, 400},
		{"POST", "/sandboxes/sbx-0000000000000000/snapshots", key, `{}`, 404},
		{"GET", "/snapshots?limit=0", key, nil, 400},
		{"GET", "/snapshots?nextToken=%27", key, nil, 400},
		{"DELETE", "/templates/snap-0000000000000000", key, nil, 404},
		{"DELETE", "/templates/base", key, nil, 404},
		{"GET", "/sandboxes/" + id + "/metrics?start=abc", key, nil, 400},
		{"GET", "/sandboxes/" + id + "/metrics?end=-1", key, nil, 400},
		{"GET", "/v3/templates", key, nil, 501},
	}
	for _, c := range cases {
		st, m, err := e.do(c.method, e.Ctrl+c.path, c.hdr, c.body)
		if err != nil || st != c.want || m["code"] != float64(c.want) || m["message"] == "" {
			t.Errorf("%s %.80s body %.60v: got %d %v %v, want %d", c.method, c.path, c.body, st, m, err, c.want)
		}
	}
	// A metadata filter as the SDK encodes it (each key/value encoded, then
	// the query string, then the parameter).
	st, _, err := e.do("GET", e.Ctrl+"/v2/sandboxes?metadata=a%252520b%3Dc%252526d", key, nil)
	if err != nil || st != 200 {
		t.Errorf("metadata filter: %d %v", st, err)
	}
}

func TestEnvdAuth(t *testing.T) {
	e := need(t)
	idA, tokA := e.createRaw(t)
	idB, tokB := e.createRaw(t)
	hdr := func(id, tok string) map[string]string {
		h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"}
		if tok != "" {
			h["X-Access-Token"] = tok
		}
		return h
	}
	check := func(name, method, path string, h map[string]string, body any, want int) {
		t.Helper()
		st, _, err := e.do(method, e.Data+path, h, body)
		if err != nil || st != want {
			t.Errorf("%s: %s %s: got %d %v, want %d", name, method, path, st, err, want)
		}
	}
	check("health", "GET", "/health", hdr(idA, tokA), nil, 204)
	check("no token", "GET", "/health", hdr(idA, ""), nil, 401)
	check("other sandbox's token", "GET", "/health", hdr(idA, tokB), nil, 401)
	check("api key as token", "GET", "/health", hdr(idA, e.key), nil, 401)
	check("garbage token", "GET", "/files?path=/etc/hostname", hdr(idA, "sst_x.y"), nil, 401)
	check("rpc no token", "POST", "/filesystem.Filesystem/Stat", hdr(idA, ""), `{"path":"/"}`, 401)
	check("rpc other token", "POST", "/process.Process/List", hdr(idB, tokA), `{}`, 401)
	check("rpc ok", "POST", "/process.Process/List", hdr(idA, tokA), `{}`, 200)
	check("rpc bad json", "POST", "/filesystem.Filesystem/Stat", hdr(idA, tokA), `{"path":`, 400)
	check("rpc unknown field type", "POST", "/filesystem.Filesystem/Stat", hdr(idA, tokA), `{"path":5}`, 400)
	check("rpc NUL path", "POST", "/filesystem.Filesystem/Stat", hdr(idA, tokA), `{"path":"/a\u0000b"}`, 400)
	check("rpc missing", "POST", "/filesystem.Filesystem/Stat", hdr(idA, tokA), `{"path":"/nope"}`, 404)
	check("rpc remove /", "POST", "/filesystem.Filesystem/Remove", hdr(idA, tokA), `{"path":"/"}`, 400)
	check("rpc kill unknown pid", "POST", "/process.Process/SendSignal", hdr(idA, tokA), `{"process":{"pid":99999},"signal":"SIGNAL_SIGKILL"}`, 404)
	check("rpc streaming input", "POST", "/process.Process/StreamInput", hdr(idA, tokA), `{}`, 415)
	check("download dir", "GET", "/files?path=/etc", hdr(idA, tokA), nil, 400)
	check("download missing", "GET", "/files?path=/nope", hdr(idA, tokA), nil, 404)
	check("download no path", "GET", "/files", hdr(idA, tokA), nil, 400)
	check("upload no path", "POST", "/files", map[string]string{"E2b-Sandbox-Id": idA, "X-Access-Token": tokA, "Content-Type": "application/octet-stream"}, "x", 400)
	check("upload bad type", "POST", "/files?path=/tmp/x", map[string]string{"E2b-Sandbox-Id": idA, "X-Access-Token": tokA, "Content-Type": "text/plain"}, "x", 400)
	check("upload bad gzip", "POST", "/files?path=/tmp/x", map[string]string{"E2b-Sandbox-Id": idA, "X-Access-Token": tokA, "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}, "notgzip", 400)
	check("unknown envd route", "GET", "/envs", hdr(idA, tokA), nil, 404)
	// The native data plane is untouched by the E2B front door.
	check("native data plane", "GET", "/healthz", map[string]string{}, nil, 200)
	// Killed: 502, which the SDK reads as "not running".
	if st, _, err := e.do("DELETE", e.Ctrl+"/sandboxes/"+idA, map[string]string{"X-API-KEY": e.key}, nil); err != nil || st != 204 {
		t.Fatalf("kill: %d %v", st, err)
	}
	check("killed health", "GET", "/health", hdr(idA, tokA), nil, 502)
	check("killed rpc", "POST", "/process.Process/List", hdr(idA, tokA), `{}`, 502)
	e.do("DELETE", e.Ctrl+"/sandboxes/"+idB, map[string]string{"X-API-KEY": e.key}, nil)
}
