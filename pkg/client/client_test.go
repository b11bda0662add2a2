package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testKey = "sk-test"

// env is a fake server plus a client wired to it with its own transport,
// closed at the end so no connection goroutine outlives the test.
type env struct {
	srv *httptest.Server
	mux *http.ServeMux
	c   *Client
	tr  *http.Transport
}

func newEnv(t *testing.T, opts ...Option) *env {
	t.Helper()
	e := &env{mux: http.NewServeMux(), tr: &http.Transport{}}
	e.srv = httptest.NewServer(e.mux)
	opts = append([]Option{WithHTTPClient(&http.Client{Transport: e.tr})}, opts...)
	e.c = New(e.srv.URL+"/", testKey, opts...)
	t.Cleanup(func() {
		e.srv.CloseClientConnections()
		e.srv.Close()
		e.tr.CloseIdleConnections()
	})
	return e
}

func (e *env) conn() *SandboxConn {
	return e.c.Sandbox(Session{SandboxID: "sbx-0123456789abcdef", Token: "tok", DataURL: e.srv.URL})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func requireKey(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("X-API-Key") != testKey {
		writeErr(w, 401, "unauthorized", "missing API key")
		return false
	}
	return true
}

func sseStart(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
}

func sseEventOut(w http.ResponseWriter, id, typ, data string) {
	if id != "" {
		fmt.Fprintf(w, "id: %s\n", id)
	}
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, data)
	w.(http.Flusher).Flush()
}

func TestCreateAndWait(t *testing.T) {
	e := newEnv(t)
	var polls atomic.Int32
	e.mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		if !requireKey(w, r) {
			return
		}
		if r.Header.Get("Idempotency-Key") != "k1" {
			writeErr(w, 400, "invalid_argument", "no idempotency key")
			return
		}
		// The server decodes strictly: the SDK must send only known fields.
		var req struct {
			Template string            `json:"template"`
			Env      map[string]string `json:"env"`
			Metadata map[string]string `json:"metadata"`
			Limits   struct {
				CPUMillis   int64 `json:"cpu_millis"`
				MemoryBytes int64 `json:"memory_bytes"`
				Pids        int64 `json:"pids"`
			} `json:"limits"`
			TimeoutSeconds *int64 `json:"timeout_seconds"`
		}
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeErr(w, 400, "invalid_json", err.Error())
			return
		}
		if req.Template != "base" || req.Env["A"] != "1" || req.Limits.MemoryBytes != 512<<20 || req.TimeoutSeconds == nil || *req.TimeoutSeconds != 0 {
			writeErr(w, 400, "invalid_argument", fmt.Sprintf("unexpected request %+v", req))
			return
		}
		writeJSON(w, 202, map[string]any{
			"operation": map[string]any{"id": "op-0000000000000001", "kind": "sandbox.create", "target": "sbx-0123456789abcdef", "state": "pending"},
			"sandbox":   map[string]any{"id": "sbx-0123456789abcdef", "template": "base", "state": "creating"},
			"session":   map[string]any{"token": "tok", "expires_at": time.Now().Add(time.Hour), "data_url": "http://data"},
		})
	})
	e.mux.HandleFunc("GET /v1/operations/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !requireKey(w, r) {
			return
		}
		if r.URL.Query().Get("wait") != "30s" {
			writeErr(w, 400, "invalid_argument", "wait="+r.URL.Query().Get("wait"))
			return
		}
		state := "running"
		if polls.Add(1) >= 2 {
			state = "succeeded"
		}
		writeJSON(w, 200, map[string]any{"id": r.PathValue("id"), "state": state, "progress": 100,
			"result": map[string]any{"id": "sbx-0123456789abcdef", "state": "running"}})
	})
	ctx := context.Background()
	zero := int64(0)
	res, err := e.c.CreateSandbox(ctx, CreateRequest{Template: "base", Env: map[string]string{"A": "1"},
		Limits: Limits{MemoryBytes: 512 << 20}, TimeoutSeconds: &zero}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if res.Sandbox.ID != "sbx-0123456789abcdef" || res.Session.SandboxID != res.Sandbox.ID || res.Session.Token != "tok" {
		t.Fatalf("bad result %+v", res)
	}
	op, err := e.c.WaitOperation(ctx, res.Operation.ID)
	if err != nil {
		t.Fatal(err)
	}
	var sb Sandbox
	if err := op.DecodeResult(&sb); err != nil || sb.State != StateRunning {
		t.Fatalf("result %+v, %v", sb, err)
	}
	if polls.Load() != 2 {
		t.Fatalf("polled %d times", polls.Load())
	}
}

func TestWaitOperationFailed(t *testing.T) {
	e := newEnv(t)
	var calls atomic.Int32
	e.mux.HandleFunc("GET /v1/operations/{id}", func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			writeErr(w, 503, "unavailable", "try again") // transient: retried
			return
		}
		writeJSON(w, 200, map[string]any{"id": r.PathValue("id"), "kind": "sandbox.create", "state": "failed",
			"error": map[string]string{"code": "template_missing", "message": "no such template"}})
	})
	_, err := e.c.WaitOperation(context.Background(), "op-0000000000000001")
	var oe *OperationError
	if !errors.As(err, &oe) || oe.Operation.Error.Code != "template_missing" {
		t.Fatalf("err = %v", err)
	}
}

func TestAPIErrors(t *testing.T) {
	e := newEnv(t)
	e.mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, 404, "not_found", "sandbox not found")
	})
	e.mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(502)
		io.WriteString(w, "<html>bad gateway</html>")
	})
	ctx := context.Background()
	_, err := e.c.GetSandbox(ctx, "sbx-0000000000000000")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Code != "not_found" || ae.Message != "sandbox not found" || !IsNotFound(err) {
		t.Fatalf("err = %#v", err)
	}
	_, err = e.c.DeleteSandbox(ctx, "sbx-0000000000000000")
	if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != "http_502" || !strings.Contains(ae.Message, "bad gateway") {
		t.Fatalf("err = %#v", err)
	}
	if _, err := e.c.GetSandbox(ctx, ""); err == nil {
		t.Fatal("empty id accepted")
	}
	if _, err := e.c.GetSandbox(ctx, ".."); err == nil {
		t.Fatal("dot id accepted")
	}
}

func TestResponseBound(t *testing.T) {
	e := newEnv(t, WithMaxResponseBytes(1024))
	e.mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"templates":[{"name":"`+strings.Repeat("x", 4096)+`"}]}`)
	})
	if _, err := e.c.ListTemplates(context.Background()); err == nil || !strings.Contains(err.Error(), "larger than 1024") {
		t.Fatalf("err = %v", err)
	}
}

func TestListSandboxesPaging(t *testing.T) {
	e := newEnv(t)
	e.mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("state") != "running,creating" || q.Get("metadata.team") != "a b" || q.Get("limit") != "2" {
			writeErr(w, 400, "invalid_argument", r.URL.RawQuery)
			return
		}
		switch q.Get("page_token") {
		case "":
			writeJSON(w, 200, map[string]any{"sandboxes": []map[string]string{{"id": "sbx-1"}, {"id": "sbx-2"}}, "next_page_token": "sbx-2"})
		case "sbx-2":
			writeJSON(w, 200, map[string]any{"sandboxes": []map[string]string{{"id": "sbx-3"}}, "next_page_token": ""})
		}
	})
	var ids []string
	for sb, err := range e.c.AllSandboxes(context.Background(), ListOptions{State: []string{"running", "creating"},
		Metadata: map[string]string{"team": "a b"}, Limit: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	if strings.Join(ids, ",") != "sbx-1,sbx-2,sbx-3" {
		t.Fatalf("ids = %v", ids)
	}
}

// The operation stream drops once; the client reconnects with the last id
// and reports each state once even though the server repeats the snapshot.
func TestWatchOperationReconnects(t *testing.T) {
	e := newEnv(t)
	var conns atomic.Int32
	op := func(state string, pct int, at int) string {
		return fmt.Sprintf(`{"id":"op-0000000000000001","kind":"sandbox.create","state":%q,"progress":%d,"updated_at":"2025-01-01T00:00:%02dZ"}`, state, pct, at)
	}
	envelope := func(seq int, o string) string {
		return fmt.Sprintf(`{"seq":%d,"type":"operation.updated","operation_id":"op-0000000000000001","data":%s}`, seq, o)
	}
	e.mux.HandleFunc("GET /v1/operations/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		switch conns.Add(1) {
		case 1:
			if r.Header.Get("Last-Event-ID") != "" {
				t.Errorf("first connection sent Last-Event-ID %q", r.Header.Get("Last-Event-ID"))
			}
			sseStart(w)
			sseEventOut(w, "", "operation.updated", op("pending", 0, 0))
			sseEventOut(w, "5", "operation.updated", envelope(5, op("running", 50, 1)))
			sseEventOut(w, "6", "sandbox.state", `{"seq":6,"type":"sandbox.state","data":{}}`)
			// dropped here
		default:
			if got := r.Header.Get("Last-Event-ID"); got != "6" {
				t.Errorf("reconnected with Last-Event-ID %q, want 6", got)
			}
			sseStart(w)
			sseEventOut(w, "", "operation.updated", op("running", 50, 1))
			io.WriteString(w, ": keep-alive\n\n")
			sseEventOut(w, "7", "operation.updated", envelope(7, op("succeeded", 100, 2)))
		}
	})
	e.mux.HandleFunc("GET /v1/operations/{id}", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, op("running", 50, 1)) // asked when the stream ends early
	})
	var seen []string
	final, err := e.c.WatchOperation(context.Background(), "op-0000000000000001", func(o Operation) {
		seen = append(seen, fmt.Sprintf("%s/%d", o.State, o.Progress))
	})
	if err != nil {
		t.Fatal(err)
	}
	if final.State != OpSucceeded || strings.Join(seen, " ") != "pending/0 running/50 succeeded/100" {
		t.Fatalf("final %s, seen %v", final.State, seen)
	}
}

// fakeCommand serves a command's event stream, cutting connections after
// cut events to exercise resumption.
type fakeCommand struct {
	t      *testing.T
	events []string // "stdout:text", "stderr:text", "exit:{json}"
	cut    int      // events per connection before the connection drops (0: never)
	dup    bool     // on resume, repeat the last event the client already saw
	// streamStart: a POST that asks for a stream gets one (a start event,
	// then the events from the first, cut like a GET's).
	streamStart bool
	posts       int

	mu       sync.Mutex
	lastIDs  []string
	attempts int
}

func (f *fakeCommand) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer tok" {
		writeErr(w, 401, "unauthorized", "bad token")
		return
	}
	if r.PathValue("id") != "sbx-0123456789abcdef" || r.PathValue("cid") != "1" {
		writeErr(w, 404, "not_found", "no command")
		return
	}
	f.mu.Lock()
	f.attempts++
	f.lastIDs = append(f.lastIDs, r.Header.Get("Last-Event-ID"))
	f.mu.Unlock()
	after := 0
	fmt.Sscan(r.Header.Get("Last-Event-ID"), &after)
	start := after
	if f.dup && after > 0 {
		start--
	}
	sseStart(w)
	f.send(w, start)
}

// send writes the events from index start, cut after f.cut of them.
func (f *fakeCommand) send(w http.ResponseWriter, start int) {
	sent := 0
	for i := start; i < len(f.events); i++ {
		if f.cut > 0 && sent == f.cut {
			return
		}
		typ, data, _ := strings.Cut(f.events[i], ":")
		if typ != "exit" {
			data = base64.StdEncoding.EncodeToString([]byte(data))
		}
		sseEventOut(w, fmt.Sprint(i+1), typ, data)
		sent++
	}
}

func newCommandEnv(t *testing.T, f *fakeCommand, opts ...Option) (*env, *SandboxConn) {
	e := newEnv(t, opts...)
	f.t = t
	e.mux.HandleFunc("GET /v1/sandboxes/{id}/commands/{cid}/events", f.serve)
	e.mux.HandleFunc("GET /v1/sandboxes/{id}/commands/{cid}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"id": "1", "running": false, "last_event_id": len(f.events),
			"exit": map[string]any{"exit_code": 3}})
	})
	e.mux.HandleFunc("POST /v1/sandboxes/{id}/commands", func(w http.ResponseWriter, r *http.Request) {
		var spec map[string]any
		json.NewDecoder(r.Body).Decode(&spec)
		if spec["shell"] != "echo hi" || spec["timeout_ms"] != float64(1500) {
			writeErr(w, 400, "invalid_argument", fmt.Sprint(spec))
			return
		}
		f.mu.Lock()
		f.posts++
		f.mu.Unlock()
		if f.streamStart && strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(201)
			sseEventOut(w, "", "start", `{"id":"1","pid":10,"running":true}`)
			f.send(w, 0)
			return
		}
		writeJSON(w, 201, map[string]any{"id": "1", "pid": 10, "running": true})
	})
	return e, e.conn()
}

func TestStreamResumesWithoutLossOrDuplicates(t *testing.T) {
	f := &fakeCommand{events: []string{"stdout:a", "stderr:b", "stdout:c", "stdout:d", `exit:{"exit_code":3,"signal":""}`}, cut: 2, dup: true}
	_, sc := newCommandEnv(t, f)
	var out []string
	exit, err := sc.Stream(context.Background(), "1", 0, func(ev Event) error {
		out = append(out, fmt.Sprintf("%d:%s:%s", ev.Seq, ev.Type, ev.Data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if exit.Code != 3 {
		t.Fatalf("exit %+v", exit)
	}
	if got := strings.Join(out, " "); got != "1:stdout:a 2:stderr:b 3:stdout:c 4:stdout:d" {
		t.Fatalf("output %q", got)
	}
	// Connections: [1 2] [2dup 3] [3dup 4] [4dup exit].
	if got := strings.Join(f.lastIDs, ","); got != ",2,3,4" {
		t.Fatalf("Last-Event-IDs %q", got)
	}
}

func TestStreamAfterSeq(t *testing.T) {
	f := &fakeCommand{events: []string{"stdout:a", "stdout:b", `exit:{"exit_code":0}`}}
	_, sc := newCommandEnv(t, f)
	var out bytes.Buffer
	exit, err := sc.Stream(context.Background(), "1", 1, func(ev Event) error { out.Write(ev.Data); return nil })
	if err != nil || exit.Code != 0 || out.String() != "b" || f.lastIDs[0] != "1" {
		t.Fatalf("exit %+v err %v out %q ids %q", exit, err, out.String(), f.lastIDs)
	}
}

// Resuming after the exit event: the server has nothing more to send and
// closes; the command's state supplies the exit.
func TestStreamPastExit(t *testing.T) {
	f := &fakeCommand{events: []string{"stdout:a", `exit:{"exit_code":3}`}}
	_, sc := newCommandEnv(t, f)
	exit, err := sc.Stream(context.Background(), "1", 2, nil)
	if err != nil || exit.Code != 3 || f.attempts != 1 {
		t.Fatalf("exit %+v err %v attempts %d", exit, err, f.attempts)
	}
}

func TestStreamGivesUp(t *testing.T) {
	e := newEnv(t, WithStreamRetries(2))
	var n atomic.Int32
	e.mux.HandleFunc("GET /v1/sandboxes/{id}/commands/{cid}/events", func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		writeErr(w, 503, "unavailable", "node restarting")
	})
	_, err := e.conn().Stream(context.Background(), "1", 0, nil)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 503 || !strings.Contains(err.Error(), "gave up after 3 attempts") || n.Load() != 3 {
		t.Fatalf("err %v after %d attempts", err, n.Load())
	}
}

func TestStreamNoRetryOnClientError(t *testing.T) {
	e := newEnv(t)
	var n atomic.Int32
	e.mux.HandleFunc("GET /v1/sandboxes/{id}/commands/{cid}/events", func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		writeErr(w, 410, "events_gone", "output no longer retained")
	})
	_, err := e.conn().Stream(context.Background(), "1", 5, nil)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "events_gone" || n.Load() != 1 {
		t.Fatalf("err %v after %d attempts", err, n.Load())
	}
}

// A connection that goes silent (no keep-alives) is abandoned and resumed.
func TestStreamIdleReconnect(t *testing.T) {
	e := newEnv(t, WithIdleTimeout(200*time.Millisecond))
	var n atomic.Int32
	e.mux.HandleFunc("GET /v1/sandboxes/{id}/commands/{cid}/events", func(w http.ResponseWriter, r *http.Request) {
		sseStart(w)
		if n.Add(1) == 1 {
			sseEventOut(w, "1", "stdout", base64.StdEncoding.EncodeToString([]byte("x")))
			<-r.Context().Done() // hang until the client gives up on us
			return
		}
		if r.Header.Get("Last-Event-ID") != "1" {
			t.Errorf("Last-Event-ID %q", r.Header.Get("Last-Event-ID"))
		}
		sseEventOut(w, "2", "exit", `{"exit_code":0}`)
	})
	var got bytes.Buffer
	exit, err := e.conn().Stream(context.Background(), "1", 0, func(ev Event) error { got.Write(ev.Data); return nil })
	if err != nil || exit.Code != 0 || got.String() != "x" || n.Load() != 2 {
		t.Fatalf("exit %+v err %v out %q conns %d", exit, err, got.String(), n.Load())
	}
}

func TestStreamCallbackErrorStops(t *testing.T) {
	f := &fakeCommand{events: []string{"stdout:a", "stdout:b", `exit:{"exit_code":0}`}}
	_, sc := newCommandEnv(t, f)
	boom := errors.New("boom")
	_, err := sc.Stream(context.Background(), "1", 0, func(Event) error { return boom })
	if !errors.Is(err, boom) || f.attempts != 1 {
		t.Fatalf("err %v attempts %d", err, f.attempts)
	}
}

func TestRun(t *testing.T) {
	f := &fakeCommand{events: []string{"stdout:hello ", "stderr:oops", "stdout:world", `exit:{"exit_code":0}`}}
	_, sc := newCommandEnv(t, f)
	var stdout, stderr bytes.Buffer
	exit, err := sc.Run(context.Background(), ExecRequest{Shell: "echo hi", Timeout: 1500 * time.Millisecond}, &stdout, &stderr)
	if err != nil || exit.Code != 0 || stdout.String() != "hello world" || stderr.String() != "oops" {
		t.Fatalf("exit %+v err %v stdout %q stderr %q", exit, err, stdout.String(), stderr.String())
	}
}

func TestFilesAndControl(t *testing.T) {
	e := newEnv(t)
	files := map[string][]byte{}
	var mu sync.Mutex
	var log []string
	auth := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get("X-API-Key") != "" {
			writeErr(w, 401, "unauthorized", "bad token")
			return false
		}
		mu.Lock()
		log = append(log, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
		mu.Unlock()
		return true
	}
	e.mux.HandleFunc("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		files[r.URL.Query().Get("path")] = b
		mu.Unlock()
		w.WriteHeader(204)
	})
	e.mux.HandleFunc("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		mu.Lock()
		b, ok := files[r.URL.Query().Get("path")]
		mu.Unlock()
		if !ok {
			writeErr(w, 404, "not_found", "no such file")
			return
		}
		w.Write(b)
	})
	e.mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		if auth(w, r) {
			w.WriteHeader(204)
		}
	})
	e.mux.HandleFunc("GET /v1/sandboxes/{id}/files/list", func(w http.ResponseWriter, r *http.Request) {
		if auth(w, r) {
			writeJSON(w, 200, map[string]any{"entries": []map[string]any{{"name": "a", "path": "/tmp/a", "type": "file", "size": 3}}})
		}
	})
	e.mux.HandleFunc("POST /v1/sandboxes/{id}/commands/{cid}/signal", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		json.NewDecoder(r.Body).Decode(&body)
		if auth(w, r) && body["signal"] == "SIGTERM" {
			w.WriteHeader(204)
		}
	})
	e.mux.HandleFunc("POST /v1/sandboxes/{id}/commands/{cid}/stdin", func(w http.ResponseWriter, r *http.Request) {
		if auth(w, r) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			log = append(log, fmt.Sprintf("stdin %d", len(b)))
			mu.Unlock()
			w.WriteHeader(204)
		}
	})
	ctx := context.Background()
	sc := e.conn()
	if err := sc.Upload(ctx, "/tmp/hello world.txt", 0o755, strings.NewReader("hi there")); err != nil {
		t.Fatal(err)
	}
	rc, err := sc.Download(ctx, "/tmp/hello world.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hi there" {
		t.Fatalf("downloaded %q", b)
	}
	if _, err := sc.Download(ctx, "/nope"); !IsNotFound(err) {
		t.Fatalf("err = %v", err)
	}
	ents, err := sc.ListDir(ctx, "/tmp")
	if err != nil || len(ents) != 1 || ents[0].Size != 3 {
		t.Fatalf("entries %+v, %v", ents, err)
	}
	if err := sc.Remove(ctx, "/tmp/d", true); err != nil {
		t.Fatal(err)
	}
	if err := sc.Signal(ctx, "1", "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if err := sc.WriteStdin(ctx, "1", make([]byte, maxStdinChunk+10)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"PUT /v1/sandboxes/sbx-0123456789abcdef/files?mode=0755&path=%2Ftmp%2Fhello+world.txt",
		"GET /v1/sandboxes/sbx-0123456789abcdef/files?path=%2Ftmp%2Fhello+world.txt",
		"GET /v1/sandboxes/sbx-0123456789abcdef/files?path=%2Fnope",
		"GET /v1/sandboxes/sbx-0123456789abcdef/files/list?path=%2Ftmp",
		"DELETE /v1/sandboxes/sbx-0123456789abcdef/files?path=%2Ftmp%2Fd&recursive=true",
		"POST /v1/sandboxes/sbx-0123456789abcdef/commands/1/signal?",
		"POST /v1/sandboxes/sbx-0123456789abcdef/commands/1/stdin?",
		fmt.Sprintf("stdin %d", maxStdinChunk),
		"POST /v1/sandboxes/sbx-0123456789abcdef/commands/1/stdin?",
		"stdin 10",
	}
	if strings.Join(log, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(log, "\n"), strings.Join(want, "\n"))
	}
	bad := NewSandboxConn(Session{Token: "x", DataURL: e.srv.URL})
	if _, err := bad.Exec(ctx, ExecRequest{Shell: "true"}); err == nil {
		t.Fatal("session without sandbox id accepted")
	}
}

// ExecStream reads the events on the POST's own answer; a cut answer is
// resumed with a GET after the last event, without loss or repeats.
func TestExecStream(t *testing.T) {
	for _, cut := range []int{0, 2} {
		f := &fakeCommand{events: []string{"stdout:a", "stderr:b", "stdout:c", `exit:{"exit_code":3}`}, cut: cut, dup: true, streamStart: true}
		_, sc := newCommandEnv(t, f)
		var out []string
		cmd, exit, err := sc.ExecStreamStarted(context.Background(), ExecRequest{Shell: "echo hi", Timeout: 1500 * time.Millisecond}, func(c Command) error {
			out = append(out, "started:"+c.ID) // before any event
			return nil
		}, func(ev Event) error {
			out = append(out, fmt.Sprintf("%d:%s:%s", ev.Seq, ev.Type, ev.Data))
			return nil
		})
		if err != nil || cmd.ID != "1" || cmd.PID != 10 || exit.Code != 3 {
			t.Fatalf("cut %d: cmd %+v exit %+v err %v", cut, cmd, exit, err)
		}
		if got := strings.Join(out, " "); got != "started:1 1:stdout:a 2:stderr:b 3:stdout:c" {
			t.Fatalf("cut %d: output %q", cut, got)
		}
		wantGets := ""
		if cut > 0 {
			wantGets = "2,3" // the POST carried events 1 and 2, each GET one more
		}
		if f.posts != 1 || strings.Join(f.lastIDs, ",") != wantGets {
			t.Fatalf("cut %d: %d POSTs, GETs after %q", cut, f.posts, f.lastIDs)
		}
	}
	// A server that answers the start with JSON: started still comes first.
	f := &fakeCommand{events: []string{"stdout:a", `exit:{"exit_code":0}`}}
	_, sc := newCommandEnv(t, f)
	var out []string
	req := ExecRequest{Shell: "echo hi", Timeout: 1500 * time.Millisecond}
	_, _, err := sc.ExecStreamStarted(context.Background(), req, func(c Command) error {
		out = append(out, "started:"+c.ID)
		return nil
	}, func(ev Event) error {
		out = append(out, fmt.Sprintf("%d:%s:%s", ev.Seq, ev.Type, ev.Data))
		return nil
	})
	if got := strings.Join(out, " "); err != nil || got != "started:1 1:stdout:a" {
		t.Fatalf("JSON start: %q, %v", got, err)
	}
	// An error from started ends the call with it.
	stop := errors.New("stop here")
	_, sc = newCommandEnv(t, &fakeCommand{events: []string{"stdout:a", `exit:{"exit_code":0}`}, streamStart: true})
	if _, _, err := sc.ExecStreamStarted(context.Background(), req, func(Command) error { return stop }, nil); !errors.Is(err, stop) {
		t.Fatalf("started's error: %v", err)
	}
}
