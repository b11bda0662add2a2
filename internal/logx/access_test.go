package logx_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/logx"
)

// TestAccessInternalErrorCause: an internal error's cause goes in the
// request's log line and never in the answer (CI had a 500 "internal
// error" on the node's data plane with nothing to say why).
func TestAccessInternalErrorCause(t *testing.T) {
	var buf lockedBuf
	l, _ := logx.New(&buf, "json", "info")
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/fail", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteError(w, fmt.Errorf("agent: dial /var/lib/space/secret.sock: %w", errors.New("connection refused")))
	})
	mux.HandleFunc("GET /v1/gone", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteError(w, fmt.Errorf("sandbox x: %w", core.ErrNotFound))
	})
	srv := httptest.NewServer(logx.Access(mux, logx.AccessOptions{Logger: l, Plane: "data"}))
	defer srv.Close()
	for _, c := range []struct{ method, path string }{{"POST", "/v1/fail"}, {"GET", "/v1/gone"}} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "secret.sock") {
			t.Errorf("%s answered the cause: %s", c.path, body)
		}
	}
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 2 {
		t.Fatalf("want 2 records: %v", recs)
	}
	if e, _ := recs[0]["error"].(string); recs[0]["status"] != float64(500) || !strings.Contains(e, "connection refused") {
		t.Errorf("500 record lacks its cause: %v", recs[0])
	}
	if _, ok := recs[1]["error"]; ok {
		t.Errorf("a 404 record carries an error attribute: %v", recs[1])
	}
}

// lockedBuf is a log sink the server's goroutines and the test share.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
