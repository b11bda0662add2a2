package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestPortURLs(t *testing.T) {
	for _, tc := range []struct {
		data, domain, want string
	}{
		{"http://127.0.0.1:3001", "localhost:3001", "http://8000-sbx-1.localhost:3001/"},
		{"https://data.example.com", "sbx.example.com", "https://8000-sbx-1.sbx.example.com/"},
		{"http://127.0.0.1:3001", "", "http://8000-sbx-1.localhost:3001/"}, // an older server: derived
		{"https://data.example.com:443/", "", "https://8000-sbx-1.data.example.com/"},
	} {
		c := NewSandboxConn(Session{SandboxID: "sbx-1", Token: "t", DataURL: tc.data, Domain: tc.domain})
		if got, err := c.PortURL(8000); err != nil || got != tc.want {
			t.Errorf("PortURL(%s, %q) = %q, %v; want %q", tc.data, tc.domain, got, err, tc.want)
		}
	}
	c := NewSandboxConn(Session{SandboxID: "sbx-1", Token: "t", DataURL: "http://d:1/"})
	if got, _ := c.PortPathURL(80); got != "http://d:1/v1/sandboxes/sbx-1/ports/80/" {
		t.Errorf("PortPathURL: %q", got)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := c.PortURL(p); err == nil {
			t.Errorf("PortURL(%d): no error", p)
		}
	}
	if _, err := NewSandboxConn(Session{Token: "t", DataURL: "http://d"}).PortURL(80); err == nil {
		t.Error("PortURL without a sandbox id: no error")
	}
}

func TestListAndWaitForPort(t *testing.T) {
	e := newEnv(t)
	var waits atomic.Int32
	var never atomic.Bool
	e.mux.HandleFunc("GET /v1/sandboxes/{id}/ports", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			writeErr(w, 401, "unauthorized", "no token")
			return
		}
		p := map[string]any{"port": 8000, "address": "0.0.0.0", "family": "tcp", "url": "http://8000-x.localhost/"}
		if r.URL.Query().Get("wait") == "" {
			writeJSON(w, 200, map[string]any{"ports": []any{p}})
			return
		}
		if r.URL.Query().Get("wait") != "9000" || r.URL.Query().Get("timeout_ms") == "" {
			writeErr(w, 400, "invalid_request", "bad wait "+r.URL.RawQuery)
			return
		}
		if never.Load() {
			writeErr(w, 504, "port_timeout", "nothing listened")
			return
		}
		switch waits.Add(1) {
		case 1, 2:
			writeErr(w, 504, "port_timeout", "nothing listened")
		case 3:
			writeErr(w, 503, "unavailable", "restarting")
		default:
			writeJSON(w, 200, map[string]any{"ports": []any{p, map[string]any{"port": 9000, "address": "::", "family": "tcp6"}}})
		}
	})
	sc := e.conn()
	ctx := context.Background()
	ports, err := sc.ListPorts(ctx)
	if err != nil || len(ports) != 1 || ports[0].Port != 8000 || ports[0].URL == "" {
		t.Fatalf("ListPorts: %+v %v", ports, err)
	}
	p, err := sc.WaitForPort(ctx, 9000)
	if err != nil || p.Port != 9000 || p.Family != "tcp6" || waits.Load() != 4 {
		t.Fatalf("WaitForPort: %+v %v after %d requests", p, err, waits.Load())
	}
	// A context that ends stops the wait.
	never.Store(true)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := sc.WaitForPort(cctx, 9000); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForPort past the deadline: %v", err)
	}
	if _, err := sc.WaitForPort(ctx, 0); err == nil {
		t.Fatal("WaitForPort(0): no error")
	}
}

func TestSignedPortURL(t *testing.T) {
	e := newEnv(t)
	e.mux.HandleFunc("POST /v1/sandboxes/{id}/ports/{port}/url", func(w http.ResponseWriter, r *http.Request) {
		if !requireKey(w, r) {
			return
		}
		b, _ := io.ReadAll(r.Body)
		if r.PathValue("port") != "8000" || string(b) != `{"ttl_seconds":90}` {
			writeErr(w, 400, "invalid_request", string(b))
			return
		}
		writeJSON(w, 200, map[string]any{"url": "http://8000-" + r.PathValue("id") + ".localhost/?space_token=spt_x",
			"path_url": "http://d/v1/sandboxes/x/ports/8000/?space_token=spt_x", "token": "spt_x", "expires_at": time.Now().Add(time.Minute)})
	})
	s, err := e.c.SignedPortURL(context.Background(), "sbx-1", 8000, 90*time.Second)
	if err != nil || s.Token != "spt_x" || !strings.Contains(s.URL, "8000-sbx-1.") || s.ExpiresAt.IsZero() {
		t.Fatalf("SignedPortURL: %+v %v", s, err)
	}
	if _, err := e.c.SignedPortURL(context.Background(), "sbx-1", 70000, 0); err == nil {
		t.Fatal("port 70000: no error")
	}
}

// TestPortTransport: requests to the sandbox's port hosts reach the data
// plane's address (no DNS for them) with the token; other hosts get no
// token.
func TestPortTransport(t *testing.T) {
	var gotHost, gotTok atomic.Value
	data := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHost.Store(r.Host)
		gotTok.Store(r.Header.Get(PortTokenHeader))
		io.WriteString(w, "ok")
	}))
	defer data.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotTok.Store(r.Header.Get(PortTokenHeader))
		io.WriteString(w, "other")
	}))
	defer other.Close()
	port := data.URL[strings.LastIndexByte(data.URL, ':')+1:]
	for _, domain := range []string{"localhost:" + port, "sbx.invalid"} {
		sc := NewSandboxConn(Session{SandboxID: "sbx-0123456789abcdef", Token: "sst_tok", DataURL: data.URL, Domain: domain})
		tr, err := sc.PortTransport()
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: tr}
		u, _ := sc.PortURL(8000)
		if domain == "sbx.invalid" {
			u = strings.Replace(u, "sbx.invalid/", "sbx.invalid:"+port+"/", 1) // listener port on a domain without one
		}
		get := func(u string) string {
			resp, err := hc.Get(u)
			if err != nil {
				t.Fatalf("GET %s: %v", u, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return string(b)
		}
		if body := get(u + "x"); body != "ok" || gotTok.Load() != "sst_tok" || !strings.HasPrefix(gotHost.Load().(string), "8000-sbx-0123456789abcdef.") {
			t.Fatalf("%s: %q host %v token %v", u, body, gotHost.Load(), gotTok.Load())
		}
		pu, _ := sc.PortPathURL(8000)
		if body := get(pu); body != "ok" || gotTok.Load() != "sst_tok" {
			t.Fatalf("path form: %q token %v", body, gotTok.Load())
		}
		if body := get(other.URL + "/v1/sandboxes/sbx-0123456789abcdef/ports/8000/"); body != "other" || gotTok.Load() != "" {
			t.Fatalf("another host got the token: %q %v", body, gotTok.Load())
		}
		// Another sandbox's port host is not this transport's.
		if tr.isPortHost("8000-sbx-ffffffffffffffff." + domain) {
			t.Fatal("another sandbox's host matched")
		}
		tr.CloseIdleConnections()
	}
}
