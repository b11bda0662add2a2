// Package console tests the web console in a real browser: headless
// Chromium against a real `space server` (namespace driver, the minimal
// template), through the console's pages only, except for the pause the
// test makes through the API to watch it arrive.
package console

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// chromium finds the browser; in CI (SPACE_TEST_BROWSER=1, set by
// scripts/test.sh, whose deps install it) a missing one fails the test
// rather than skipping it.
func chromium(t *testing.T) string {
	for _, c := range []string{os.Getenv("SPACE_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	if os.Getenv("SPACE_TEST_BROWSER") == "1" {
		t.Fatal("SPACE_TEST_BROWSER=1 but no chromium found (apt-get install -y chromium, or set SPACE_CHROMIUM)")
	}
	t.Skip("no chromium: install the Debian package chromium (scripts/deps.sh) or set SPACE_CHROMIUM to run the web console test")
	return ""
}

func TestConsole(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a real space server with the namespace driver)")
	}
	bin := chromium(t)
	shots := os.Getenv("SPACE_CONSOLE_SCREENSHOTS") // e.g. docs/console: refresh the docs' screenshots
	if shots == "" {
		shots = t.TempDir()
	} else if !filepath.IsAbs(shots) {
		shots = filepath.Join(testenv.RepoRoot(), shots)
	}

	srv, err := testenv.New("spc-console")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Remove)
	srv.Args = []string{"--builtins", "minimal"}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	key, err := srv.CreateKey("p1")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitTemplate(key, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	auth := map[string]string{"X-API-Key": key}

	// The console's own headers, from the real server.
	resp, err := http.Get(srv.Ctrl + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	if resp.StatusCode != 200 || !strings.Contains(csp, "script-src 'self';") || !strings.Contains(csp, "connect-src 'self' "+srv.Data+";") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("GET /ui/: %d, CSP %q, X-Frame-Options %q", resp.StatusCode, csp, resp.Header.Get("X-Frame-Options"))
	}

	// Anything the page logs as an error (a CSP refusal, an exception)
	// fails the test.
	var mu sync.Mutex
	var pageErrors []string
	b := startBrowser(t, bin, func(m cdpMsg) {
		switch m.Method {
		case "Log.entryAdded":
			var p struct {
				Entry struct{ Source, Level, Text, URL string } `json:"entry"`
			}
			json.Unmarshal(m.Params, &p)
			// "network" entries are the API's error answers, which the
			// page handles (a 404 route_not_found hides the ports tab).
			if p.Entry.Level == "error" && p.Entry.Source != "network" {
				mu.Lock()
				pageErrors = append(pageErrors, p.Entry.Text+" "+p.Entry.URL)
				mu.Unlock()
			}
		case "Runtime.consoleAPICalled":
			var p struct {
				Type string
				Args []struct{ Value any }
			}
			json.Unmarshal(m.Params, &p)
			msg := "console." + p.Type + ":"
			for _, a := range p.Args {
				msg += fmt.Sprint(" ", a.Value)
			}
			t.Log(msg)
			if p.Type == "error" {
				mu.Lock()
				pageErrors = append(pageErrors, msg)
				mu.Unlock()
			}
		case "Runtime.exceptionThrown":
			mu.Lock()
			pageErrors = append(pageErrors, string(m.Params))
			mu.Unlock()
		}
	})

	// / redirects to the console; log in with the key.
	if err := b.page("Page.navigate", map[string]any{"url": srv.Ctrl + "/"}, nil); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the login form", `document.querySelector("#login-key")`, 10*time.Second)
	var href string
	b.eval("location.pathname", &href)
	if href != "/ui/" {
		t.Errorf("/ led to %q", href)
	}
	b.screenshot(t, filepath.Join(shots, "login.png"))
	b.eval(fmt.Sprintf(`(() => { document.querySelector("#login-key").value = %q; document.querySelector("#login-submit").click(); })()`, key), nil)
	b.waitFor(t, "the lifecycle events stream", `document.querySelector("#live") && document.querySelector("#live").textContent === "live"`, 10*time.Second)
	var stored struct{ Session, Local, Cookie string }
	b.eval(`({Session: sessionStorage.getItem("space.apiKey") || "", Local: JSON.stringify(localStorage), Cookie: document.cookie})`, &stored)
	if stored.Session != key || strings.Contains(stored.Local, key) || stored.Cookie != "" {
		t.Errorf("key storage: session %v, localStorage %q, cookies %q", stored.Session == key, stored.Local, stored.Cookie)
	}

	// Create a sandbox from the form, with limits.
	b.waitFor(t, "the template list", `document.querySelector('#create-template option[value="minimal"]')`, 10*time.Second)
	b.eval(`(() => { document.querySelector("#create-template").value = "minimal"; document.querySelector("#create-mem").value = "256"; document.querySelector("#create-pids").value = "64"; document.querySelector("#create-submit").click(); })()`, nil)
	b.waitFor(t, "the sandbox page", `location.hash.startsWith("#/sandbox/sbx-")`, 15*time.Second)
	var id string
	b.eval(`location.hash.split("/")[2]`, &id)
	t.Cleanup(func() { testenv.DoJSON("DELETE", srv.Ctrl+"/v1/sandboxes/"+id, auth, nil) })
	sel := fmt.Sprintf(`document.querySelector('#sidebar [data-sandbox="%s"] .state')`, id)
	b.waitFor(t, "the sandbox running", sel+` && `+sel+`.textContent === "running"`, 30*time.Second)
	st, sb, err := testenv.DoJSON("GET", srv.Ctrl+"/v1/sandboxes/"+id, auth, nil)
	if err != nil || st != 200 {
		t.Fatalf("GET sandbox: %d %v", st, err)
	}
	if lim, _ := sb["limits"].(map[string]any); lim["memory_bytes"] != float64(256<<20) || lim["pids"] != float64(64) {
		t.Errorf("limits from the form: %v", sb["limits"])
	}

	// The terminal: a PTY shell over the data plane; type, read the screen.
	b.waitFor(t, "the terminal connected", `document.querySelector("#term-status") && document.querySelector("#term-status").textContent.includes("connected") && window.spaceTerminal`, 20*time.Second)
	screen := `(() => { const b = window.spaceTerminal.buffer.active; const out = []; for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true)); return out; })()`
	b.waitFor(t, "a shell prompt", screen+`.some((l) => /[#$] ?$/.test(l))`, 15*time.Second)
	b.eval(`window.spaceTerminal.focus()`, nil)
	b.typeText(t, "echo hi\n")
	b.waitFor(t, "hi on the screen", screen+`.some((l) => l.trim() === "hi")`, 15*time.Second)
	b.screenshot(t, filepath.Join(shots, "terminal.png"))
	// A reload keeps the login (sessionStorage) and re-attaches to the
	// running shell, replaying its output from the log.
	b.eval(`window.__beforeReload = true`, nil)
	if err := b.page("Page.reload", map[string]any{}, nil); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the terminal re-attached", `!window.__beforeReload && document.querySelector("#term-status") && document.querySelector("#term-status").textContent.includes("connected") && window.spaceTerminal`, 20*time.Second)
	b.waitFor(t, "hi replayed", screen+`.some((l) => l.trim() === "hi")`, 15*time.Second)

	// Forwarded ports: listed as links where the server forwards ports,
	// the tab hidden where it answers 404 route_not_found.
	checkPorts(t, b, srv, key, id, shots)

	// Files: upload through the file picker, download through the page.
	dir := t.TempDir()
	content := "hello from the browser test\n"
	local := filepath.Join(dir, "hello.txt")
	os.WriteFile(local, []byte(content), 0o644)
	b.eval(fmt.Sprintf(`location.hash = "#/sandbox/%s/files"`, id), nil)
	b.waitFor(t, "the file list", `document.querySelector("#files-table tbody")`, 10*time.Second)
	b.setFiles(t, "#files-upload", local)
	b.waitFor(t, "the uploaded file listed", `document.querySelector('#files-table [data-file="hello.txt"]')`, 10*time.Second)
	var cwd string
	b.eval(`document.querySelector("#files-path").value`, &cwd)
	if got := readFile(t, srv, key, id, strings.TrimSuffix(cwd, "/")+"/hello.txt"); got != content {
		t.Fatalf("uploaded file in the sandbox: %q, want %q", got, content)
	}
	downloads := t.TempDir()
	if err := b.call("", "Browser.setDownloadBehavior", map[string]any{"behavior": "allow", "downloadPath": downloads}, nil); err != nil {
		t.Fatal(err)
	}
	b.eval(`document.querySelector('#files-table [data-file="hello.txt"] [data-action="download"]').click()`, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, err := os.ReadFile(filepath.Join(downloads, "hello.txt")); err == nil && string(got) == content {
			break
		}
		if time.Now().After(deadline) {
			ents, _ := os.ReadDir(downloads)
			t.Fatalf("download: hello.txt not in %s after 10 s (%v)", downloads, ents)
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.eval(`document.querySelector('#files-table [data-file="hello.txt"] [data-action="edit"]').click()`, nil)
	b.waitFor(t, "the editor", `document.querySelector("#editor-text") && document.querySelector("#editor-text").value === `+jsString(content), 10*time.Second)
	b.screenshot(t, filepath.Join(shots, "files.png"))

	// Code: the code tab against a stand-in interpreter (code_test.go).
	checkCode(t, b, srv, key, id, shots)

	// A pause made through the API arrives on the open page, no reload.
	b.eval(`window.__sameDocument = true`, nil)
	if st, m, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+id+"/pause", auth, nil); err != nil || st != 202 {
		t.Fatalf("pause: %d %v %v", st, m, err)
	}
	b.waitFor(t, "paused on the page", sel+`.textContent === "paused" && document.querySelector("#sandbox-state").textContent === "paused" && window.__sameDocument`, 15*time.Second)

	b.eval(`location.hash = "#/"`, nil)
	b.waitFor(t, "the sandbox table", fmt.Sprintf(`document.querySelector('#sandbox-table [data-sandbox="%s"]')`, id), 5*time.Second)
	b.screenshot(t, filepath.Join(shots, "sandboxes.png"))
	b.eval(`location.hash = "#/templates"`, nil)
	b.waitFor(t, "the template table", `document.querySelector("#template-table tbody tr")`, 5*time.Second)
	b.screenshot(t, filepath.Join(shots, "templates.png"))

	mu.Lock()
	defer mu.Unlock()
	for _, e := range pageErrors {
		t.Errorf("page error: %s", e)
	}
}

func checkPorts(t *testing.T, b *browser, srv *testenv.Server, key, id, shots string) {
	t.Helper()
	st, sess, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+id+"/session", map[string]string{"X-API-Key": key}, nil)
	if err != nil || st != 200 {
		t.Fatalf("session: %d %v", st, err)
	}
	data, tok := fmt.Sprint(sess["data_url"])+"/v1/sandboxes/"+id, map[string]string{"Authorization": "Bearer " + fmt.Sprint(sess["token"])}
	st, m, err := testenv.DoJSON("GET", data+"/ports", tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := m["error"].(map[string]any); st == 404 && e["code"] == "route_not_found" {
		b.waitFor(t, "the ports tab hidden", `document.querySelector("#tab-ports").hidden`, 5*time.Second)
		t.Log("this server does not forward ports: the tab stays hidden")
		return
	}
	if st != 200 {
		t.Fatalf("GET ports: %d %v", st, m)
	}
	if st, m, err := testenv.DoJSON("POST", data+"/commands", tok, map[string]any{"shell": "exec busybox httpd -f -p 8000 -h /tmp", "tag": "test-httpd"}); err != nil || st != 201 {
		t.Fatalf("start httpd: %d %v %v", st, m, err)
	}
	if st, m, err := testenv.DoJSON("GET", data+"/ports?wait=8000&timeout_ms=10000", tok, nil); err != nil || st != 200 {
		t.Fatalf("wait for port 8000: %d %v %v", st, m, err)
	}
	b.eval(fmt.Sprintf(`location.hash = "#/sandbox/%s/ports"`, id), nil)
	b.waitFor(t, "port 8000 listed", `document.querySelector('#ports-table [data-port="8000"] a[href]') && !document.querySelector("#tab-ports").hidden`, 10*time.Second)
	// A signed link from the control API (POST /v1/sandboxes/{id}/ports/8000/url).
	b.eval(`document.querySelector('#ports-table [data-port="8000"] button').click()`, nil)
	b.waitFor(t, "a signed link", `document.querySelector('#ports-table [data-port="8000"] a.signed[href^="http"]')`, 10*time.Second)
	b.screenshot(t, filepath.Join(shots, "ports.png"))
}

func jsString(s string) string {
	raw, _ := json.Marshal(s)
	return string(raw)
}

// readFile reads a sandbox file over the data plane, as an SDK would.
func readFile(t *testing.T, srv *testenv.Server, key, id, path string) string {
	t.Helper()
	st, sess, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+id+"/session", map[string]string{"X-API-Key": key}, nil)
	if err != nil || st != 200 {
		t.Fatalf("session: %d %v", st, err)
	}
	req, _ := http.NewRequest("GET", fmt.Sprint(sess["data_url"])+"/v1/sandboxes/"+id+"/files?path="+path, nil)
	req.Header.Set("Authorization", "Bearer "+fmt.Sprint(sess["token"]))
	resp, err := testenv.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET file: %d %v %s", resp.StatusCode, err, raw)
	}
	return string(raw)
}
