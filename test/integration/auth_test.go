package integration

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

func TestAuth(t *testing.T) {
	e := need(t)
	a := e.create(t, nil)
	defer a.delete(t)
	b := e.create(t, nil)
	defer b.delete(t)

	// No key, a bad key: 401 with a JSON error.
	for _, k := range []string{"", "space_nope_nope", a.Token} {
		st, m, err := e.call("GET", "/v1/sandboxes", k, nil)
		if err != nil || st != 401 || m["error"] == nil {
			t.Errorf("key %.12q: %d %v %v", k, st, m, err)
		}
	}
	// Another project's key: 404, and its listing is empty.
	if st, m, _ := e.call("GET", "/v1/sandboxes/"+a.ID, e.key2, nil); st != 404 {
		t.Errorf("other project get: %d %v", st, m)
	}
	if st, m, _ := e.call("DELETE", "/v1/sandboxes/"+a.ID, e.key2, nil); st != 404 {
		t.Errorf("other project delete: %d %v", st, m)
	}
	if st, m, _ := e.call("GET", "/v1/sandboxes", e.key2, nil); st != 200 || len(m["sandboxes"].([]any)) != 0 {
		t.Errorf("other project list: %d %v", st, m)
	}
	// Sandbox A's token cannot touch sandbox B.
	cross := &sandbox{e: e, ID: b.ID, Token: a.Token, Data: a.Data}
	for _, p := range []string{"/commands", "/files/stat?path=/"} {
		if st, _, _ := cross.dp("GET", p, nil); st != 404 {
			t.Errorf("token of A on B %s: %d", p, st)
		}
	}
	if st, _, _ := cross.dp("POST", "/commands", map[string]any{"argv": []string{"true"}}); st != 404 {
		t.Errorf("token of A starts a command in B: %d", st)
	}
	// API key on the data plane, token on the control API: 401.
	if st, _, _ := doJSON("GET", a.Data+"/v1/sandboxes/"+a.ID+"/commands", map[string]string{"Authorization": "Bearer " + e.key}, nil); st != 401 {
		t.Errorf("API key on the data plane: %d", st)
	}
	if st, _, _ := doJSON("GET", e.Ctrl+"/v1/sandboxes", map[string]string{"Authorization": "Bearer " + a.Token}, nil); st != 401 {
		t.Errorf("session token on the control API: %d", st)
	}
	// An expired token, signed with the server's real key: 401 token_expired.
	st, err := sqlite.Open(context.Background(), filepath.Join(e.DataDir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	past, err := auth.NewSessions(context.Background(), st, func() time.Time { return time.Now().Add(-2 * time.Hour) })
	if err != nil {
		t.Fatal(err)
	}
	old, _ := past.Issue("p1", a.ID, time.Hour)
	expired := &sandbox{e: e, ID: a.ID, Token: old, Data: a.Data}
	code, m, _ := expired.dp("GET", "/commands", nil)
	if code != 401 || m["error"].(map[string]any)["code"] != "token_expired" {
		t.Errorf("expired token: %d %v", code, m)
	}
	// A fresh token from the control API works.
	code, m, _ = e.call("POST", "/v1/sandboxes/"+a.ID+"/session", e.key, nil)
	if code != 200 {
		t.Fatalf("new session: %d %v", code, m)
	}
	fresh := &sandbox{e: e, ID: a.ID, Token: m["token"].(string), Data: a.Data}
	if code, _, _ := fresh.dp("GET", "/commands", nil); code != 200 {
		t.Errorf("re-issued token: %d", code)
	}
}

func TestBadInput(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	huge := `{"template":"minimal","metadata":{"a":"` + strings.Repeat("x", 2<<20) + `"}}`
	cases := []struct {
		name   string
		method string
		path   string
		body   any
		want   int
	}{
		{"malformed json", "POST", "/v1/sandboxes", `{"template":`, 400},
		{"unknown field", "POST", "/v1/sandboxes", `{"template":"minimal","bogus":1}`, 400},
		{"wrong type", "POST", "/v1/sandboxes", `{"template":5}`, 400},
		{"trailing data", "POST", "/v1/sandboxes", `{"template":"minimal"} {}`, 400},
		{"huge body", "POST", "/v1/sandboxes", huge, 413},
		{"bad template name", "POST", "/v1/sandboxes", `{"template":"../etc"}`, 400},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"nope"}`, 404},
		{"bad env name", "POST", "/v1/sandboxes", `{"template":"minimal","env":{"A=B":"x"}}`, 400},
		{"negative memory", "POST", "/v1/sandboxes", `{"template":"minimal","limits":{"memory_bytes":-1}}`, 400},
		{"bad id", "GET", "/v1/sandboxes/..%2f..%2fetc", nil, 404},
		{"bad op id", "GET", "/v1/operations/op-zzz", nil, 404},
		{"bad wait", "GET", "/v1/operations/op-0000000000000000?wait=forever", nil, 400},
		{"bad limit", "GET", "/v1/sandboxes?limit=100000", nil, 400},
		{"unknown route", "GET", "/v1/nope", nil, 404},
		{"bad timeout", "POST", "/v1/sandboxes/" + sb.ID + "/timeout", `{"timeout_seconds":-5}`, 400},
	}
	for _, c := range cases {
		st, m, err := e.call(c.method, c.path, e.key, c.body)
		if err != nil || st != c.want || m["error"] == nil {
			t.Errorf("%s: %d %v %v, want %d with a JSON error", c.name, st, m, err, c.want)
		}
	}
	dcases := []struct {
		name, method, path string
		body               any
		want               int
	}{
		{"relative path", "GET", "/files/stat?path=etc/passwd", nil, 400},
		{"NUL in path", "GET", "/files/stat?path=/etc%00/passwd", nil, 400},
		{"empty path", "GET", "/files?path=", nil, 400},
		{"long path", "GET", "/files/stat?path=/" + strings.Repeat("a", 5000), nil, 400},
		{"no argv", "POST", "/commands", `{}`, 400},
		{"both argv and shell", "POST", "/commands", `{"argv":["true"],"shell":"true"}`, 400},
		{"unknown field", "POST", "/commands", `{"argv":["true"],"nope":1}`, 400},
		{"bad command", "GET", "/commands/999999", nil, 404},
		{"bad signal", "POST", "/commands/1/signal", `{"signal":"SIGNOPE"}`, 404},
		{"remove root", "DELETE", "/files?path=/", nil, 400},
	}
	for _, c := range dcases {
		st, m, err := sb.dp(c.method, c.path, c.body)
		if err != nil || st != c.want || m["error"] == nil {
			t.Errorf("data %s: %d %v %v, want %d with a JSON error", c.name, st, m, err, c.want)
		}
	}
	// Traversal stays inside the sandbox: /../../etc/passwd is the sandbox's own.
	st, m, _ := sb.dp("GET", "/files/stat?path=/../../../etc/passwd", nil)
	if st != 200 || m["path"] != "/etc/passwd" {
		t.Errorf("traversal: %d %v", st, m)
	}
	// Oversized stdin chunk.
	cid := sb.start(t, map[string]any{"argv": []string{"cat"}, "stdin": true})
	req, _ := http.NewRequest("POST", sb.Data+"/v1/sandboxes/"+sb.ID+"/commands/"+cid+"/stdin", strings.NewReader(strings.Repeat("x", 2<<20)))
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	resp, err := httpc.Do(req)
	if err != nil || resp.StatusCode != 413 {
		t.Errorf("oversized stdin: %v %v", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
	sb.dp("POST", "/commands/"+cid+"/signal", map[string]any{"signal": "SIGKILL"})
	// The server is still healthy.
	if st, _, _ := e.call("GET", "/healthz", "", nil); st != 200 {
		t.Fatalf("server unhealthy after bad input: %d", st)
	}
}
