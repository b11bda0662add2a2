// Package integration drives a real `space server` process over HTTP, as a
// user would: real namespaces, real SQLite, real sockets. It needs root.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
	"golang.org/x/sys/unix"
)

// env is one running server and what tests need to talk to it.
type env struct {
	*testenv.Server
	key, key2 string          // API keys of project p1 and p2
	baseline  map[string]bool // host leftovers that predate this run
}

var (
	theEnv   *env
	setupErr error
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("integration tests need root (namespaces, cgroups, overlayfs): skipping all")
		os.Exit(m.Run())
	}
	code := func() int {
		e, err := setup()
		if err != nil {
			setupErr = err
		}
		theEnv = e
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

func repoRoot() string { return testenv.RepoRoot() }

func setup() (*env, error) {
	srv, err := testenv.New("space-it-")
	if err != nil {
		return nil, err
	}
	e := &env{Server: srv, baseline: map[string]bool{}}
	for _, l := range e.leaks() {
		e.baseline[l] = true
	}
	builtins := "minimal"
	if wantBase() {
		builtins = "minimal,base"
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
	if err := e.waitTemplate("minimal", 2*time.Minute); err != nil {
		return e, err
	}
	return e, nil
}

func wantBase() bool { return os.Getenv("SPACE_TEST_BASE") == "1" }

// extraServer starts another `space server` with driver drv and the extra
// flags args, a key for project p1 and the minimal template; it is stopped
// and removed when the calling test ends.
func extraServer(t *testing.T, prefix, drv string, args ...string) *env {
	t.Helper()
	return extraServerWith(t, prefix, drv, nil, args...)
}

// extraServerWith is extraServer with prep run on the server before it
// starts (e.g. to give it descriptors to inherit).
func extraServerWith(t *testing.T, prefix, drv string, prep func(*testenv.Server), args ...string) *env {
	t.Helper()
	srv, err := testenv.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if prep != nil {
		prep(srv)
	}
	srv.Driver = drv
	srv.Args = append([]string{"--builtins", "minimal"}, args...)
	if p := os.Getenv("SPACE_RUNSC"); p != "" && drv == "gvisor" {
		srv.Args = append(srv.Args, "--runsc", p)
	}
	e := &env{Server: srv, baseline: map[string]bool{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- %s server log (tail) ----\n%s", drv, srv.LogTail(8000))
		}
		srv.Stop()
		// What a failed test left mounted below the data dir (a
		// sandbox's disk) goes first: removing the dir would walk into it.
		for _, l := range e.leaks() {
			if f := strings.Fields(strings.TrimPrefix(l, "mount: ")); strings.HasPrefix(l, "mount: ") && len(f) > 4 {
				unix.Unmount(f[4], unix.MNT_DETACH)
			}
		}
		srv.Remove()
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if e.key, err = srv.CreateKey("p1"); err != nil {
		t.Fatal(err)
	}
	if err := e.waitTemplate("minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) waitTemplate(name string, d time.Duration) error {
	return e.WaitTemplate(e.key, name, d)
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

var httpc = testenv.HTTP

// call does a control-API request and decodes the JSON answer.
func (e *env) call(method, path, key string, body any) (int, map[string]any, error) {
	return doJSON(method, e.Ctrl+path, map[string]string{"X-API-Key": key}, body)
}

func doJSON(method, url string, hdr map[string]string, body any) (int, map[string]any, error) {
	return testenv.DoJSON(method, url, hdr, body)
}

// sandbox is a created, running sandbox with its session.
type sandbox struct {
	e     *env
	ID    string
	Token string
	Data  string
}

// create makes a sandbox and waits until it runs.
func (e *env) create(t testing.TB, req map[string]any) *sandbox {
	t.Helper()
	if req == nil {
		req = map[string]any{}
	}
	if _, ok := req["template"]; !ok {
		req["template"] = "minimal"
	}
	st, m, err := e.call("POST", "/v1/sandboxes", e.key, req)
	if err != nil || st != 202 {
		t.Fatalf("create: %d %v %v", st, m, err)
	}
	op := m["operation"].(map[string]any)
	sess := m["session"].(map[string]any)
	sb := &sandbox{e: e, ID: m["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), Data: sess["data_url"].(string)}
	done := e.waitOp(t, op["id"].(string))
	if done["state"] != "succeeded" {
		t.Fatalf("create operation: %v", done)
	}
	return sb
}

func (e *env) waitOp(t testing.TB, id string) map[string]any {
	t.Helper()
	for i := 0; i < 20; i++ {
		st, m, err := e.call("GET", "/v1/operations/"+id+"?wait=30s", e.key, nil)
		if err != nil || st != 200 {
			t.Fatalf("get operation: %d %v %v", st, m, err)
		}
		if s := m["state"]; s == "succeeded" || s == "failed" || s == "cancelled" {
			return m
		}
	}
	t.Fatalf("operation %s not done", id)
	return nil
}

func (sb *sandbox) delete(t testing.TB) {
	t.Helper()
	st, m, err := sb.e.call("DELETE", "/v1/sandboxes/"+sb.ID, sb.e.key, nil)
	if err != nil || st != 202 {
		t.Fatalf("delete: %d %v %v", st, m, err)
	}
	if done := sb.e.waitOp(t, m["operation"].(map[string]any)["id"].(string)); done["state"] != "succeeded" {
		t.Fatalf("delete operation: %v", done)
	}
}

// dp does a data-plane request with the sandbox's token.
func (sb *sandbox) dp(method, path string, body any) (int, map[string]any, error) {
	return doJSON(method, sb.Data+"/v1/sandboxes/"+sb.ID+path, map[string]string{"Authorization": "Bearer " + sb.Token}, body)
}

// event is one SSE event.
type event struct {
	ID, Type string
	Data     []byte
}

// exitInfo is a command's exit event.
type exitInfo struct {
	Code      int    `json:"exit_code"`
	Signal    string `json:"signal"`
	TimedOut  bool   `json:"timed_out"`
	OOMKilled bool   `json:"oom_killed"`
	Error     string `json:"error"`
}

// start starts a command and returns its id.
func (sb *sandbox) start(t testing.TB, spec map[string]any) string {
	t.Helper()
	if _, ok := spec["user"]; !ok {
		spec["user"] = "root" // the acceptance tests probe the sandbox as root inside
	}
	st, m, err := sb.dp("POST", "/commands", spec)
	if err != nil || st != 201 {
		t.Fatalf("start command: %d %v %v", st, m, err)
	}
	return m["id"].(string)
}

// stream reads a command's SSE stream from after; stopAfter > 0 stops
// (drops the connection) once that many output bytes arrived.
func (sb *sandbox) stream(t testing.TB, cid string, after string, stopAfter int, fn func(event)) (last string, ex *exitInfo) {
	t.Helper()
	req, _ := http.NewRequest("GET", sb.Data+"/v1/sandboxes/"+sb.ID+"/commands/"+cid+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	if after != "" {
		req.Header.Set("Last-Event-ID", after)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req = req.WithContext(ctx)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	return readSSE(t, resp.Body, stopAfter, fn)
}

// readSSE reads a command's SSE events from body (see stream).
func readSSE(t testing.TB, body io.Reader, stopAfter int, fn func(event)) (last string, ex *exitInfo) {
	t.Helper()
	br := bufio.NewReaderSize(body, 1<<20)
	var cur event
	got := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if err == io.EOF {
				return last, nil
			}
			t.Fatalf("read stream: %v", err)
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if cur.Type == "" && cur.Data == nil {
				continue
			}
			if cur.ID != "" {
				last = cur.ID
			}
			if cur.Type == "exit" {
				var x exitInfo
				if err := json.Unmarshal(cur.Data, &x); err != nil {
					t.Fatalf("exit event: %v", err)
				}
				return last, &x
			}
			if cur.Type == "stdout" || cur.Type == "stderr" {
				dec, err := base64.StdEncoding.DecodeString(string(cur.Data))
				if err != nil {
					t.Fatalf("base64: %v", err)
				}
				cur.Data = dec
				got += len(dec)
			}
			if fn != nil {
				fn(cur)
			}
			cur = event{}
			if stopAfter > 0 && got >= stopAfter {
				return last, nil
			}
		case line[0] == ':':
		case bytes.HasPrefix(line, []byte("id: ")):
			cur.ID = string(line[4:])
		case bytes.HasPrefix(line, []byte("event: ")):
			cur.Type = string(line[7:])
		case bytes.HasPrefix(line, []byte("data: ")):
			cur.Data = append([]byte(nil), line[6:]...)
		}
	}
}

// run runs a command to completion and returns its stdout, stderr and exit.
func (sb *sandbox) run(t testing.TB, spec map[string]any) (string, string, exitInfo) {
	t.Helper()
	cid := sb.start(t, spec)
	var out, errb bytes.Buffer
	_, ex := sb.stream(t, cid, "", 0, func(ev event) {
		if ev.Type == "stdout" {
			out.Write(ev.Data)
		} else {
			errb.Write(ev.Data)
		}
	})
	if ex == nil {
		t.Fatalf("stream ended without exit")
	}
	return out.String(), errb.String(), *ex
}

func (sb *sandbox) sh(t testing.TB, script string) (string, exitInfo) {
	t.Helper()
	out, errs, ex := sb.run(t, map[string]any{"shell": script})
	return out + errs, ex
}

var _ = strconv.Itoa
var _ sync.Mutex
