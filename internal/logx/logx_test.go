package logx

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/space-sandbox/space/internal/audit"
)

// syncBuf is a buffer handlers may write to from several goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// records parses JSON lines.
func (s *syncBuf) records(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(s.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func find(recs []map[string]any, msg string) map[string]any {
	for _, r := range recs {
		if r["msg"] == msg {
			return r
		}
	}
	return nil
}

func TestNew(t *testing.T) {
	var buf syncBuf
	l, err := New(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	l.Debug("hidden")
	l.InfoContext(audit.WithRequestID(context.Background(), "req-1"), "with id", "k", 1)
	l.Warn("plain")
	recs := buf.records(t)
	if len(recs) != 2 {
		t.Fatalf("records %v: debug must be filtered at info", recs)
	}
	if r := recs[0]; r["msg"] != "with id" || r["level"] != "INFO" || r["request_id"] != "req-1" || r["k"] != float64(1) || r["time"] == nil {
		t.Errorf("record %v", r)
	}
	if _, ok := recs[1]["request_id"]; ok {
		t.Errorf("a record without a context has no request id: %v", recs[1])
	}
	var text bytes.Buffer
	tl, err := New(&text, "text", "debug")
	if err != nil {
		t.Fatal(err)
	}
	tl.Debug("dbg", "a", "b")
	if !strings.Contains(text.String(), "level=DEBUG msg=dbg a=b") {
		t.Errorf("text: %q", text.String())
	}
	for _, bad := range [][2]string{{"xml", "info"}, {"json", "loud"}, {"json", "info+2"}} {
		if _, err := New(io.Discard, bad[0], bad[1]); err == nil {
			t.Errorf("New(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

// Logf turns a printf line into a record: msg, component, the ids in it,
// warn with the error when an argument is one.
func TestLogf(t *testing.T) {
	var buf syncBuf
	l, _ := New(&buf, "json", "info")
	logf := Logf(l)
	logf("reaper: delete %s: %v", "sbx-0123456789abcdef", errors.New("boom"))
	logf("operation %s: done", "op-00000000000000aa")
	logf("warm pool: %d ready", 3)
	recs := buf.records(t)
	if len(recs) != 3 {
		t.Fatalf("records %v", recs)
	}
	if r := recs[0]; r["msg"] != "reaper: delete sbx-0123456789abcdef: boom" || r["level"] != "WARN" || r["component"] != "reaper" ||
		r["sandbox"] != "sbx-0123456789abcdef" || r["error"] != "boom" {
		t.Errorf("error line: %v", r)
	}
	if r := recs[1]; r["level"] != "INFO" || r["component"] != "operation" || r["operation"] != "op-00000000000000aa" {
		t.Errorf("operation line: %v", r)
	}
	if r := recs[2]; r["msg"] != "warm pool: 3 ready" || r["component"] != "warm" {
		t.Errorf("plain line: %v", r)
	}
	// FromLogf renders records back into a printf sink (tests' t.Logf).
	var lines []string
	fl := FromLogf(func(f string, a ...any) { lines = append(lines, strings.TrimSpace(sprintf(f, a...))) })
	fl.WarnContext(audit.WithRequestID(context.Background(), "req-9"), "x happened", "n", 2)
	if len(lines) != 1 || lines[0] != "WARN x happened n=2 request_id=req-9" {
		t.Errorf("FromLogf: %q", lines)
	}
}

func TestAccess(t *testing.T) {
	var buf syncBuf
	l, _ := New(&buf, "json", "info")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/things/{id}", func(w http.ResponseWriter, r *http.Request) {
		if audit.RequestID(r.Context()) != r.Header.Get("X-Request-Id") {
			t.Errorf("request id in the context %q, header %q", audit.RequestID(r.Context()), r.Header.Get("X-Request-Id"))
		}
		SetPrincipal(r.Context(), Principal{Project: "p1", KeyID: "k1"})
		w.Write([]byte("hello"))
		w.(http.Flusher).Flush() // streaming handlers keep working
	})
	mux.HandleFunc("POST /v1/boom", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	h := Access(mux, AccessOptions{Logger: l, Plane: "control", Routes: []string{"GET /v1/things/{id}", "POST /v1/boom", "GET /healthz"},
		Quiet: []string{"/healthz"}, Identify: func(r *http.Request) Principal { return Principal{Project: "from-token", Sandbox: "sbx-1"} }})
	srv := httptest.NewServer(h)
	defer srv.Close()
	do := func(method, path, id string) *http.Response {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		if id != "" {
			req.Header.Set("X-Request-Id", id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if got := do("GET", "/v1/things/42", "client-id-1").Header.Get("X-Request-Id"); got != "client-id-1" {
		t.Errorf("a sane client request id is kept: %q", got)
	}
	if got := do("POST", "/v1/boom", "bad id with spaces").Header.Get("X-Request-Id"); !strings.HasPrefix(got, "req-") {
		t.Errorf("an insane request id is replaced: %q", got)
	}
	do("GET", "/healthz", "")
	do("GET", "/nowhere", "")
	recs := buf.records(t)
	if len(recs) != 3 {
		t.Fatalf("want 3 access records (health checks at debug): %v", recs)
	}
	r := recs[0]
	for k, want := range map[string]any{"msg": "http request", "level": "INFO", "plane": "control", "method": "GET", "pattern": "GET /v1/things/{id}",
		"path": "/v1/things/42", "status": float64(200), "bytes": float64(5), "request_id": "client-id-1", "project": "p1", "key_id": "k1"} {
		if r[k] != want {
			t.Errorf("%s = %v, want %v (%v)", k, r[k], want, r)
		}
	}
	if _, ok := r["duration_ms"].(float64); !ok {
		t.Errorf("no duration_ms: %v", r)
	}
	if r := recs[1]; r["level"] != "WARN" || r["status"] != float64(503) || r["pattern"] != "POST /v1/boom" || r["project"] != "from-token" || r["sandbox"] != "sbx-1" {
		t.Errorf("5xx record (warn, principal from Identify): %v", r)
	}
	if r := recs[2]; r["status"] != float64(404) || r["pattern"] != "" {
		t.Errorf("unrouted record: %v", r)
	}
	if find(recs, "http request") == nil {
		t.Fatal("no access record")
	}
}

func sprintf(f string, a ...any) string { return fmt.Sprintf(f, a...) }
