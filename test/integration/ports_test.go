package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// portServerBin builds testdata/portserver once per test binary.
var portServerBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "portserver")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "portserver")
	build := exec.Command("go", "build", "-o", bin, "./test/integration/testdata/portserver")
	build.Dir = repoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build portserver: %v\n%s", err, out)
	}
	return bin, nil
})

// startPortServer uploads the port server, starts it on addr inside the
// sandbox and waits (through the port listing) until it listens.
func startPortServer(t *testing.T, sb *sandbox, addr string, port int) {
	t.Helper()
	bin, err := portServerBin()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(bin)
	if st, m, err := doRaw(sb, "PUT", "/files?path=/tmp/portserver&mode=0755", string(raw)); err != nil || st != 204 {
		t.Fatalf("upload portserver: %d %v %v", st, m, err)
	}
	sb.start(t, map[string]any{"argv": []string{"/tmp/portserver", "-listen", addr}})
	st, m, err := sb.dp("GET", fmt.Sprintf("/ports?wait=%d&timeout_ms=20000", port), nil)
	if err != nil || st != 200 {
		t.Fatalf("wait for port %d: %d %v %v", port, st, m, err)
	}
	found := false
	for _, p := range m["ports"].([]any) {
		pm := p.(map[string]any)
		if int(pm["port"].(float64)) == port {
			found = true
			if !strings.Contains(pm["url"].(string), fmt.Sprintf("://%d-%s.", port, sb.ID)) || !strings.HasSuffix(pm["path_url"].(string), fmt.Sprintf("/v1/sandboxes/%s/ports/%d/", sb.ID, port)) {
				t.Fatalf("port listing urls: %v", pm)
			}
		}
	}
	if !found {
		t.Fatalf("port %d not listed: %v", port, m)
	}
}

// portClient sends every request to the data listener whatever the URL's
// host, as wildcard DNS for the sandbox domain would.
func portClient(data string, h2c bool) *http.Client {
	u, _ := url.Parse(data)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, u.Host)
		},
		DisableCompression: true,
	}
	if h2c {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	return &http.Client{Transport: tr, Timeout: 2 * time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// hostURL is the host form of a port: "http://8000-<id>.localhost:<data port>".
func hostURL(sb *sandbox, port int) string {
	u, _ := url.Parse(sb.Data)
	return fmt.Sprintf("http://%d-%s.localhost:%s", port, sb.ID, u.Port())
}

func get(t *testing.T, c *http.Client, u string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// wantError checks a JSON error answer.
func wantError(t *testing.T, what string, resp *http.Response, body string, status int, code string) {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if resp.StatusCode != status || json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != code {
		t.Fatalf("%s: %d %s, want %d with code %s", what, resp.StatusCode, body, status, code)
	}
}

func TestPortForwarding(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	defer sb.delete(t)
	other := e.create(t, nil)
	defer other.delete(t)
	startPortServer(t, sb, "127.0.0.1:8000", 8000)
	c := portClient(sb.Data, false)
	auth := map[string]string{"X-Access-Token": sb.Token}

	t.Run("host form", func(t *testing.T) {
		resp, body := get(t, c, hostURL(sb, 8000)+"/", auth)
		if resp.StatusCode != 200 || !strings.Contains(body, "portserver listing") {
			t.Fatalf("listing: %d %s", resp.StatusCode, body)
		}
		// The server sees the client's Host, no SPACE credentials, and
		// its cookies lose the Domain attribute.
		resp, body = get(t, c, hostURL(sb, 8000)+"/echo/x?a=1&space_token=zzz", map[string]string{"X-Access-Token": sb.Token, "Cookie": "space_port_token=abc; app=2"})
		var echo struct {
			Path     string
			RawQuery string `json:"raw_query"`
			Host     string
			Headers  map[string][]string
		}
		json.Unmarshal([]byte(body), &echo)
		if resp.StatusCode != 200 || echo.Host != strings.TrimPrefix(hostURL(sb, 8000), "http://") {
			t.Fatalf("echo: %d %s", resp.StatusCode, body)
		}
		if _, ok := echo.Headers["X-Access-Token"]; ok || strings.Contains(strings.Join(echo.Headers["Cookie"], ";"), "space_port_token") || strings.Contains(echo.RawQuery, "space_token") {
			t.Fatalf("credentials reached the sandbox: %s", body)
		}
		if echo.Headers["Cookie"][0] != "app=2" || echo.RawQuery != "a=1" || len(echo.Headers["X-Forwarded-For"]) != 1 {
			t.Fatalf("request not passed on as sent: %s", body)
		}
		if sc := resp.Header.Get("Set-Cookie"); sc == "" || strings.Contains(strings.ToLower(sc), "domain") {
			t.Fatalf("Set-Cookie %q: the Domain attribute must be dropped", sc)
		}
	})

	t.Run("path form", func(t *testing.T) {
		base := sb.Data + "/v1/sandboxes/" + sb.ID + "/ports/8000"
		resp, _ := get(t, c, base+"?q=1", auth)
		if resp.StatusCode != 308 || resp.Header.Get("Location") != "/v1/sandboxes/"+sb.ID+"/ports/8000/?q=1" {
			t.Fatalf("bare prefix: %d %v", resp.StatusCode, resp.Header)
		}
		resp, body := get(t, c, base+"/echo/a%2Fb?x=y", auth)
		if resp.StatusCode != 200 || !strings.Contains(body, `"path":"/echo/a/b"`) || !strings.Contains(body, "/v1/sandboxes/"+sb.ID+"/ports/8000") {
			t.Fatalf("path form echo: %d %s", resp.StatusCode, body)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "sandbox") {
			t.Fatalf("path form page not sandboxed: CSP %q", csp)
		}
	})

	t.Run("access control", func(t *testing.T) {
		for _, u := range []string{hostURL(sb, 8000) + "/", sb.Data + "/v1/sandboxes/" + sb.ID + "/ports/8000/"} {
			resp, body := get(t, c, u, nil)
			wantError(t, "no token", resp, body, 401, "unauthorized")
			resp, body = get(t, c, u, map[string]string{"X-Access-Token": "sst_forged.token"})
			wantError(t, "bad token", resp, body, 401, "unauthorized")
			resp, body = get(t, c, u, map[string]string{"X-Access-Token": other.Token})
			wantError(t, "another sandbox's token", resp, body, 404, "not_found")
		}
		// A sandbox that does not exist answers like a private one.
		resp, body := get(t, c, fmt.Sprintf("http://8000-sbx-0000000000000000.localhost:%s/", portOf(sb.Data)), nil)
		wantError(t, "no such sandbox", resp, body, 401, "unauthorized")
		resp, body = get(t, c, hostURL(sb, 8001)+"/", auth)
		wantError(t, "closed port", resp, body, 502, "port_not_listening")
		// Another project cannot mint a URL for the sandbox.
		if st, m, _ := e.call("POST", "/v1/sandboxes/"+sb.ID+"/ports/8000/url", e.key2, map[string]any{}); st != 404 {
			t.Fatalf("other project's port URL: %d %v", st, m)
		}
	})

	t.Run("signed url", func(t *testing.T) {
		st, m, err := e.call("POST", "/v1/sandboxes/"+sb.ID+"/ports/8000/url", e.key, map[string]any{"ttl_seconds": 60})
		if err != nil || st != 200 {
			t.Fatalf("mint: %d %v %v", st, m, err)
		}
		resp, body := get(t, c, m["url"].(string), nil)
		if resp.StatusCode != 200 || !strings.Contains(body, "portserver listing") {
			t.Fatalf("signed host URL: %d %s", resp.StatusCode, body)
		}
		var cookie *http.Cookie
		for _, ck := range resp.Cookies() {
			if ck.Name == "space_port_token" {
				cookie = ck
			}
		}
		if cookie == nil || !cookie.HttpOnly || cookie.Path != "/" {
			t.Fatalf("no token cookie: %v", resp.Header["Set-Cookie"])
		}
		// The page's own requests carry only the cookie.
		resp, body = get(t, c, hostURL(sb, 8000)+"/echo/", map[string]string{"Cookie": "space_port_token=" + cookie.Value})
		if resp.StatusCode != 200 {
			t.Fatalf("with the cookie: %d %s", resp.StatusCode, body)
		}
		resp, body = get(t, c, m["path_url"].(string), nil)
		if resp.StatusCode != 200 {
			t.Fatalf("signed path URL: %d %s", resp.StatusCode, body)
		}
		// A port token opens its port only, and no data-plane route.
		resp, body = get(t, c, hostURL(sb, 8001)+"/", map[string]string{"Cookie": "space_port_token=" + cookie.Value})
		wantError(t, "port token on another port", resp, body, 404, "not_found")
		if st, _, _ := doJSON("GET", sb.Data+"/v1/sandboxes/"+sb.ID+"/commands", map[string]string{"X-Access-Token": m["token"].(string)}, nil); st != 401 {
			t.Fatalf("port token on the data plane: %d", st)
		}
		st, m, _ = e.call("POST", "/v1/sandboxes/"+sb.ID+"/ports/8000/url", e.key, map[string]any{"ttl_seconds": 1})
		if st != 200 {
			t.Fatal(st, m)
		}
		time.Sleep(2100 * time.Millisecond)
		resp, body = get(t, c, m["url"].(string), nil)
		wantError(t, "expired URL", resp, body, 401, "token_expired")
		for _, bad := range []any{0, -1, 8 * 24 * 3600, "x"} {
			if st, _, _ := e.call("POST", "/v1/sandboxes/"+sb.ID+"/ports/8000/url", e.key, map[string]any{"ttl_seconds": bad}); st != 400 {
				t.Fatalf("ttl %v: %d", bad, st)
			}
		}
		if st, _, _ := e.call("POST", "/v1/sandboxes/"+sb.ID+"/ports/70000/url", e.key, map[string]any{}); st != 400 {
			t.Fatalf("port 70000: %d", st)
		}
	})

	t.Run("100MB both ways", func(t *testing.T) {
		const n = 100 << 20
		req, _ := http.NewRequest("GET", hostURL(sb, 8000)+fmt.Sprintf("/blob?bytes=%d&seed=7", n), nil)
		req.Header.Set("X-Access-Token", sb.Token)
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		got, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		want := sha256.New()
		io.CopyN(want, rand.New(rand.NewSource(7)), n)
		if err != nil || got != n || hex.EncodeToString(h.Sum(nil)) != hex.EncodeToString(want.Sum(nil)) {
			t.Fatalf("download: %d bytes, %v, sha256 mismatch=%v", got, err, hex.EncodeToString(h.Sum(nil)) != hex.EncodeToString(want.Sum(nil)))
		}
		t.Logf("download 100 MiB: %v", time.Since(start))
		// Upload: streamed from a pipe, never buffered whole.
		pr, pw := io.Pipe()
		go func() { _, err := io.CopyN(pw, rand.New(rand.NewSource(9)), n); pw.CloseWithError(err) }()
		req, _ = http.NewRequest("POST", hostURL(sb, 8000)+"/sha256", pr)
		req.Header.Set("X-Access-Token", sb.Token)
		start = time.Now()
		resp, err = c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		up := sha256.New()
		io.CopyN(up, rand.New(rand.NewSource(9)), n)
		if string(b) != fmt.Sprintf("%s %d", hex.EncodeToString(up.Sum(nil)), n) {
			t.Fatalf("upload: %d %s", resp.StatusCode, b)
		}
		t.Logf("upload 100 MiB: %v", time.Since(start))
	})

	t.Run("websocket", func(t *testing.T) {
		cfg, err := websocket.NewConfig(strings.Replace(hostURL(sb, 8000), "http", "ws", 1)+"/ws", hostURL(sb, 8000))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Header = http.Header{"X-Access-Token": {sb.Token}}
		u, _ := url.Parse(sb.Data)
		raw, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		ws, err := websocket.NewClient(cfg, raw)
		if err != nil {
			t.Fatalf("websocket handshake: %v", err)
		}
		defer ws.Close()
		for i := 0; i < 20; i++ {
			msg := fmt.Sprintf("message %d %s", i, strings.Repeat("x", i*1000))
			if err := websocket.Message.Send(ws, msg); err != nil {
				t.Fatal(err)
			}
			var back string
			ws.SetReadDeadline(time.Now().Add(10 * time.Second))
			if err := websocket.Message.Receive(ws, &back); err != nil || back != msg {
				t.Fatalf("echo %d: %v (%d bytes back)", i, err, len(back))
			}
		}
	})

	t.Run("server-sent events stream", func(t *testing.T) {
		req, _ := http.NewRequest("GET", hostURL(sb, 8000)+"/sse", nil)
		req.Header.Set("X-Access-Token", sb.Token)
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		// The server sends 3 events 400 ms apart: the first must arrive
		// before the last is written (not buffered to the end).
		if err != nil || line != "id: 1\n" || time.Since(start) > 700*time.Millisecond {
			t.Fatalf("first event %q after %v (%v)", line, time.Since(start), err)
		}
	})

	t.Run("http2", func(t *testing.T) {
		resp, body := get(t, portClient(sb.Data, true), hostURL(sb, 8000)+"/echo/", auth)
		if resp.StatusCode != 200 || resp.Proto != "HTTP/2.0" {
			t.Fatalf("h2c: %d %s %s", resp.StatusCode, resp.Proto, body)
		}
		if !strings.Contains(body, `"proto":"HTTP/1.1"`) {
			t.Fatalf("upstream request: %s", body)
		}
	})
}

func portOf(data string) string {
	u, _ := url.Parse(data)
	return u.Port()
}

// TestPortForwardingPublicAndBounded: a sandbox created with public ports
// needs no token; the per-sandbox bound answers 429; gVisor forwards too.
func TestPortForwardingPublicAndBounded(t *testing.T) {
	need(t)
	drivers := []string{"namespace"}
	if os.Getenv("SPACE_RUNSC") != "" {
		drivers = append(drivers, "gvisor")
	} else {
		t.Log("gvisor part skipped: SPACE_RUNSC not set")
	}
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			e := extraServer(t, "space-ports-", drv, "--max-port-connections", "3")
			sb := e.create(t, map[string]any{"public_ports": true})
			defer sb.delete(t)
			startPortServer(t, sb, "0.0.0.0:8080", 8080)
			c := portClient(sb.Data, false)
			resp, body := get(t, c, hostURL(sb, 8080)+"/", nil)
			if resp.StatusCode != 200 || !strings.Contains(body, "portserver listing") {
				t.Fatalf("public port without a token: %d %s", resp.StatusCode, body)
			}
			var open []*http.Response
			defer func() {
				for _, r := range open {
					r.Body.Close()
				}
			}()
			for i := 0; i < 3; i++ {
				req, _ := http.NewRequest("GET", hostURL(sb, 8080)+"/slow", nil)
				r, err := c.Do(req)
				if err != nil || r.StatusCode != 200 {
					t.Fatalf("slow %d: %v %v", i, r, err)
				}
				open = append(open, r)
			}
			resp, body = get(t, c, hostURL(sb, 8080)+"/", nil)
			wantError(t, "fourth open request", resp, body, 429, "too_many_connections")
			open[0].Body.Close()
			open = open[1:]
			deadline := time.Now().Add(10 * time.Second)
			for {
				resp, body = get(t, c, hostURL(sb, 8080)+"/", nil)
				if resp.StatusCode == 200 || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if resp.StatusCode != 200 {
				t.Fatalf("after closing one: %d %s", resp.StatusCode, body)
			}
		})
	}
}

// TestPortForwardingWakes: a paused sandbox with auto-resume is resumed by
// a forwarded request: with its token, or with none when its ports are
// public; a private one stays paused for a request without a token.
func TestPortForwardingWakes(t *testing.T) {
	e := need(t)
	pub := e.create(t, map[string]any{"public_ports": true, "auto_resume": true})
	defer pub.delete(t)
	priv := e.create(t, map[string]any{"auto_resume": true})
	defer priv.delete(t)
	for _, sb := range []*sandbox{pub, priv} {
		startPortServer(t, sb, "127.0.0.1:8000", 8000)
		st, m, err := e.call("POST", "/v1/sandboxes/"+sb.ID+"/pause", e.key, nil)
		if err != nil || st != 202 {
			t.Fatalf("pause: %d %v %v", st, m, err)
		}
		if done := e.waitOp(t, m["operation"].(map[string]any)["id"].(string)); done["state"] != "succeeded" {
			t.Fatalf("pause: %v", done)
		}
	}
	c := portClient(pub.Data, false)
	resp, body := get(t, c, hostURL(priv, 8000)+"/", nil)
	wantError(t, "paused private sandbox without a token", resp, body, 401, "unauthorized")
	if st, m, _ := e.call("GET", "/v1/sandboxes/"+priv.ID, e.key, nil); st != 200 || m["state"] != "paused" {
		t.Fatalf("a request without a token changed the private sandbox: %d %v", st, m["state"])
	}
	resp, body = get(t, c, hostURL(pub, 8000)+"/", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, "portserver listing") {
		t.Fatalf("paused public sandbox: %d %s", resp.StatusCode, body)
	}
	resp, body = get(t, c, hostURL(priv, 8000)+"/", map[string]string{"X-Access-Token": priv.Token})
	if resp.StatusCode != 200 || !strings.Contains(body, "portserver listing") {
		t.Fatalf("paused private sandbox with its token: %d %s", resp.StatusCode, body)
	}
	for _, sb := range []*sandbox{pub, priv} {
		if st, m, _ := e.call("GET", "/v1/sandboxes/"+sb.ID, e.key, nil); st != 200 || m["state"] != "running" {
			t.Fatalf("%s after a forwarded request: %d %v", sb.ID, st, m["state"])
		}
	}
}
