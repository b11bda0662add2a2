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
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// env is one running server and what tests need to talk to it.
type env struct {
	bin       string // the space binary
	dataDir   string
	runDir    string
	tplDir    string
	logPath   string
	ctrl      string // control API base URL
	data      string // data plane base URL
	key, key2 string // API keys of project p1 and p2
	cmd       *exec.Cmd
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
				e.stop()
				os.RemoveAll(e.dataDir)
				os.RemoveAll(e.runDir)
			}
		}()
		code := m.Run()
		if code != 0 && e != nil {
			log, _ := os.ReadFile(e.logPath)
			if len(log) > 20000 {
				log = log[len(log)-20000:]
			}
			fmt.Printf("---- server log (tail) ----\n%s\n", log)
		}
		return code
	}()
	os.Exit(code)
}

// repoRoot finds the module root from the test's working directory.
func repoRoot() string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return wd
}

// TemplateCache is shared by all test packages and runs so that templates
// are built once per machine (CI sets SPACE_TEMPLATE_CACHE).
func templateCache() string {
	if d := os.Getenv("SPACE_TEMPLATE_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/space-test-templates"
}

func setup() (*env, error) {
	root := repoRoot()
	work, err := os.MkdirTemp("", "space-it-")
	if err != nil {
		return nil, err
	}
	os.Chmod(work, 0o711)
	e := &env{
		bin:     filepath.Join(work, "space"),
		dataDir: filepath.Join(work, "data"),
		tplDir:  templateCache(),
		logPath: filepath.Join(work, "server.log"),
	}
	if e.runDir, err = os.MkdirTemp("/tmp", "spr"); err != nil {
		return nil, err
	}
	e.baseline = map[string]bool{}
	for _, l := range e.leaks() {
		e.baseline[l] = true
	}
	build := exec.Command("go", "build", "-o", e.bin, "./cmd/space")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build space: %v\n%s", err, out)
	}
	if err := e.start(); err != nil {
		return e, err
	}
	for i, p := range []string{"p1", "p2"} {
		out, err := exec.Command(e.bin, "keys", "create", "--data-dir", e.dataDir, "--project", p).Output()
		if err != nil {
			return e, fmt.Errorf("keys create: %w", err)
		}
		k := strings.TrimSpace(string(out))
		if i == 0 {
			e.key = k
		} else {
			e.key2 = k
		}
	}
	if err := e.waitTemplate("minimal", 2*time.Minute); err != nil {
		return e, err
	}
	return e, nil
}

// start launches the server and waits until it serves.
func (e *env) start() error {
	addrFile := filepath.Join(e.dataDir, "addr.json")
	os.MkdirAll(e.dataDir, 0o711)
	os.Remove(addrFile)
	logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	builtins := "minimal"
	if wantBase() {
		builtins = "minimal,base"
	}
	// A restart keeps the ports, as a real deployment would: clients hold URLs.
	ctrl, data := "127.0.0.1:0", "127.0.0.1:0"
	if e.ctrl != "" {
		ctrl, data = strings.TrimPrefix(e.ctrl, "http://"), strings.TrimPrefix(e.data, "http://")
	}
	e.cmd = exec.Command(e.bin, "server", "--data-dir", e.dataDir, "--run-dir", e.runDir,
		"--template-dir", e.tplDir, "--listen", ctrl, "--data-listen", data,
		"--addr-file", addrFile, "--builtins", builtins)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	if err := e.cmd.Start(); err != nil {
		return err
	}
	go func(c *exec.Cmd, f *os.File) { c.Wait(); f.Close() }(e.cmd, logf)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		raw, err := os.ReadFile(addrFile)
		if err == nil {
			var a struct{ Control, Data string }
			if json.Unmarshal(raw, &a) == nil {
				e.ctrl, e.data = a.Control, a.Data
				return nil
			}
		}
		if e.cmd.ProcessState != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	log, _ := os.ReadFile(e.logPath)
	return fmt.Errorf("server did not start; log:\n%s", log)
}

// kill9 kills the server the hard way.
func (e *env) kill9() {
	if e.cmd != nil && e.cmd.Process != nil {
		e.cmd.Process.Signal(syscall.SIGKILL)
		for i := 0; i < 200 && e.cmd.ProcessState == nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func (e *env) stop() {
	if e.cmd != nil && e.cmd.Process != nil {
		e.cmd.Process.Signal(syscall.SIGTERM)
		for i := 0; i < 500 && e.cmd.ProcessState == nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		e.kill9()
	}
}

func wantBase() bool { return os.Getenv("SPACE_TEST_BASE") == "1" }

func (e *env) waitTemplate(name string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		st, m, _ := e.call("GET", "/v1/templates/"+name, e.key, nil)
		if st == 200 {
			return nil
		}
		if st == 404 {
			return fmt.Errorf("template %s unavailable: %v", name, m)
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, _ := os.ReadFile(e.logPath)
	return fmt.Errorf("template %s not ready after %v; server log:\n%s", name, d, log)
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

var httpc = &http.Client{Timeout: 2 * time.Minute}

// call does a control-API request and decodes the JSON answer.
func (e *env) call(method, path, key string, body any) (int, map[string]any, error) {
	return doJSON(method, e.ctrl+path, map[string]string{"X-API-Key": key}, body)
}

func doJSON(method, url string, hdr map[string]string, body any) (int, map[string]any, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	for k, v := range hdr {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	var m map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &m); err != nil {
			return resp.StatusCode, nil, fmt.Errorf("non-JSON answer (%d): %.200s", resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, m, nil
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
	br := bufio.NewReaderSize(resp.Body, 1<<20)
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
