// Package snapshot_test drives pause/resume, snapshots, fork and crash
// recovery against a real `space server` process over HTTP. It needs root.
package snapshot_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

type env struct {
	*testenv.Server
	key string
}

var (
	theEnv   *env
	setupErr error
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("snapshot tests need root (namespaces, cgroups, overlayfs): skipping all")
		os.Exit(m.Run())
	}
	code := func() int {
		defer stopGvisor()
		e, err := setup()
		theEnv, setupErr = e, err
		defer func() {
			if e != nil {
				e.Stop()
				e.Remove()
			}
		}()
		code := m.Run()
		if code != 0 && e != nil {
			fmt.Printf("---- server log (tail) ----\n%s\n", e.LogTail(20000))
		}
		return code
	}()
	os.Exit(code)
}

func setup() (*env, error) {
	srv, err := testenv.New("space-snap-")
	if err != nil {
		return nil, err
	}
	e := &env{Server: srv}
	srv.Args = []string{"--builtins", "minimal"}
	if err := e.Start(); err != nil {
		return e, err
	}
	if e.key, err = e.CreateKey("p1"); err != nil {
		return e, err
	}
	return e, e.WaitTemplate(e.key, "minimal", 2*time.Minute)
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

func doJSON(method, url string, hdr map[string]string, body any) (int, map[string]any, error) {
	return testenv.DoJSON(method, url, hdr, body)
}

func (e *env) call(method, path string, body any) (int, map[string]any, error) {
	return doJSON(method, e.Ctrl+path, map[string]string{"X-API-Key": e.key}, body)
}

// must does a control call that must answer want.
func (e *env) must(t testing.TB, want int, method, path string, body any) map[string]any {
	t.Helper()
	st, m, err := e.call(method, path, body)
	if err != nil || st != want {
		t.Fatalf("%s %s: %d %v %v (want %d)", method, path, st, m, err, want)
	}
	return m
}

func (e *env) waitOp(t testing.TB, id string) map[string]any {
	t.Helper()
	for i := 0; i < 20; i++ {
		m := e.must(t, 200, "GET", "/v1/operations/"+id+"?wait=30s", nil)
		if s := m["state"]; s == "succeeded" || s == "failed" || s == "cancelled" {
			return m
		}
	}
	t.Fatalf("operation %s not done", id)
	return nil
}

// op runs a lifecycle call answering 202 + operation and waits for success.
func (e *env) op(t testing.TB, method, path string, body any) (map[string]any, map[string]any) {
	t.Helper()
	m := e.must(t, 202, method, path, body)
	done := e.waitOp(t, m["operation"].(map[string]any)["id"].(string))
	if done["state"] != "succeeded" {
		t.Fatalf("%s %s: operation %v", method, path, done)
	}
	return m, done
}

type sandbox struct {
	e                  *env
	ID, Token, DataURL string
}

func sessionSandbox(e *env, m map[string]any) *sandbox {
	sess := m["session"].(map[string]any)
	return &sandbox{e: e, ID: m["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), DataURL: sess["data_url"].(string)}
}

func (e *env) create(t testing.TB, req map[string]any) *sandbox {
	t.Helper()
	if req == nil {
		req = map[string]any{}
	}
	req["template"] = "minimal"
	m, _ := e.op(t, "POST", "/v1/sandboxes", req)
	return sessionSandbox(e, m)
}

func (sb *sandbox) delete(t testing.TB) {
	t.Helper()
	sb.e.op(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil)
}

func (sb *sandbox) dp(method, path string, body any) (int, map[string]any, error) {
	return doJSON(method, sb.DataURL+"/v1/sandboxes/"+sb.ID+path, map[string]string{"Authorization": "Bearer " + sb.Token}, body)
}

// start starts a command (as root) and returns its id.
func (sb *sandbox) start(t testing.TB, script string) string {
	t.Helper()
	st, m, err := sb.dp("POST", "/commands", map[string]any{"shell": script, "user": "root"})
	if err != nil || st != 201 {
		t.Fatalf("start command: %d %v %v", st, m, err)
	}
	return m["id"].(string)
}

// sh runs a script to completion and returns its output and exit code.
func (sb *sandbox) sh(t testing.TB, script string) (string, int) {
	t.Helper()
	cid := sb.start(t, script)
	req, _ := http.NewRequest("GET", sb.DataURL+"/v1/sandboxes/"+sb.ID+"/commands/"+cid+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 1<<20)
	var out bytes.Buffer
	var typ string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended without exit: %v (output %q)", err, out.String())
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "event: "):
			typ = line[7:]
		case strings.HasPrefix(line, "data: "):
			data := line[6:]
			switch typ {
			case "stdout", "stderr":
				b, _ := base64.StdEncoding.DecodeString(data)
				out.Write(b)
			case "exit":
				var x struct {
					Code int `json:"exit_code"`
				}
				json.Unmarshal([]byte(data), &x)
				return out.String(), x.Code
			}
		}
	}
}

// ok runs a script that must succeed.
func (sb *sandbox) ok(t testing.TB, script string) string {
	t.Helper()
	out, code := sb.sh(t, script)
	if code != 0 {
		t.Fatalf("%q exited %d: %s", script, code, out)
	}
	return out
}

// treeScript prints a description of the parts of the tree the tests
// change: every entry's type, mode, owner, size, mtime and link target,
// and every regular file's SHA-256.
const treeScript = `cd / && find work etc root 2>/dev/null | sort | while read -r f; do stat -c '%n %F %a %u %g %s %Y %N' "$f"; done; find work etc root -type f 2>/dev/null | sort | xargs sha256sum`

func (sb *sandbox) tree(t testing.TB) string { return sb.ok(t, treeScript) }

func str(m map[string]any, keys ...string) string {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = mm[k]
	}
	s, _ := v.(string)
	return s
}

func num(m map[string]any, keys ...string) float64 {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return -1
		}
		v = mm[k]
	}
	f, ok := v.(float64)
	if !ok {
		return -1
	}
	return f
}
