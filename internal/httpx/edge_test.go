package httpx

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// edgeServer serves h behind Limits, on Listener, over loopback, as the
// space server does.
func edgeServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Limits(h), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: ServerMaxHeaderBytes}
	go srv.Serve(Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// rawRequest writes req on a new connection and reads the answer.
func rawRequest(t *testing.T, addr, req string) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	go io.WriteString(c, req) // the server may answer before it read everything
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func envelope(t *testing.T, resp *http.Response) (code, msg string) {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%d answer has Content-Type %q, want application/json", resp.StatusCode, ct)
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Fatalf("%d answer is not the JSON error envelope: %q (%v)", resp.StatusCode, body, err)
	}
	return e.Error.Code, e.Error.Message
}

func TestEdgeLimitsOverLoopback(t *testing.T) {
	addr := edgeServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A handler answer that looks like net/http's own must pass as it is.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, "handler text")
	}))
	get := func(target string, header string) string {
		return "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + header + "\r\n"
	}
	cases := []struct {
		name, req string
		status    int
		code      string
	}{
		{"long URI", get("/?q="+strings.Repeat("a", MaxURIBytes), ""), 414, "uri_too_long"},
		{"large headers", get("/", "X-Big: "+strings.Repeat("b", MaxHeaderBytes)+"\r\n"), 431, "header_too_large"},
		{"many headers", get("/", strings.Repeat("X-Many: "+strings.Repeat("c", 1000)+"\r\n", 70)), 431, "header_too_large"},
		// Past what net/http reads at all: its own 431, rewritten.
		{"huge headers", get("/", "X-Huge: "+strings.Repeat("d", 2*ServerMaxHeaderBytes)+"\r\n"), 431, "header_too_large"},
		{"huge URI", get("/?q="+strings.Repeat("e", 2*ServerMaxHeaderBytes), ""), 431, "header_too_large"},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", 400, "malformed_request"},
		{"bad header line", "GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400, "malformed_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := rawRequest(t, addr, c.req)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			if code, _ := envelope(t, resp); code != c.code {
				t.Fatalf("code %q, want %q", code, c.code)
			}
		})
	}
	t.Run("handler answer untouched", func(t *testing.T) {
		resp := rawRequest(t, addr, get("/", "X-Small: 1\r\n"))
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || string(body) != "handler text" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Fatalf("handler answer changed: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	})
}

func TestRewriteGoErrorOnlyMatchesNetHTTPAnswers(t *testing.T) {
	for _, p := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nx",
		"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nDate: x\r\n\r\n",
		"HTTP/1.1 400 Bad Request\r\nX: y" + goErrorHeaders + "body",
		"hello" + goErrorHeaders,
	} {
		if _, ok := rewriteGoError([]byte(p)); ok {
			t.Errorf("rewrote %q", p)
		}
	}
	out, ok := rewriteGoError([]byte("HTTP/1.1 400 Bad Request: missing required Host header" + goErrorHeaders + "400 Bad Request: missing required Host header"))
	if !ok || !strings.Contains(string(out), `"code":"malformed_request"`) || !strings.Contains(string(out), "missing required Host header") {
		t.Fatalf("rewrite = %q %v", out, ok)
	}
}

func TestCheckContentType(t *testing.T) {
	jsonOnly := []string{"application/json"}
	raw := []string{"*/*", "application/octet-stream"}
	tarball := []string{"application/octet-stream", "application/x-tar"}
	multipart := []string{"multipart/form-data"}
	cases := []struct {
		header   string
		accepted []string
		ok       bool
	}{
		{"application/json", jsonOnly, true},
		{"Application/JSON; charset=utf-8", jsonOnly, true},
		{"", jsonOnly, true}, // no Content-Type: read as JSON
		{"text/plain", jsonOnly, false},
		{"application/x-www-form-urlencoded", jsonOnly, false},
		{"multipart/form-data; boundary=x", jsonOnly, false},
		{"application/json;;", jsonOnly, false}, // does not parse
		{"", raw, true},
		{"text/x-python", raw, true},
		{"application/json", raw, true},
		{"multipart/form-data; boundary=x", raw, false},
		{"application/x-tar", tarball, true},
		{"", tarball, true},
		{"application/json", tarball, false},
		{"multipart/form-data; boundary=x", multipart, true},
		{"", multipart, false},
		{"application/json", multipart, false},
	}
	for _, c := range cases {
		err := CheckContentType(c.header, c.accepted)
		if (err == nil) != c.ok {
			t.Errorf("%q for %v: %v, want ok=%v", c.header, c.accepted, err, c.ok)
			continue
		}
		if err != nil {
			if st, code, _ := StatusOf(err); st != 415 || code != "unsupported_media_type" {
				t.Errorf("%q: %d %s", c.header, st, code)
			}
		}
	}
}

func TestContentTypesFromDocument(t *testing.T) {
	doc := []byte(`{"paths":{
		"/j":{"post":{"requestBody":{"content":{"application/json":{}}}},"get":{}},
		"/m/{id}":{"post":{"requestBody":{"content":{"multipart/form-data":{}}}}}}}`)
	mux := http.NewServeMux()
	for _, p := range []string{"POST /j", "GET /j", "POST /m/{id}", "POST /none"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	}
	h, err := ContentTypes(doc, mux, mux)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		method, path, ct, body string
		want                   int
	}{
		{"POST", "/j", "application/json", "{}", 204},
		{"POST", "/j", "", "{}", 204},
		{"POST", "/j", "text/plain", "{}", 415},
		{"POST", "/j", "text/plain", "", 204}, // no body: nothing to check
		{"GET", "/j", "text/plain", "x", 204}, // no documented body
		{"POST", "/m/1", "multipart/form-data; boundary=b", "--b--", 204},
		{"POST", "/m/1", "application/json", "{}", 415},
		{"POST", "/none", "text/plain", "x", 204}, // not in the document
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
		if c.ct != "" {
			r.Header.Set("Content-Type", c.ct)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s %s %q: %d %s, want %d", c.method, c.path, c.ct, w.Code, w.Body, c.want)
		}
		if w.Code == 415 && !strings.Contains(w.Body.String(), `"unsupported_media_type"`) {
			t.Errorf("415 without the envelope: %s", w.Body)
		}
	}
}
